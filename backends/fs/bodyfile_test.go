package fs

import (
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

func readAllFile(t *testing.T, f *os.File) []byte {
	t.Helper()
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBodyFile: BodyFile opens the message's own body file; the
// descriptor keeps reading that message's bytes after a move, a delete and
// a new message of the same name; a file that is not the message's
// (another ID, another size) is refused; an unknown ID is ErrNotFound.
func TestBodyFile(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, t.TempDir(), queuecore.SyncFull, config{}, nil)
	mustPutQueues(t, s, "q")
	m := tmsg(1, "q", "a", ready)
	mustApply(t, s, tins(m))
	f, err := s.BodyFile(ctx, 1)
	if err != nil || f == nil {
		t.Fatalf("BodyFile(1) = %v, %v; want the body file", f, err)
	}
	defer f.Close()
	if got := readAllFile(t, f); string(got) != string(tbody(1)) {
		t.Fatalf("body file of 1 holds %q, want %q", got, tbody(1))
	}

	// Leased, acked, and the name taken by message 2.
	leased := m
	leased.State = queuecore.StateLeased
	mustApply(t, s, tupd(leased))
	mustApply(t, s, tdel(1))
	mustApply(t, s, tins(tmsg(2, "q", "a", ready)))
	if got := readAllFile(t, f); string(got) != string(tbody(1)) {
		t.Fatalf("descriptor of 1 after its ack reads %q, want %q", got, tbody(1))
	}
	if _, err := s.BodyFile(ctx, 1); !errors.Is(err, queuecore.ErrNotFound) {
		t.Fatalf("BodyFile of an acked message: %v, want ErrNotFound", err)
	}

	// Message 2's file, made to carry another ID, then another size.
	path := s.bodyPath("q", queuecore.StateReady, "a")
	if err := unix.Setxattr(path, idXattr, []byte(strconv.Itoa(7)), 0); err != nil {
		t.Skipf("no user xattrs here: %v", err)
	}
	if f2, err := s.BodyFile(ctx, 2); err == nil {
		f2.Close()
		t.Fatal("BodyFile opened a file that carries another message's ID")
	}
	if err := unix.Setxattr(path, idXattr, []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if f2, err := s.BodyFile(ctx, 2); err == nil {
		f2.Close()
		t.Fatal("BodyFile opened a file of another size than the message's")
	}
	if _, err := s.BodyFile(ctx, 99); !errors.Is(err, queuecore.ErrNotFound) {
		t.Fatalf("BodyFile(99): %v, want ErrNotFound", err)
	}
}

// TestBigRecordsReplay: records of big bodies extend the journal instead
// of falling on zeros written ahead; small records before, between and
// after them, and a torn big record at the end, replay as before.
func TestBigRecordsReplay(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncFull, config{}, nil)
	mustPutQueues(t, s, "q")
	big := func(id uint64, n int) queuecore.Op {
		m := tmsg(id, "q", strconv.FormatUint(id, 10), ready)
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(i) ^ byte(id)
		}
		m.Size = int64(n)
		return queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: body}
	}
	ops := []queuecore.Op{tins(tmsg(1, "q", "1", ready)), big(2, 1<<20), big(3, bigRecord), tins(tmsg(4, "q", "4", ready)), big(5, 3<<20)}
	for _, op := range ops {
		mustApply(t, s, op)
	}
	j := s.cur.Load()
	end := j.size
	crash(t, s)
	// A big record torn by the crash: half of one written past the end.
	f, err := os.OpenFile(j.f.Name(), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	torn := sealFrame(append(newFrame(1<<20), make([]byte, 1<<20)...))
	if _, err := f.WriteAt(torn[:len(torn)/2], end); err != nil {
		t.Fatal(err)
	}
	f.Close()

	s = openTest(t, dir, queuecore.SyncFull, config{}, nil)
	for _, op := range ops {
		wantMessage(t, s, op.Msg, op.Body)
	}
	mustApply(t, s, tins(tmsg(6, "q", "6", ready)))
	wantMessage(t, s, tmsg(6, "q", "6", ready), tbody(6))
}

// TestBodyFileBeforeFileOps: a reader that opens a message in the moment
// between its commit's sync and its file operations gets the body file
// (written by BodyFile itself), not nil (which would serve it from memory,
// where it cannot be mapped MAP_SHARED); the commit then finds its work
// done.
func TestBodyFileBeforeFileOps(t *testing.T) {
	for _, mode := range []queuecore.SyncMode{queuecore.SyncFull, queuecore.SyncNormal} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			var hold atomic.Bool
			held, release := make(chan struct{}), make(chan struct{})
			cfg := config{beforeFileOps: func() {
				if hold.CompareAndSwap(true, false) {
					close(held)
					<-release
				}
			}}
			s := openTest(t, t.TempDir(), mode, cfg, nil)
			mustPutQueues(t, s, "q")
			hold.Store(true)
			done := make(chan error, 1)
			go func() { done <- s.Apply(ctx, []queuecore.Op{tins(tmsg(1, "q", "a", ready))}) }()
			<-held
			f, err := s.BodyFile(ctx, 1)
			if err != nil || f == nil {
				close(release)
				t.Fatalf("BodyFile between the sync and the file operations = %v, %v; want the body file", f, err)
			}
			defer f.Close()
			if got := readAllFile(t, f); string(got) != string(tbody(1)) {
				t.Errorf("body file holds %q, want %q", got, tbody(1))
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatalf("the commit: %v", err)
			}
			if got, err := os.ReadFile(s.bodyPath("q", queuecore.StateReady, "a")); err != nil || string(got) != string(tbody(1)) {
				t.Fatalf("after the commit the file holds %q (%v), want %q", got, err, tbody(1))
			}
			wantMessage(t, s, tmsg(1, "q", "a", ready), tbody(1))
		})
	}
}
