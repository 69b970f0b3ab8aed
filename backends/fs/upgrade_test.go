package fs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/backends"
	"yirangmq/backends/fs/internal/format1"
	"yirangmq/queuecore"
)

// extract unpacks a testdata tarball (GNU tar with --xattrs: the body
// files' ID attributes are SCHILY.xattr records, a staged body a hard
// link) into dir.
func extract(t *testing.T, tarball, dir string) {
	t.Helper()
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, filepath.Clean(dir)) {
			t.Fatalf("%s: outside %s", h.Name, dir)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o700); err != nil {
				t.Fatal(err)
			}
			continue
		case tar.TypeLink:
			if err := os.Link(filepath.Join(dir, filepath.FromSlash(h.Linkname)), p); err != nil {
				t.Fatal(err)
			}
			continue
		case tar.TypeReg:
		default:
			t.Fatalf("%s: type %c", h.Name, h.Typeflag)
		}
		w, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(w, tr); err != nil {
			t.Fatal(err)
		}
		w.Close()
		for k, v := range h.PAXRecords {
			if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				if err := unix.Setxattr(p, name, []byte(v), 0); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

var update = flag.Bool("update", false, "rewrite golden files")

// TestUpgradeFormat1 opens stores of format 1 written by the last build
// that wrote it (testdata/make-format1.sh: through a real mount, a clean
// unmount and a kill -9 whose journal was never checkpointed) and checks
// that every message is where it was, with its reason, attempts and body,
// and every queue and message with all its metadata as the converted store
// serves it (testdata/format1-*.golden, written with -update by the build
// whose format-1 reader was still the old build's code whole); that the
// store is of format 2 after, holding nothing of format 1; and that the
// format-1 reader now refuses it.
func TestUpgradeFormat1(t *testing.T) {
	for _, name := range []string{"clean", "crash"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			extract(t, filepath.Join("testdata", "format1-"+name+".tar.gz"), dir)
			ctx := context.Background()
			s, err := Open(ctx, dir, backends.Options{Sync: queuecore.SyncFull})
			if err != nil {
				t.Fatal(err)
			}
			checkFormat1Messages(t, s)
			checkGolden(t, filepath.Join("testdata", "format1-"+name+".golden"), storeListing(t, s))
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			for _, gone := range []string{"journal", "journal.old", "staged", "spill"} {
				if _, err := os.Lstat(filepath.Join(dir, gone)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s is still there after the upgrade: %v", gone, err)
				}
			}
			if b, err := os.ReadFile(filepath.Join(dir, formatName)); err != nil || string(b) != formatText {
				t.Errorf("format file: %q, %v", b, err)
			}
			// An older build reads format 1 only: it must refuse the store,
			// not take a tree without a journal for an empty one.
			_, _, _, err = format1.Export(ctx, dir, nil)
			if err == nil || !strings.Contains(err.Error(), "version 2") {
				t.Errorf("the format-1 reader on the converted store: %v, want a refusal naming version 2", err)
			}
			// Opened again, it is the same store.
			s, err = Open(ctx, dir, backends.Options{Sync: queuecore.SyncFull})
			if err != nil {
				t.Fatal(err)
			}
			checkFormat1Messages(t, s)
			if h := s.HandChanges(); len(h) != 0 {
				t.Errorf("changes by hand found in a store nobody touched: %+v", h)
			}
			s.Close()
		})
	}
}

// checkFormat1Messages checks what make-format1.sh put in the store.
func checkFormat1Messages(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	counts, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[queuecore.State]int64{
		"q": {queuecore.StateReady: 11, queuecore.StateLeased: 5, queuecore.StateDead: 3, queuecore.StateArchived: 2},
		"v": {queuecore.StateReady: 1, queuecore.StateDead: 1},
	}
	for q, states := range want {
		for st, n := range states {
			if got := counts[q][st].N; got != n {
				t.Errorf("queue %s, %s: %d messages, want %d", q, st, got, n)
			}
		}
	}
	dead := map[string][2]string{
		"m05": {"BAD_INPUT", "field x missing"},
		"m06": {queuecore.ReasonManual, ""},
		"m07": {queuecore.ReasonNacked, ""},
	}
	for name, r := range dead {
		m, err := s.Lookup(ctx, "q", name, false)
		if err != nil {
			t.Fatal(err)
		}
		if m.State != queuecore.StateDead || m.Reason != r[0] || r[1] != "" && m.ReasonMessage != r[1] {
			t.Errorf("q/%s: %s, reason %q %q, want dlq/ with %q %q", name, m.State, m.Reason, m.ReasonMessage, r[0], r[1])
		}
		if m.Attempts != 1 && name != "m06" {
			t.Errorf("q/%s: %d attempts, want 1", name, m.Attempts)
		}
		b, err := s.Body(ctx, m.ID)
		if err != nil || string(b) != "body of "+name+"\n" {
			t.Errorf("q/%s body: %q, %v", name, b, err)
		}
	}
	for _, name := range []string{"m00", "m01", "m02", "m03", "m04"} {
		if m, err := s.Lookup(ctx, "q", name, false); err != nil || m.State != queuecore.StateLeased || m.Deadline.IsZero() {
			t.Errorf("q/%s: %+v, %v, want leased with a deadline", name, m, err)
		}
	}
	for _, name := range []string{"m08", "m09"} {
		if _, err := s.Lookup(ctx, "q", name, true); err != nil {
			t.Errorf("q/%s not archived: %v", name, err)
		}
	}
	big, err := s.Lookup(ctx, "q", "big", false)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := s.Body(ctx, big.ID); err != nil || len(b) != 307200 || strings.Trim(string(b), "b") != "" {
		t.Errorf("q/big: %d bytes, %v", len(b), err)
	}
	bad, err := s.Lookup(ctx, "v", "bad", false)
	if err != nil || bad.Reason != queuecore.ReasonValidation {
		t.Errorf("v/bad: %+v, %v, want dlq/ with VALIDATION_ERROR", bad, err)
	}
	qs, _ := s.Queues(ctx)
	for _, q := range qs {
		p, err := queuecore.ParsePolicy(q.Policy)
		if err != nil {
			t.Errorf("queue %s: policy %v", q.Name, err)
		}
		if q.Name == "q" && (p.Retry.Limit != 0 || p.MaxMessageBytes != 1<<20) {
			t.Errorf("queue q: policy %+v lost its settings", p)
		}
		if q.Name == "v" && p.Format != "json" {
			t.Errorf("queue v: format %q, want json", p.Format)
		}
	}
}

// storeListing is everything s serves: its queues, and each message with
// every field and a hash of its body, in List order.
func storeListing(t *testing.T, s *Store) []byte {
	t.Helper()
	ctx := context.Background()
	tm := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	var b bytes.Buffer
	qs, err := s.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	maxID, err := s.MaxID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "max_id %d\n", maxID)
	for _, q := range qs {
		fmt.Fprintf(&b, "queue %s policy=%s uid=%d gid=%d mode=%o created=%s\n", q.Name, q.Policy, q.UID, q.GID, q.Mode, tm(q.CreatedAt))
		for _, st := range queuecore.States {
			err := s.List(ctx, q.Name, st, func(m queuecore.Message) bool {
				body, err := s.Body(ctx, m.ID)
				if err != nil {
					t.Errorf("body of %d: %v", m.ID, err)
				}
				fmt.Fprintf(&b, "  %s/%s id=%d seq=%d priority=%d size=%d message_id=%s published=%s first=%s state_at=%s deadline=%s"+
					" attempts=%d redrives=%d reason=%q reason_message=%q failed=%s consumer=%q dedup_key=%q uid=%d gid=%d body=%x\n",
					m.State.Dir(), m.Name, m.ID, m.Seq, m.Priority, m.Size, m.MessageID, tm(m.PublishedAt), tm(m.FirstAt), tm(m.StateAt), tm(m.Deadline),
					m.Attempts, m.Redrives, m.Reason, m.ReasonMessage, tm(m.FailedAt), m.Consumer, m.DedupKey, m.UID, m.GID, sha256.Sum256(body))
				return true
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	return b.Bytes()
}

// checkGolden compares got with the golden file at path, which -update
// rewrites.
func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the converted store differs from %s:\n%s", path, got)
	}
}
