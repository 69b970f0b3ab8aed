package main

import (
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
)

type fakeGCRuntime struct {
	t              time.Time
	allocs, held   uint64
	gcPercent      int
	limit          int64
	percentChanges int
	frees          int    // freeOSMemory calls
	freed          uint64 // what each gives back of held
}

func (f *fakeGCRuntime) now() time.Time              { return f.t }
func (f *fakeGCRuntime) read() (allocs, held uint64) { return f.allocs, f.held }
func (f *fakeGCRuntime) setGCPercent(p int) (old int) {
	old, f.gcPercent = f.gcPercent, p
	f.percentChanges++
	return old
}
func (f *fakeGCRuntime) setMemoryLimit(l int64) (old int64) {
	old = f.limit
	if l >= 0 {
		f.limit = l
	}
	return old
}

func (f *fakeGCRuntime) freeOSMemory() {
	f.frees++
	f.held -= min(f.held, f.freed)
}

func newFakeQuiet(gcPercent int, limit int64) (*quietGC, *fakeGCRuntime) {
	rt := &fakeGCRuntime{t: time.Unix(1000, 0), held: 10 << 20, gcPercent: gcPercent, limit: limit}
	q := &quietGC{idleGap: quietIdleGap, log: slog.New(slog.DiscardHandler), rt: rt, lastCycle: rt.t}
	return q, rt
}

func TestQuietGCStates(t *testing.T) {
	q, rt := newFakeQuiet(100, math.MaxInt64)
	releases, freesAtRelease := 0, -1
	q.release = func() { releases++; freesAtRelease = rt.frees }
	// Collections of a working daemon: one a minute at most.
	for _, step := range []struct {
		gap   time.Duration
		alloc uint64
	}{{time.Second, 8 << 20}, {30 * time.Second, 100 << 10}, {60 * time.Second, 2 << 20}} {
		rt.t, rt.allocs = rt.t.Add(step.gap), rt.allocs+step.alloc
		q.cycle()
		if q.quiet || rt.gcPercent != 100 || rt.limit != math.MaxInt64 {
			t.Fatalf("after a collection %v later with %d B allocated: quiet %v, GOGC %d, limit %d; want the normal collector",
				step.gap, step.alloc, q.quiet, rt.gcPercent, rt.limit)
		}
	}
	if releases != 0 || rt.frees != 0 {
		t.Fatalf("a working daemon gave back its memory: %d releases, %d frees", releases, rt.frees)
	}
	// The periodic collection of an idle daemon, with what the work
	// allocated after its last collection: the store's caches and the
	// heap's free pages are given back, store first, and the limit is
	// set from what the runtime holds after that.
	rt.t, rt.allocs = rt.t.Add(2*time.Minute), rt.allocs+3<<20
	rt.freed = 6 << 20
	q.cycle()
	if want := int64(4<<20 + quietHeadroomMin); !q.quiet || rt.gcPercent != -1 || rt.limit != want {
		t.Fatalf("idle: quiet %v, GOGC %d, limit %d; want quiet, -1, %d", q.quiet, rt.gcPercent, rt.limit, want)
	}
	if releases != 1 || rt.frees != 1 || freesAtRelease != 0 {
		t.Fatalf("idle: %d releases, %d frees (%d before the release); want one of each, the release first", releases, rt.frees, freesAtRelease)
	}
	// The next collection, made by the limit: back as before, and nothing
	// given back.
	rt.t, rt.allocs = rt.t.Add(time.Hour), rt.allocs+5<<20
	q.cycle()
	if q.quiet || rt.gcPercent != 100 || rt.limit != math.MaxInt64 {
		t.Fatalf("after the quiet state: quiet %v, GOGC %d, limit %d; want 100 and no limit", q.quiet, rt.gcPercent, rt.limit)
	}
	if releases != 1 || rt.frees != 1 {
		t.Fatalf("the collection that ends the quiet state gave back memory: %d releases, %d frees; want 1 and 1", releases, rt.frees)
	}

	// A daemon with a memory budget gets its own limit back; one that
	// holds nearly that limit does not go quiet at all. A large heap gets
	// an eighth of it as headroom.
	q, rt = newFakeQuiet(50, 48<<20)
	rt.t = rt.t.Add(2 * time.Minute)
	q.cycle()
	if want := int64(rt.held + quietHeadroomMin); !q.quiet || rt.limit != want {
		t.Fatalf("with a budget: quiet %v, limit %d; want quiet at %d", q.quiet, rt.limit, want)
	}
	rt.t, rt.allocs = rt.t.Add(time.Minute), rt.allocs+10<<20
	q.cycle()
	if rt.gcPercent != 50 || rt.limit != 48<<20 {
		t.Fatalf("with a budget, after: GOGC %d, limit %d; want 50 and %d", rt.gcPercent, rt.limit, 48<<20)
	}
	q, rt = newFakeQuiet(50, 48<<20)
	rt.held = 46 << 20
	rt.t = rt.t.Add(2 * time.Minute)
	q.cycle()
	if q.quiet || rt.gcPercent != 50 || rt.limit != 48<<20 {
		t.Fatalf("near the budget's limit: quiet %v, GOGC %d, limit %d; want untouched", q.quiet, rt.gcPercent, rt.limit)
	}
	q, rt = newFakeQuiet(100, math.MaxInt64)
	rt.held = 200 << 20
	rt.t = rt.t.Add(2 * time.Minute)
	q.cycle()
	if want := int64(200<<20 + 25<<20); rt.limit != want {
		t.Fatalf("large heap: limit %d, want %d", rt.limit, want)
	}

	// GOGC=off: nothing to stop, nothing to restore.
	q, rt = newFakeQuiet(-1, math.MaxInt64)
	for range 3 {
		rt.t = rt.t.Add(2 * time.Minute)
		q.cycle()
		if q.quiet || rt.gcPercent != -1 || rt.limit != math.MaxInt64 {
			t.Fatalf("GOGC=off: quiet %v, GOGC %d, limit %d; want untouched", q.quiet, rt.gcPercent, rt.limit)
		}
	}
}

// TestQuietGCOnTheRuntime runs the hook on this process's runtime, with
// every collection taken for an idle one: the first collection makes the
// state quiet (GOGC off, a memory limit), the next puts both back.
func TestQuietGCOnTheRuntime(t *testing.T) {
	oldPercent, oldLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	defer func() {
		debug.SetGCPercent(oldPercent)
		debug.SetMemoryLimit(oldLimit)
	}()
	var releases atomic.Int32
	q := &quietGC{idleGap: 0, log: slog.New(slog.DiscardHandler), rt: newRealGCRuntime(), release: func() { releases.Add(1) }}
	q.lastCycle = q.rt.now()
	q.arm()
	defer q.stopped.Store(true)
	isQuiet := func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.quiet
	}
	waitFor := func(want bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); isQuiet() != want; {
			if time.Now().After(deadline) {
				t.Fatalf("quiet = %v after a collection, want %v", !want, want)
			}
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(true)
	if releases.Load() == 0 {
		t.Fatal("quiet state without a release of the store's caches")
	}
	if l := debug.SetMemoryLimit(-1); l == math.MaxInt64 {
		t.Fatal("quiet state without a memory limit")
	}
	if p := debug.SetGCPercent(-1); p != -1 {
		t.Fatalf("quiet state with GOGC %d, want off", p)
	}
	q.mu.Lock()
	q.idleGap = time.Hour // the next collection is no idle one
	q.mu.Unlock()
	waitFor(false)
	if p := debug.SetGCPercent(100); p != 100 {
		t.Fatalf("after the quiet state: GOGC %d, want 100", p)
	}
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		t.Fatalf("after the quiet state: memory limit %d, want none", l)
	}
}
