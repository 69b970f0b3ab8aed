package sqlite

import (
	"context"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// TestLazySync: in SyncFull a group of NoSync batches (a lease, an ack)
// returns with the WAL not synced, and the timer syncs it within
// queuecore.SyncDelay; a publish syncs at once, and covers what came
// before. In SyncStrict nothing is left unsynced.
func TestLazySync(t *testing.T) {
	ctx := context.Background()
	dirty := func(s *Store) bool { return s.lazy.unsynced() }
	lease := func(id uint64, name string) []queuecore.Op {
		m := message(id, "q", name)
		m.State, m.Deadline = queuecore.StateLeased, m.StateAt.Add(time.Minute)
		return []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: m, From: queuecore.StateReady, NoSync: true}}
	}

	s := newTestStore(t, queuecore.SyncFull, "q")
	if err := s.Apply(ctx, insert(1, "q", "a")); err != nil {
		t.Fatal(err)
	}
	if dirty(s) {
		t.Fatal("a publish returned with the WAL not synced")
	}
	start := time.Now()
	if err := s.Apply(ctx, lease(1, "a")); err != nil {
		t.Fatal(err)
	}
	if !dirty(s) {
		t.Fatal("a lease alone was synced before it returned; want it left to the timer")
	}
	for dirty(s) {
		if time.Since(start) > 5*queuecore.SyncDelay {
			t.Fatalf("the WAL is still not synced %v after a lease", time.Since(start))
		}
		time.Sleep(queuecore.SyncDelay / 10)
	}
	if err := s.Apply(ctx, insert(2, "q", "b")); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, lease(2, "b")); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, insert(3, "q", "c")); err != nil {
		t.Fatal(err)
	}
	if dirty(s) {
		t.Fatal("a publish after a lease left the WAL unsynced")
	}

	strict := newTestStore(t, queuecore.SyncStrict, "q")
	if err := strict.Apply(ctx, insert(1, "q", "a")); err != nil {
		t.Fatal(err)
	}
	if err := strict.Apply(ctx, lease(1, "a")); err != nil {
		t.Fatal(err)
	}
	if dirty(strict) {
		t.Fatal("SyncStrict left a lease to the timer")
	}
}
