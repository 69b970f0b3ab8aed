package sqlite

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"yirangmq/queuecore"
)

// TestOnlineBackup: the online backup of docs/operations.md,
// `sqlite3 STORE/yirangmq.db ".backup FILE"`, and plain queries, run by a
// sqlite3 shell (another process, so the wal-index locks are real fcntl
// locks between processes) while the store commits without pause. The
// writer keeps the WAL write lock between its transactions (vfs.go), which
// readers and the backup never need: each backup is a consistent copy
// that holds every commit made before it started, each query sees every
// commit made before it, and the store goes on committing.
func TestOnlineBackup(t *testing.T) {
	shell, err := exec.LookPath("sqlite3")
	if err != nil {
		t.Skip("no sqlite3 shell on PATH")
	}
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncNormal)
	if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)

	var done atomic.Int64 // the last ID whose Apply returned; IDs go in order
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for id := uint64(1); ; id++ {
			select {
			case <-stop:
				return
			default:
			}
			ops := insert(id, "q", fmt.Sprintf("m%d", id))
			if id > 1 && id%3 == 0 {
				// A lease-like update and an ack-like delete too.
				m := message(id-1, "q", fmt.Sprintf("m%d", id-1))
				m.State = queuecore.StateLeased
				ops = append(ops, queuecore.Op{Kind: queuecore.OpUpdate, Msg: m})
			}
			if err := s.Apply(ctx, ops); err != nil {
				t.Errorf("Apply %d: %v", id, err)
				return
			}
			done.Store(int64(id))
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()

	count := func(t *testing.T, db string) int64 {
		t.Helper()
		out, err := exec.Command(shell, db, "SELECT max(id) FROM messages").CombinedOutput()
		if err != nil {
			t.Fatalf("sqlite3 %s: %v: %s", db, err, out)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil {
			t.Fatalf("sqlite3 %s: %q", db, out)
		}
		return n
	}
	for i := range 3 {
		before := done.Load()
		if n := count(t, path); n < before {
			t.Errorf("a query by another process sees message %d at most, after the commit of %d", n, before)
		}
		dst := filepath.Join(t.TempDir(), fmt.Sprintf("backup-%d.db", i))
		before = done.Load()
		if out, err := exec.Command(shell, path, ".backup "+dst).CombinedOutput(); err != nil {
			t.Fatalf("sqlite3 .backup: %v: %s", err, out)
		}
		after := done.Load()
		out, err := exec.Command(shell, dst, "PRAGMA integrity_check").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Errorf("integrity_check of backup %d: %v: %s", i, err, out)
		}
		// At most one commit more than after: its Apply had not returned.
		if n := count(t, dst); n < before || n > after+1 {
			t.Errorf("backup %d holds messages up to %d, want %d to %d", i, n, before, after+1)
		}
	}
	t.Logf("%d commits during the queries and backups", done.Load())
	if done.Load() < 10 {
		t.Errorf("only %d commits during the backups", done.Load())
	}
	// A write by another process is refused while the store is open (the
	// writer keeps the WAL write lock), and the store goes on.
	out, err := exec.Command(shell, path, "UPDATE meta SET hwm = hwm").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "locked") {
		t.Errorf("a write by another process: %v: %s; want database is locked", err, out)
	}
	last := done.Load()
	for done.Load() < last+10 {
		if t.Failed() {
			break
		}
	}
}
