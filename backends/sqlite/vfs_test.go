package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"yirangmq/queuecore"
	"yirangmq/testenv"
)

// Tests of the VFS (vfs.c) under write errors. A write error is made with
// RLIMIT_FSIZE: a write past the limit fails with EFBIG (Go ignores the
// SIGXFSZ that comes with it). The limit is the whole process's, so each
// test runs in a child process: the test itself, run again.

const vfsChildEnv = "YIRANGMQ_VFS_FAULT_CHILD"

// noLimit is RLIM_INFINITY as a uint64.
const noLimit = ^uint64(0)

// inVFSChild reports whether this is the child; if not, it runs the child
// and reports its result as the test's.
func inVFSChild(t *testing.T) bool {
	t.Helper()
	if os.Getenv(vfsChildEnv) != "" {
		return true
	}
	cmd := testenv.SelfCommand("-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), vfsChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("child:\n%s", out)
	return false
}

// limitFileSize makes writes past size bytes fail, in this process.
func limitFileSize(t *testing.T, size uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = size
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
}

func fileSize(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(fi.Size())
}

// TestVFSUnlockAfterFailedWrite: the writer spills uncommitted frames (the
// VFS gathers them), the transaction rolls back, and writing them out
// fails. The store must go on: the WAL write lock released (a failed flush
// in a shm unlock once kept it, and every later commit would have waited
// busy_timeout and failed with "database is locked"). With this SQLite the
// flush fails in a read during the rollback rather than in the unlock, so
// the test guards the outcome more than that one path.
func TestVFSUnlockAfterFailedWrite(t *testing.T) {
	if !inVFSChild(t) {
		return
	}
	ctx := context.Background()
	s := newTestStore(t, queuecore.SyncNormal, "q")
	if err := s.Apply(ctx, insert(1, "q", "taken")); err != nil {
		t.Fatal(err)
	}
	// A page cache of 30 pages makes SQLite spill dirty pages to the WAL
	// in the middle of the transaction below.
	onWriter(s, func(w *writer) {
		if _, err := w.conn.Exec("PRAGMA cache_size = 30", nil); err != nil {
			t.Fatal(err)
		}
	})
	// Fifty bodies kept apart (a page each) and, last, a message whose ID
	// is taken: the batch fails and its transaction rolls back; writing
	// the spilled frames out fails on the way.
	var ops []queuecore.Op
	for i := uint64(0); i < 50; i++ {
		ops = append(ops, queuecore.Op{Kind: queuecore.OpInsert, Msg: message(10+i, "q", fmt.Sprint("m", i)), Body: make([]byte, 3*inlineBody)})
	}
	ops = append(ops, insert(1, "q", "again")...)

	limitFileSize(t, fileSize(t, s.path+"-wal"))
	err := s.Apply(ctx, ops)
	limitFileSize(t, noLimit)
	if err == nil {
		t.Fatal("Apply of a batch with a taken ID succeeded")
	}
	t.Logf("failed batch: %v", err)

	start := time.Now()
	if err := s.Apply(ctx, insert(2, "q", "after")); err != nil {
		t.Fatalf("Apply after the failed batch (%v later): %v", time.Since(start), err)
	}
	if d := time.Since(start); d > busyTimeout/2 {
		t.Errorf("Apply after the failed batch took %v: it waited for a lock", d)
	}
	if _, err := s.Lookup(ctx, "q", "after", false); err != nil {
		t.Errorf("Lookup: %v", err)
	}
}

// TestVFSPaddedCommit: with psow=0 (no powersafe overwrite) and
// synchronous=FULL, SQLite pads every commit to a sector boundary, syncs in
// the middle of the last padding frame and writes its tail after the sync.
// If that tail cannot be written, the commit must fail as it does on the
// unix VFS; the VFS once kept the tail in its buffer, published the commit
// and lost the write error, and a reader then found a torn frame.
func TestVFSPaddedCommit(t *testing.T) {
	if !inVFSChild(t) {
		return
	}
	if err := registerVFS(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "padded.db")
	open := func(vfs string) *sqlite3.SQLiteConn {
		dc, err := (&sqlite3.SQLiteDriver{}).Open("file:" + path + "?psow=0&_mutex=no&vfs=" + vfs)
		if err != nil {
			t.Fatal(err)
		}
		c := dc.(*sqlite3.SQLiteConn)
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := open(vfsName)
	exec := func(sql string) error {
		_, err := c.Exec(sql, nil)
		return err
	}
	for _, sql := range []string{
		"PRAGMA page_size = 4096", "PRAGMA journal_mode = WAL", "PRAGMA synchronous = FULL",
		"CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER)", "INSERT INTO t VALUES (1, 0)",
	} {
		if err := exec(sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// An update of the one row is a commit of one frame. The bytes
	// before the sync point are in [end, sync); the tail written after
	// the sync is past it.
	const frame, sector = 4096 + 24, 4096
	tried := false
	for v := 1; v < 20 && !tried; v++ {
		end := fileSize(t, path+"-wal")
		sync := (end + frame + sector - 1) / sector * sector
		if (sync-end)%frame == 0 {
			// The frames end on the sector boundary: no tail.
			if err := exec(fmt.Sprintf("UPDATE t SET v = %d", v)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		tried = true
		limitFileSize(t, sync)
		err := exec(fmt.Sprintf("UPDATE t SET v = %d", v))
		limitFileSize(t, noLimit)
		var se sqlite3.Error
		if err == nil {
			t.Errorf("commit whose padding tail could not be written succeeded")
		} else if !errors.As(err, &se) || se.Code != sqlite3.ErrIoErr && se.Code != sqlite3.ErrFull {
			t.Errorf("commit: %v, want an I/O error", err)
		}
		// Whatever was reported, a reader of SQLite's own VFS must find a
		// consistent database.
		r := open("unix")
		want := int64(v - 1)
		if err == nil {
			want = int64(v)
		}
		if got, err := queryInt(r, "SELECT v FROM t"); err != nil || got != want {
			t.Errorf("a reader finds v = %d (%v), want %d", got, err, want)
		}
		if ok, err := queryValue(r, "PRAGMA integrity_check"); err != nil || ok != "ok" {
			t.Errorf("integrity_check: %v (%v)", ok, err)
		}
	}
	if !tried {
		t.Fatal("no commit had a padding tail")
	}
}
