package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// logBuffer collects a store's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Reset()
}

// openTest opens a store with cfg (zero fields: defaults) and closes it at
// the end of the test.
func openTest(t testing.TB, dir string, sync queuecore.SyncMode, cfg config, log *logBuffer) *Store {
	t.Helper()
	opts := backends.Options{Sync: sync, Holder: "test " + t.Name()}
	if log != nil {
		opts.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if cfg.checkpointBytes == 0 {
		cfg.checkpointBytes = defaultCheckpointBytes
	}
	if cfg.stageAt == 0 {
		cfg.stageAt = defaultStageAt
	}
	s, err := open(context.Background(), dir, opts, cfg)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// crash stops s as a kill -9 would once its commits have returned: no
// checkpoint, the journal left as it is, the lock released.
func crash(t testing.TB, s *Store) {
	t.Helper()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.inflight.Wait()
	s.bg.Wait()
	s.trashWG.Wait()
	s.spares.halt(false) // a killed process leaves its spares for the next Open
	if err := s.cur.Load().f.Close(); err != nil {
		t.Fatalf("close journal: %v", err)
	}
	if err := s.lock.Unlock(); err != nil {
		t.Fatalf("unlock: %v", err)
	}
}

var epoch = time.Date(2026, 1, 13, 10, 21, 0, 123456789, time.UTC)

// tmsg is a message with the fields queuecore sets.
func tmsg(id uint64, q, name string, st queuecore.State) queuecore.Message {
	m := queuecore.Message{
		ID: id, Queue: q, Name: name, State: st, Seq: id,
		MessageID:   fmt.Sprintf("mid-%d", id),
		PublishedAt: epoch.Add(time.Duration(id) * time.Second),
		FirstAt:     epoch.Add(time.Duration(id) * time.Second),
		StateAt:     epoch.Add(time.Duration(id) * time.Second),
		UID:         1000, GID: 1000,
		Size: int64(len(tbody(id))),
	}
	if st == queuecore.StateLeased || st == queuecore.StateDelayed {
		m.Deadline = epoch.Add(time.Duration(id) * time.Minute)
	}
	return m
}

// tleased is m leased until an hour after epoch.
func tleased(m queuecore.Message) queuecore.Message {
	m.State, m.Deadline = leased, epoch.Add(time.Hour)
	return m
}

func tbody(id uint64) []byte { return fmt.Appendf(nil, "body of message %d\n", id) }

func tins(m queuecore.Message) queuecore.Op {
	return queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: tbody(m.ID)}
}

func tupd(m queuecore.Message) queuecore.Op { return queuecore.Op{Kind: queuecore.OpUpdate, Msg: m} }

func tdel(id uint64) queuecore.Op {
	return queuecore.Op{Kind: queuecore.OpDelete, Msg: queuecore.Message{ID: id}}
}

func mustApply(t testing.TB, s *Store, ops ...queuecore.Op) {
	t.Helper()
	if err := s.Apply(context.Background(), ops); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

func mustPutQueues(t testing.TB, s *Store, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := s.PutQueue(context.Background(), queuecore.QueueInfo{Name: n, Mode: 0o750, CreatedAt: epoch}); err != nil {
			t.Fatalf("PutQueue(%s): %v", n, err)
		}
	}
}

// wantMessage checks that m is where it says, with its body.
func wantMessage(t testing.TB, s *Store, m queuecore.Message, body []byte) {
	t.Helper()
	got, err := s.Lookup(context.Background(), m.Queue, m.Name, m.State == queuecore.StateArchived)
	if err != nil {
		t.Errorf("Lookup(%s, %s): %v", m.Queue, m.Name, err)
		return
	}
	if got.ID != m.ID || got.State != m.State {
		t.Errorf("Lookup(%s, %s) = message %d in %s, want %d in %s", m.Queue, m.Name, got.ID, got.State, m.ID, m.State)
	}
	b, err := s.Body(context.Background(), m.ID)
	if err != nil || !bytes.Equal(b, body) {
		t.Errorf("Body(%d) = %q, %v; want %q", m.ID, b, err, body)
	}
}

func wantGone(t testing.TB, s *Store, id uint64) {
	t.Helper()
	if _, err := s.Body(context.Background(), id); !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("Body(%d) = %v, want ErrNotFound", id, err)
	}
}

// treeFiles lists the files under dir/queues, relative to it.
func treeFiles(t testing.TB, dir string) []string {
	t.Helper()
	root := filepath.Join(dir, queuesDir)
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	slices.Sort(out)
	return out
}

// wantTree checks that the tree holds exactly want.
func wantTree(t testing.TB, dir string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := treeFiles(t, dir); !slices.Equal(got, want) {
		t.Errorf("files under queues/:\n got %s\nwant %s", strings.Join(got, " "), strings.Join(want, " "))
	}
}

func fileSize(t testing.TB, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
