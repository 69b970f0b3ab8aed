package fs

import (
	"context"
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
