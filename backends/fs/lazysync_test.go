package fs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// TestLazySync: in SyncFull a NoSync batch (a lease, an ack) returns before
// its journal record is synced, and the timer syncs it, and moves its
// file, within queuecore.SyncDelay; a read of its body neither waits for
// the timer nor syncs (it reads the file where it is). A publish syncs at once. SyncStrict syncs the lease too.
func TestLazySync(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []queuecore.SyncMode{queuecore.SyncFull, queuecore.SyncStrict} {
		t.Run(mode.String(), func(t *testing.T) {
			s := openTest(t, t.TempDir(), mode, config{}, nil)
			mustPutQueues(t, s, "q")
			unsynced := func() bool { return s.synced.Load() < s.written.Load() }
			m := tmsg(1, "q", "a", queuecore.StateReady)
			mustApply(t, s, tins(m))
			if unsynced() {
				t.Fatal("a publish returned before its record was synced")
			}
			leased := m
			leased.State, leased.Deadline = queuecore.StateLeased, m.StateAt.Add(time.Minute)
			op := tupd(leased)
			op.NoSync = true
			start := time.Now()
			mustApply(t, s, op)
			if mode == queuecore.SyncStrict {
				if unsynced() {
					t.Fatal("SyncStrict returned a lease before its record was synced")
				}
				return
			}
			if !unsynced() {
				t.Fatal("a lease was synced before it returned; want it left to the timer")
			}
			// Its body is read at once, not after the timer.
			b, err := s.Body(ctx, 1)
			if err != nil || string(b) != string(tbody(1)) {
				t.Fatalf("Body after a lazy lease: %q, %v", b, err)
			}
			f, err := s.BodyFile(ctx, 1)
			if err != nil || f == nil {
				t.Fatalf("BodyFile after a lazy lease: %v, %v", f, err)
			}
			got := readAllFile(t, f)
			f.Close()
			if string(got) != string(tbody(1)) {
				t.Fatalf("BodyFile after a lazy lease holds %q", got)
			}
			// Nor do they sync it: the file is read where it is until the
			// timer moves it.
			stillUnsynced := unsynced() // before the clock: the timer may fire after
			if d := time.Since(start); d >= queuecore.SyncDelay {
				t.Logf("Body and BodyFile took %v (the machine is slow?)", d)
			} else if !stillUnsynced {
				t.Error("reading the body of a lazy lease synced the journal; want it read where it is")
			}
			m2 := tmsg(2, "q", "b", queuecore.StateReady)
			ack := tdel(1)
			ack.NoSync = true
			mustApply(t, s, ack)
			mustApply(t, s, tins(m2))
			if unsynced() {
				t.Fatal("a publish after a lease returned unsynced")
			}
			leased2 := m2
			leased2.State, leased2.Deadline = queuecore.StateLeased, m2.StateAt.Add(time.Minute)
			op = tupd(leased2)
			op.NoSync = true
			start = time.Now()
			mustApply(t, s, op)
			for unsynced() {
				if time.Since(start) > 5*queuecore.SyncDelay {
					t.Fatalf("the journal is still not synced %v after a lease", time.Since(start))
				}
				time.Sleep(queuecore.SyncDelay / 10)
			}
			wantMessage(t, s, leased2, tbody(2))
		})
	}
}

// TestDeferredBodyFiles: in SyncFull a publish of small bodies returns
// once its record is durable and leaves its body file to the next commit
// or the lazy timer; a message leased and acked before then never gets
// one (no create, rename or unlink), and one left alone gets its file
// within queuecore.SyncDelay. After a crash that loses the ack, Open
// writes the body back from the journal.
func TestDeferredBodyFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncFull, config{}, nil)
	mustPutQueues(t, s, "q")
	path := func(name string, st queuecore.State) string { return s.bodyPath("q", st, name) }

	// A round trip: no file, ever. (Each check holds only while the timer,
	// armed by the publish, has not fired: a slow machine skips it.)
	m := tmsg(1, "q", "a", queuecore.StateReady)
	t0 := time.Now()
	mustApply(t, s, tins(m))
	_, err := os.Lstat(path("a", queuecore.StateReady))
	if time.Since(t0) < queuecore.SyncDelay && err == nil {
		t.Error("the publish wrote its body file before it returned; want it left to the next commit or the timer")
	}
	leased := m
	leased.State, leased.Deadline = queuecore.StateLeased, m.StateAt.Add(time.Minute)
	lease := tupd(leased)
	lease.NoSync = true
	mustApply(t, s, lease)
	if b, err := s.Body(ctx, 1); err != nil || string(b) != string(tbody(1)) {
		t.Fatalf("Body of the leased message: %q, %v", b, err)
	}
	ack := tdel(1)
	ack.NoSync = true
	mustApply(t, s, ack)
	s.mu.RLock()
	busy, pending := s.busy[1], 0
	for _, r := range s.pending {
		pending += len(r.ops)
	}
	s.mu.RUnlock()
	if time.Since(t0) < queuecore.SyncDelay && (busy != 0 || pending != 0) {
		t.Errorf("after the ack: %d file operations of the message pending, %d in all; want none (write, rename and unlink dropped)", busy, pending)
	}
	s.flushLazy()
	if len(s.unwritten) != 0 || len(s.busy) != 0 {
		t.Errorf("after the ack: %d unwritten, %d busy; want none", len(s.unwritten), len(s.busy))
	}
	for _, st := range []queuecore.State{queuecore.StateReady, queuecore.StateLeased} {
		if _, err := os.Lstat(path("a", st)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of an acked message: %v, want no file", path("a", st), err)
		}
	}

	// Left alone: written by the timer.
	mustApply(t, s, tins(tmsg(2, "q", "b", queuecore.StateReady)))
	start := time.Now()
	for {
		if got, err := os.ReadFile(path("b", queuecore.StateReady)); err == nil {
			if string(got) != string(tbody(2)) {
				t.Fatalf("body file of b holds %q", got)
			}
			break
		}
		if time.Since(start) > 5*queuecore.SyncDelay {
			t.Fatalf("the body file of b is not written %v after its publish", time.Since(start))
		}
		time.Sleep(queuecore.SyncDelay / 10)
	}

	// A crash after the ack's record was written but before it was
	// synced: the journal is cut back to the publish's record.
	m3 := tmsg(3, "q", "c", queuecore.StateReady)
	mustApply(t, s, tins(m3))
	synced := s.cur.Load().size
	ack = tdel(3)
	ack.NoSync = true
	mustApply(t, s, ack)
	if _, err := os.Lstat(path("c", queuecore.StateReady)); !errors.Is(err, os.ErrNotExist) {
		t.Skipf("the body file of c was written before the ack (slow machine?): %v", err)
	}
	j := filepath.Join(dir, journalName)
	crash(t, s)
	if err := os.Truncate(j, synced); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, queuecore.SyncFull, config{}, nil)
	wantMessage(t, s, m3, tbody(3))
	s.flushLazy()
	if got, err := os.ReadFile(path("c", queuecore.StateReady)); err != nil || string(got) != string(tbody(3)) {
		t.Errorf("after the crash the body file of c holds %q (%v), want %q", got, err, tbody(3))
	}
}

// TestQueueOpsLeaveMessageCountsAlone: the file operations of a queue
// (created, deleted) carry an lsn or 0 where a message's carry its ID; once
// done they must not count down the pending operations of the message that
// has that ID, which a read would then look for where they had not put it
// yet.
func TestQueueOpsLeaveMessageCountsAlone(t *testing.T) {
	ctx := context.Background()
	var s *Store
	var hook atomic.Bool
	m := tmsg(4, "q", "a", queuecore.StateReady) // ID 4, as DeleteQueue's lsn below
	leased := m
	leased.State, leased.Deadline = queuecore.StateLeased, m.StateAt.Add(time.Minute)
	cfg := config{beforeFileOps: func() {
		if hook.CompareAndSwap(true, false) {
			// Between the queue delete's sync and its file operations: a
			// lease whose rename waits for the next sync.
			op := tupd(leased)
			op.NoSync = true
			if err := s.Apply(ctx, []queuecore.Op{op}); err != nil {
				t.Errorf("lease: %v", err)
			}
		}
	}}
	s = openTest(t, t.TempDir(), queuecore.SyncFull, cfg, nil)
	mustPutQueues(t, s, "q", "other") // lsn 1, 2
	mustApply(t, s, tins(m))          // lsn 3
	s.flushLazy()
	hook.Store(true)
	if err := s.DeleteQueue(ctx, "other"); err != nil { // lsn 4
		t.Fatal(err)
	}
	if s.lsn < 5 {
		t.Fatalf("lsn %d: the lease did not commit in the hook", s.lsn)
	}
	if b, err := s.Body(ctx, 4); err != nil || string(b) != string(tbody(4)) {
		t.Errorf("Body of the leased message = %q, %v", b, err)
	}
	s.flushLazy()
	wantMessage(t, s, leased, tbody(4))
}
