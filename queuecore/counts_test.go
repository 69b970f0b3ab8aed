package queuecore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"yirangmq/queuecore"
)

// hookStore is a shared store that runs a test's function at two points
// that a commit of the core can fall between: just after a batch is
// committed (before Apply returns, so before the core's gauges have it),
// and just after the store's counts are read (before the core installs
// them). Only calls made with a context from hooked take a hook: the
// core's scheduler reads the counts too (retention, once its duty is
// held), and a hook it took would run the test's commit beside the
// test's own read instead of inside it.
type hookStore struct {
	queuecore.SharedStore
	afterApply  atomic.Pointer[func()]
	afterCounts atomic.Pointer[func()]
}

type hookKey struct{}

// hooked marks ctx as the test's: its calls may take a hook.
func hooked(ctx context.Context) context.Context { return context.WithValue(ctx, hookKey{}, true) }

func (h *hookStore) Apply(ctx context.Context, ops []queuecore.Op) error {
	err := h.SharedStore.Apply(ctx, ops)
	if ctx.Value(hookKey{}) == nil {
		return err
	}
	if f := h.afterApply.Swap(nil); err == nil && f != nil {
		(*f)()
	}
	return err
}

func (h *hookStore) Counts(ctx context.Context) (map[string]map[queuecore.State]queuecore.Count, error) {
	counts, err := h.SharedStore.Counts(ctx)
	if ctx.Value(hookKey{}) == nil {
		return counts, err
	}
	if f := h.afterCounts.Swap(nil); f != nil {
		(*f)()
	}
	return counts, err
}

// TestSharedGaugesOverlappingCommit: a read of a shared store's counts
// that overlaps a commit of this core neither loses that commit from the
// gauges nor counts it twice. The fake clock stands still, so the gauges
// are read from the store only when the test forces it (SettledStats):
// whatever a wrong read installs would stay.
func TestSharedGaugesOverlappingCommit(t *testing.T) {
	var hs *hookStore
	e := postgresEnv(t, func(st queuecore.Store) queuecore.Store {
		hs = &hookStore{SharedStore: st.(queuecore.SharedStore)}
		return hs
	})
	e.ctx = hooked(e.ctx)
	e.queue("jobs", "")
	e.publish("jobs", "a", "1")
	e.publish("jobs", "b", "2")
	equal(t, "ready at start", e.settledStats("jobs").Ready, int64(2))

	// Committed after the counts were read, applied before they are
	// installed: the install must not drop it.
	published := make(chan error, 1)
	after := func() {
		_, err := e.core.Publish(e.ctx, "jobs", "c", []byte("3"), queuecore.PublishOptions{})
		published <- err
	}
	hs.afterCounts.Store(&after)
	equal(t, "ready read with c committed in between (c may or may not show)", e.settledStats("jobs").Ready >= 2, true)
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	equal(t, "ready once c is applied", e.stats("jobs").Ready, int64(3))
	equal(t, "ready read again", e.settledStats("jobs").Ready, int64(3))

	// Committed before the counts are read, applied after they are
	// installed: the install must not count it twice.
	committed, applyNow := make(chan struct{}), make(chan struct{})
	hold := func() {
		close(committed)
		<-applyNow
	}
	hs.afterApply.Store(&hold)
	go func() {
		_, err := e.core.Publish(e.ctx, "jobs", "d", []byte("4"), queuecore.PublishOptions{})
		published <- err
	}()
	<-committed
	equal(t, "ready read with d committed, not applied (d may or may not show)", e.settledStats("jobs").Ready >= 3, true)
	close(applyNow)
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	equal(t, "ready once d is applied", e.stats("jobs").Ready, int64(4))
	equal(t, "ready read again", e.settledStats("jobs").Ready, int64(4))
}

// TestSharedGaugesBusyQueue: a queue whose every read of the counts
// overlaps a commit of this core keeps its own count for three reads,
// then takes the store's, so that another daemon's publish shows however
// busy this core is, and its own commits are still counted once.
func TestSharedGaugesBusyQueue(t *testing.T) {
	var hs *hookStore
	e := postgresEnv(t, func(st queuecore.Store) queuecore.Store {
		hs = &hookStore{SharedStore: st.(queuecore.SharedStore)}
		return hs
	})
	e.ctx = hooked(e.ctx)
	e.queue("jobs", "")
	e.publish("jobs", "a", "1")
	equal(t, "ready at start", e.settledStats("jobs").Ready, int64(1))

	// Another daemon on the same store publishes one.
	other, err := postgresOpener(t)(e.ctx, e.dir, queuecore.SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	oc, err := queuecore.Open(e.ctx, other, queuecore.Options{Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	if _, err := oc.Publish(e.ctx, "jobs", "remote", []byte("r"), queuecore.PublishOptions{}); err != nil {
		t.Fatal(err)
	}

	// Every read overlaps a publish of this core.
	for i, want := range []int64{2, 3, 4, 6} {
		name := fmt.Sprintf("local-%d", i)
		during := func() {
			if _, err := e.core.Publish(e.ctx, "jobs", name, []byte("l"), queuecore.PublishOptions{}); err != nil {
				t.Error(err)
			}
		}
		hs.afterCounts.Store(&during)
		equal(t, fmt.Sprintf("ready after overlapped read %d", i+1), e.settledStats("jobs").Ready, want)
	}
	equal(t, "ready read again, nothing overlapping", e.settledStats("jobs").Ready, int64(6))
}
