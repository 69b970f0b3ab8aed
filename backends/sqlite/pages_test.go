package sqlite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// TestPagesPerCommit: what one publish, lease and ack write to the WAL, in
// pages, once the store is warm. Each page is a WAL frame to write (and to
// checksum and checkpoint later): the count is what the schema costs per
// operation, so that a new index or a wider row shows here. The limits are
// the pages each operation must change plus the B-tree splits and merges
// measured on top (a fraction of a page).
func TestPagesPerCommit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncNormal)
	if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: "bench"}); err != nil {
		t.Fatal(err)
	}
	onWriter(s, func(w *writer) {
		if _, err := w.conn.Exec("PRAGMA wal_autocheckpoint = 0", nil); err != nil {
			t.Fatal(err)
		}
	})
	walSize := func() int64 {
		fi, err := os.Stat(filepath.Join(dir, FileName+"-wal"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	apply := func(op queuecore.Op) {
		t.Helper()
		if err := s.Apply(ctx, []queuecore.Op{op}); err != nil {
			t.Fatal(err)
		}
	}
	// A backlog, so that the trees have a few levels, and a warm-up. IDs
	// and names grow, as the core gives them.
	fill(t, s, 1, 20_000)
	const n, first = 1000, 100_000
	for i := uint64(first); i <= first+2*n; i++ {
		apply(queuecore.Op{Kind: queuecore.OpInsert, Msg: benchMessage(i, queuecore.StateReady), Body: benchBody})
	}
	const frame = 24 + 4096
	for _, c := range []struct {
		name string
		op   func(id uint64) queuecore.Op
		max  float64
	}{
		{"publish", func(id uint64) queuecore.Op {
			return queuecore.Op{Kind: queuecore.OpInsert, Msg: benchMessage(id, queuecore.StateReady), Body: benchBody}
		}, 3.8}, // the row, its name, its place in the order (and splits)
		{"lease", func(id uint64) queuecore.Op {
			return queuecore.Op{Kind: queuecore.OpUpdate, Msg: benchMessage(id, queuecore.StateLeased)}
		}, 4.6}, // the row, its place in two states' order, the deadline
		{"ack", func(id uint64) queuecore.Op {
			return queuecore.Op{Kind: queuecore.OpDelete, Msg: queuecore.Message{ID: id}}
		}, 5.0}, // the row, name, order and deadline entries
	} {
		before := walSize()
		for i := uint64(1); i <= n; i++ {
			apply(c.op(first + 2*n + i))
		}
		pages := float64(walSize()-before) / frame / n
		t.Logf("%s: %.2f pages per commit", c.name, pages)
		if pages > c.max {
			t.Errorf("%s writes %.2f pages per commit, want at most %.1f", c.name, pages, c.max)
		}
	}
}

// TestLargeBody: a body over inlineBody is kept apart, so that leasing
// and archiving its message do not write it again; it goes with its
// message and with its queue. (Bodies in files are off here: the
// conformance suite runs with them, TestFileBodies checks them.)
func TestLargeBody(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTuned(t, dir, queuecore.SyncNormal, config{fileBodies: -1})
	for _, q := range []string{"bench", "other"} {
		if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: q}); err != nil {
			t.Fatal(err)
		}
	}
	onWriter(s, func(w *writer) {
		if _, err := w.conn.Exec("PRAGMA wal_autocheckpoint = 0", nil); err != nil {
			t.Fatal(err)
		}
	})
	walPages := func() int64 {
		fi, err := os.Stat(filepath.Join(dir, FileName+"-wal"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size() / (24 + 4096)
	}
	bodies := func() int64 {
		var n int64
		onWriter(s, func(w *writer) {
			var err error
			if n, err = queryInt(w.conn, "SELECT count(*) FROM bodies"); err != nil {
				t.Fatal(err)
			}
		})
		return n
	}
	apply := func(ops ...queuecore.Op) {
		t.Helper()
		if err := s.Apply(ctx, ops); err != nil {
			t.Fatal(err)
		}
	}

	for _, size := range []int{0, inlineBody, inlineBody + 1, 256 << 10} {
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i * 7)
		}
		id := uint64(size + 1)
		m := benchMessage(id, queuecore.StateReady)
		apply(queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: body})
		got, err := s.Body(ctx, id)
		if err != nil || string(got) != string(body) {
			t.Errorf("Body of a %d-byte message: %d bytes, %v", size, len(got), err)
		}
		before := walPages()
		m.State, m.Deadline, m.Consumer = queuecore.StateLeased, time.Now().Add(time.Minute), "uid 1000 pid 4242 worker"
		apply(queuecore.Op{Kind: queuecore.OpUpdate, Msg: m})
		m.State, m.Deadline, m.StateAt = queuecore.StateArchived, time.Time{}, time.Now()
		apply(queuecore.Op{Kind: queuecore.OpUpdate, Msg: m})
		if pages := walPages() - before; pages > 10 {
			t.Errorf("lease and archive of a %d-byte message wrote %d pages, want at most 10", size, pages)
		}
		if got, err := s.Body(ctx, id); err != nil || string(got) != string(body) {
			t.Errorf("Body of a %d-byte message after updates: %d bytes, %v", size, len(got), err)
		}
	}
	if n := bodies(); n != 2 {
		t.Errorf("%d bodies kept apart, want 2", n)
	}
	apply(queuecore.Op{Kind: queuecore.OpDelete, Msg: queuecore.Message{ID: inlineBody + 2}})
	if n := bodies(); n != 1 {
		t.Errorf("after a delete, %d bodies kept apart, want 1", n)
	}
	if _, err := s.Body(ctx, inlineBody+2); !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("Body of a deleted message: %v, want ErrNotFound", err)
	}
	// A failed insert leaves no body behind; DeleteQueue takes the bodies.
	big := make([]byte, 2*inlineBody)
	err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: benchMessage(1, queuecore.StateReady), Body: big}})
	if !errors.Is(err, queuecore.ErrExists) {
		t.Errorf("insert of a taken ID with a large body = %v, want ErrExists", err)
	}
	m := benchMessage(5000, queuecore.StateDead)
	m.Queue = "other"
	apply(queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: big})
	if n := bodies(); n != 2 {
		t.Errorf("%d bodies kept apart, want 2", n)
	}
	if err := s.DeleteQueue(ctx, "bench"); err != nil {
		t.Fatal(err)
	}
	if n := bodies(); n != 1 {
		t.Errorf("after DeleteQueue, %d bodies kept apart, want 1 (of the other queue)", n)
	}
}

// TestExternalReader: a connection of SQLite's own VFS, as a sqlite3 shell
// on a live store would open, sees every commit as soon as Apply returns
// (the gathered WAL writes are in the file), and closing it does not
// checkpoint or delete the WAL under the store (the anchor's SHARED lock).
func TestExternalReader(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncNormal)
	if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: "bench"}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	ext, err := openConn(path, connOptions{sync: "NORMAL"}) // the unix VFS
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 3*inlineBody)
	for i := uint64(1); i <= 50; i++ {
		body := benchBody
		if i%10 == 0 {
			body = big
		}
		if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: benchMessage(i, queuecore.StateReady), Body: body}}); err != nil {
			t.Fatal(err)
		}
		n, err := queryInt(ext, "SELECT count(*) FROM messages")
		if err != nil || n != int64(i) {
			t.Fatalf("after %d commits, the external connection counts %d messages (%v)", i, n, err)
		}
	}
	if err := ext.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + "-wal"); err != nil {
		t.Errorf("WAL after the external connection closed: %v", err)
	}
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: benchMessage(51, queuecore.StateReady), Body: benchBody}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, "bench", benchMessage(51, 0).Name, false); err != nil {
		t.Errorf("Lookup after the external connection closed: %v", err)
	}
}
