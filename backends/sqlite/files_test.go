package sqlite

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// fileOp inserts message id with a body of n bytes derived from id.
func fileOp(id uint64, queue string, n int) queuecore.Op {
	m := message(id, queue, "m"+strconv.FormatUint(id, 10))
	m.Size = int64(n)
	return queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: fileBody(id, n)}
}

func fileBody(id uint64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(uint64(i)*7 + id)
	}
	return b
}

// bodyFiles lists the names in dir/bodies.
func bodyFiles(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, bodiesDir))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, e := range ents {
		fi, err := e.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue // removed since the listing (a lazy sync's removal)
		}
		if err != nil {
			t.Fatal(err)
		}
		got[e.Name()] = fi.Size()
	}
	return got
}

// TestFileBodies: a body of FileBodies bytes or more is in a file of its
// own from the Apply that inserts it until the commit that deletes its
// message (an ack, its queue deleted); a lease leaves it; a failed insert
// leaves no file; Body and BodyFile read it, and BodyFile gives nothing for
// a body in the database.
func TestFileBodies(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTuned(t, dir, queuecore.SyncFull, config{fileBodies: 4096})
	for _, q := range []string{"q", "other"} {
		if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: q}); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.BodyFileMin(); got != 4096 {
		t.Fatalf("BodyFileMin = %d, want 4096", got)
	}
	sizes := map[uint64]int{1: 10, 2: 2000, 3: 4096, 4: 1 << 20, 5: 5000}
	queues := map[uint64]string{1: "q", 2: "q", 3: "q", 4: "q", 5: "other"}
	for id := uint64(1); id <= 5; id++ {
		if err := s.Apply(ctx, []queuecore.Op{fileOp(id, queues[id], sizes[id])}); err != nil {
			t.Fatalf("insert %d: %v", id, err)
		}
	}
	want := map[string]int64{"3": 4096, "4": 1 << 20, "5": 5000}
	if got := bodyFiles(t, dir); !equalSizes(got, want) {
		t.Fatalf("body files %v, want %v", got, want)
	}
	check := func(id uint64) {
		t.Helper()
		got, err := s.Body(ctx, id)
		if err != nil || !bytes.Equal(got, fileBody(id, sizes[id])) {
			t.Fatalf("Body(%d): %d bytes, %v; want %d bytes", id, len(got), err, sizes[id])
		}
		f, err := s.BodyFile(ctx, id)
		if err != nil {
			t.Fatalf("BodyFile(%d): %v", id, err)
		}
		if sizes[id] < 4096 {
			if f != nil {
				f.Close()
				t.Fatalf("BodyFile(%d) of a body in the database gave %s", id, f.Name())
			}
			return
		}
		if f == nil {
			t.Fatalf("BodyFile(%d) gave no file", id)
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err != nil || !bytes.Equal(b, fileBody(id, sizes[id])) {
			t.Fatalf("BodyFile(%d) read %d bytes, %v", id, len(b), err)
		}
	}
	for id := uint64(1); id <= 5; id++ {
		check(id)
	}

	// A failed insert (its name is taken) leaves no file; one that reuses
	// the ID of a message with a body file fails and leaves that file.
	dup := fileOp(6, "q", 8000)
	dup.Msg.Name = "m4"
	if err := s.Apply(ctx, []queuecore.Op{dup}); !errors.Is(err, queuecore.ErrExists) {
		t.Fatalf("insert with a taken name: %v, want ErrExists", err)
	}
	if err := s.Apply(ctx, []queuecore.Op{fileOp(4, "q", 9000)}); !errors.Is(err, queuecore.ErrExists) {
		t.Fatalf("insert with a taken ID: %v, want ErrExists", err)
	}
	if got := bodyFiles(t, dir); !equalSizes(got, want) {
		t.Fatalf("after failed inserts: body files %v, want %v", got, want)
	}
	check(4)

	// A lease (an update) keeps the file; an ack removes it, and a
	// descriptor opened before still reads the body.
	m := message(4, "q", "m4")
	m.Size = 1 << 20
	m.State = queuecore.StateLeased
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: m, NoSync: true}}); err != nil {
		t.Fatal(err)
	}
	check(4)
	f, err := s.BodyFile(ctx, 4)
	if err != nil || f == nil {
		t.Fatalf("BodyFile(4): %v, %v", f, err)
	}
	defer f.Close()
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpDelete, Msg: m, NoSync: true}}); err != nil {
		t.Fatal(err)
	}
	// The ack returned before its sync: its file stays until the sync
	// (a power cut may still undo the ack, and the message then needs
	// its body), and goes after it, within SyncDelay.
	_, statErr := os.Stat(filepath.Join(dir, bodiesDir, "4"))
	if statErr != nil && s.lazy.unsynced() {
		t.Fatalf("the acked message's file was removed before the ack was synced: %v", statErr)
	}
	delete(want, "4")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := bodyFiles(t, dir)
		if equalSizes(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the ack: body files %v, want %v", got, want)
		}
	}
	if b, err := io.ReadAll(f); err != nil || !bytes.Equal(b, fileBody(4, 1<<20)) {
		t.Fatalf("read of a descriptor opened before the ack: %d bytes, %v", len(b), err)
	}
	if _, err := s.Body(ctx, 4); !errors.Is(err, queuecore.ErrNotFound) {
		t.Fatalf("Body of an acked message: %v, want ErrNotFound", err)
	}

	// Deleting a queue removes its messages' files.
	if err := s.DeleteQueue(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	delete(want, "5")
	if got := bodyFiles(t, dir); !equalSizes(got, want) {
		t.Fatalf("after deleting a queue: body files %v, want %v", got, want)
	}
	check(3)
}

// TestFileBodiesAfterCrash: what a crash can leave in bodies/ is put right
// by the next Open: a file that no message names (a publish that never
// committed, an ack whose file was not removed yet) is removed; a message
// whose file is gone (an ack that a power cut undid after its file was
// removed) or short (a power cut in --sync normal) is deleted. Other names
// are left alone.
func TestFileBodiesAfterCrash(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	tun := config{fileBodies: 1000}
	s := openTuned(t, dir, queuecore.SyncFull, tun)
	if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 3; id++ {
		if err := s.Apply(ctx, []queuecore.Op{fileOp(id, "q", 3000)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	bodies := filepath.Join(dir, bodiesDir)
	if err := os.Remove(filepath.Join(bodies, "2")); err != nil {
		t.Fatal(err)
	}
	// What a power cut in --sync normal can leave (the files are not
	// synced there): the name, with fewer bytes.
	if err := os.Truncate(filepath.Join(bodies, "3"), 0); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"77": "orphan", "notes.txt": "mine"} {
		if err := os.WriteFile(filepath.Join(bodies, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s = openTuned(t, dir, queuecore.SyncFull, tun)
	if got, want := bodyFiles(t, dir), map[string]int64{"1": 3000, "notes.txt": 4}; !equalSizes(got, want) {
		t.Fatalf("body files after reopen: %v, want %v", got, want)
	}
	for _, id := range []uint64{2, 3} {
		if _, err := s.Body(ctx, id); !errors.Is(err, queuecore.ErrNotFound) {
			t.Fatalf("Body of message %d, whose file was gone or short: %v, want ErrNotFound", id, err)
		}
	}
	for _, id := range []uint64{1} {
		if got, err := s.Body(ctx, id); err != nil || !bytes.Equal(got, fileBody(id, 3000)) {
			t.Fatalf("Body(%d) after reopen: %d bytes, %v", id, len(got), err)
		}
	}
	// The ID of the orphan is taken by a new message; its stale file
	// must not be mistaken for the new body.
	if err := s.Apply(ctx, []queuecore.Op{fileOp(77, "q", 5000)}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Body(ctx, 77); err != nil || !bytes.Equal(got, fileBody(77, 5000)) {
		t.Fatalf("Body(77): %d bytes, %v", len(got), err)
	}
}

// TestFileBodiesUpgrade: a store of schema version 1 (no files table)
// is upgraded when opened, and takes body files after.
func TestFileBodiesUpgrade(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTuned(t, dir, queuecore.SyncNormal, config{fileBodies: -1})
	if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, []queuecore.Op{fileOp(1, "q", 300<<10)}); err != nil {
		t.Fatal(err)
	}
	onWriter(s, func(w *writer) {
		if _, err := w.conn.Exec("DROP TRIGGER messages_file_delete; DROP TABLE files; PRAGMA user_version = 1", nil); err != nil {
			t.Fatal(err)
		}
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, queuecore.SyncNormal)
	if err := s.Apply(ctx, []queuecore.Op{fileOp(2, "q", 300<<10)}); err != nil {
		t.Fatal(err)
	}
	if got, want := bodyFiles(t, dir), map[string]int64{"2": 300 << 10}; !equalSizes(got, want) {
		t.Fatalf("body files %v, want %v", got, want)
	}
	for _, id := range []uint64{1, 2} {
		if got, err := s.Body(ctx, id); err != nil || !bytes.Equal(got, fileBody(id, 300<<10)) {
			t.Fatalf("Body(%d): %d bytes, %v", id, len(got), err)
		}
	}
	// Message 1's body is in the database, though past the size: no file.
	if f, err := s.BodyFile(ctx, 1); f != nil || err != nil {
		t.Fatalf("BodyFile(1) = %v, %v; want nothing", f, err)
	}
	onWriter(s, func(w *writer) {
		if v, err := queryInt(w.conn, "PRAGMA user_version"); err != nil || v != schemaVersion {
			t.Fatalf("user_version %d, %v; want %d", v, err, schemaVersion)
		}
	})
}

func equalSizes(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestFileBodiesSyncFails: in SyncFull a publish whose commit went through
// but whose WAL sync failed reports the failure, and keeps its body file:
// the row is there (and may be after a restart), so its body must be
// readable. Found by a review: the file was removed.
func TestFileBodiesSyncFails(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTuned(t, dir, queuecore.SyncFull, config{fileBodies: 1000})
	if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, []queuecore.Op{fileOp(7, "q", 3000)}); err != nil {
		t.Fatal(err)
	}
	s.lazy.syncMu.Lock()
	if s.lazy.f != nil {
		s.lazy.f.Close()
		s.lazy.f = nil
	}
	good := s.lazy.wal
	s.lazy.wal = filepath.Join(dir, "no-such-wal") // the next sync fails
	s.lazy.syncMu.Unlock()
	err := s.Apply(ctx, []queuecore.Op{fileOp(5, "q", 3000)})
	s.lazy.syncMu.Lock()
	s.lazy.wal = good
	s.lazy.syncMu.Unlock()
	if err == nil {
		t.Fatal("Apply succeeded with a WAL that cannot be synced")
	}
	if _, err := s.Lookup(ctx, "q", "m5", false); err != nil {
		t.Fatalf("the commit before the failed sync: Lookup: %v", err)
	}
	if got, err := s.Body(ctx, 5); err != nil || !bytes.Equal(got, fileBody(5, 3000)) {
		t.Fatalf("Body of the committed message: %d bytes, %v", len(got), err)
	}
	// A batch that failed before its commit leaves no file.
	dup := fileOp(6, "q", 3000)
	dup.Msg.Name = "m5"
	if err := s.Apply(ctx, []queuecore.Op{dup}); !errors.Is(err, queuecore.ErrExists) {
		t.Fatalf("insert with a taken name: %v", err)
	}
	// After a failed sync no later sync proves that an ack is on disk
	// (Linux reports a writeback error once): an ack's file is kept, and
	// left to the next Open.
	m7 := message(7, "q", "m7")
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpDelete, Msg: m7, NoSync: true}}); err != nil {
		t.Fatal(err)
	}
	if err := s.lazy.sync(s.lazy.written.Load()); err != nil {
		t.Fatal(err)
	}
	if got, want := bodyFiles(t, dir), map[string]int64{"5": 3000, "7": 3000}; !equalSizes(got, want) {
		t.Fatalf("body files %v, want %v", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	openTuned(t, dir, queuecore.SyncFull, config{fileBodies: 1000})
	if got, want := bodyFiles(t, dir), map[string]int64{"5": 3000}; !equalSizes(got, want) {
		t.Fatalf("after reopening: body files %v, want %v", got, want)
	}
}

// TestFileBodiesKilledBeforeAckSync: a daemon killed within the lazy
// sync's delay after an ack leaves the acked message's file, and the ack
// only in the page cache (its WAL frames unsynced). The next Open removes
// that file as an orphan, but only after it synced the WAL: a power cut
// after the removal must not bring the message back without its body.
// Found by a review.
func TestFileBodiesKilledBeforeAckSync(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	tun := config{fileBodies: 1000}
	s, err := open(ctx, dir, backends.Options{Sync: queuecore.SyncFull, Holder: "killed"}, tun)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, []queuecore.Op{fileOp(1, "q", 3000)}); err != nil {
		t.Fatal(err)
	}
	// As if killed: the lazy sync never runs again, and nothing closes.
	s.lazy.mu.Lock()
	s.lazy.closed = true
	if s.lazy.timer != nil {
		s.lazy.timer.Stop()
	}
	s.lazy.mu.Unlock()
	m := message(1, "q", "m1")
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpDelete, Msg: m, NoSync: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, bodiesDir, "1")); err != nil {
		t.Fatalf("the file of an ack not synced yet is gone: %v", err)
	}
	s.lock.Unlock() // the kill: the next open may take the store

	var events []string
	oldSync, oldRemove := syncWAL, removeOrphan
	t.Cleanup(func() { syncWAL, removeOrphan = oldSync, oldRemove })
	syncWAL = func(path string) error {
		events = append(events, "sync "+filepath.Base(path))
		return oldSync(path)
	}
	removeOrphan = func(path string) error {
		events = append(events, "remove "+filepath.Base(path))
		return oldRemove(path)
	}
	s2 := openTuned(t, dir, queuecore.SyncFull, tun)
	want := []string{"sync " + FileName + "-wal", "remove 1"}
	if strings.Join(events, ", ") != strings.Join(want, ", ") {
		t.Fatalf("Open did %q, want %q", events, want)
	}
	if _, err := s2.Body(ctx, 1); !errors.Is(err, queuecore.ErrNotFound) {
		t.Fatalf("Body of the acked message: %v, want ErrNotFound", err)
	}
}

// TestFileBodiesAckLookups: a delete looks in the database for the body
// file only of a message as big as the smallest body the store has held
// in a file since it opened (or of one whose size it is not told), and
// that floor comes from the files, not from the size setting: a store
// reopened with a larger one still finds the smaller files of before.
func TestFileBodiesAckLookups(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTuned(t, dir, queuecore.SyncFull, config{fileBodies: 4096})
	if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	del := func(s *Store, id uint64, size int64) {
		t.Helper()
		m := message(id, "q", "m"+strconv.FormatUint(id, 10))
		m.Size = size
		if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpDelete, Msg: m, From: m.State}}); err != nil {
			t.Fatalf("delete %d: %v", id, err)
		}
	}
	lookups := func(s *Store) (n int) {
		onWriter(s, func(w *writer) { n = w.lookups })
		return n
	}
	steps := []struct {
		what   string
		insert []queuecore.Op
		id     uint64
		size   int64 // told to the delete
		looks  int   // look-ups it makes
	}{
		{what: "no file yet", insert: []queuecore.Op{fileOp(1, "q", 100)}, id: 1, size: 100, looks: 0},
		{what: "no file yet, size not told", insert: []queuecore.Op{fileOp(2, "q", 100)}, id: 2, size: 0, looks: 0},
		{what: "under the floor", insert: []queuecore.Op{fileOp(3, "q", 5000), fileOp(4, "q", 100)}, id: 4, size: 100, looks: 0},
		{what: "size not told", insert: []queuecore.Op{fileOp(5, "q", 100)}, id: 5, size: 0, looks: 1},
		{what: "at the floor", id: 3, size: 5000, looks: 1},
		{what: "under the floor, whose file is gone", insert: []queuecore.Op{fileOp(6, "q", 6000), fileOp(7, "q", 4000)}, id: 7, size: 4000, looks: 0},
		{what: "a smaller file lowers the floor", insert: []queuecore.Op{fileOp(9, "q", 4500), fileOp(10, "q", 4600)}, id: 10, size: 4600, looks: 1},
		{what: "at the lower floor", id: 9, size: 4500, looks: 1},
	}
	for _, st := range steps {
		if st.insert != nil {
			if err := s.Apply(ctx, st.insert); err != nil {
				t.Fatalf("%s: insert: %v", st.what, err)
			}
		}
		before := lookups(s)
		del(s, st.id, st.size)
		if got := lookups(s) - before; got != st.looks {
			t.Errorf("%s: delete of %d (size %d) made %d look-ups, want %d", st.what, st.id, st.size, got, st.looks)
		}
	}
	if got, want := bodyFiles(t, dir), map[string]int64{"6": 6000}; !equalSizes(got, want) {
		t.Fatalf("body files %v, want %v", got, want)
	}

	// Reopened with the default size (256 KiB): message 6's file, under
	// it, still sets the floor, so its delete finds and removes it.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, queuecore.SyncFull)
	if err := s.Apply(ctx, []queuecore.Op{fileOp(8, "q", 5000)}); err != nil {
		t.Fatal(err)
	}
	before := lookups(s)
	del(s, 8, 5000)
	del(s, 6, 6000)
	if got := lookups(s) - before; got != 1 {
		t.Errorf("after reopening: %d look-ups, want 1 (message 6's)", got)
	}
	if got := bodyFiles(t, dir); len(got) != 0 {
		t.Fatalf("body files %v after deleting their messages, want none", got)
	}
}
