package main

import (
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// quietGC stops the Go runtime's periodic collection while the daemon is
// idle, and hands the heap back to the normal collector at its first
// allocation burst.
//
// The runtime collects at least every two minutes, even when nothing
// allocates. On an idle daemon each such collection wakes its threads,
// and the runtime's monitor then polls for a while: tens of context
// switches per collection (docs/performance-history.md, "An idle daemon's
// wake-ups"), so that a minute's wake-ups of an idle daemon depended on
// whether such a collection fell in it.
//
// A collection that comes at least idleGap after the one before is taken
// for that periodic one: the daemon is idle, or allocates too little for
// the heap to grow to its goal in that time. The proportional collector is then switched
// off (as GOGC=off, which also stops the periodic collections), and a
// memory limit of what the runtime holds now plus some headroom keeps
// the heap bounded: an allocation burst past it makes the runtime
// collect, and the first collection in the quiet state puts the collector
// and the memory limit back as they were. So an idle daemon makes one
// periodic collection after its work stops, then none.
//
// A daemon whose quiet limit would be above the limit it has (a memory
// budget's, nearly reached) is left as it is.
//
// The same idle collection gives back what the work left behind, before
// the limit is set from what the runtime then holds: release (the store's
// caches, and what the C allocator keeps of them), then the free pages of
// the Go heap (debug.FreeOSMemory). Without it, an idle daemon kept
// several MiB more after a burst of work than after its mount, for as
// long as it stayed idle (docs/performance-history.md, "Memory an idle
// daemon keeps after its work"). It costs no wake-up of its own: it rides on
// the periodic collection, so it comes up to two minutes after the work.
type quietGC struct {
	idleGap time.Duration
	log     *slog.Logger
	rt      gcRuntime
	release func()      // nil: nothing but the Go heap to give back
	stopped atomic.Bool // the hook ends at the next collection (tests)

	mu         sync.Mutex
	lastCycle  time.Time
	lastAllocs uint64
	quiet      bool
	gcPercent  int   // the collector's setting before the quiet state
	limit      int64 // the memory limit before the quiet state
}

// gcRuntime is what quietGC reads and sets in the runtime (a fake in
// tests).
type gcRuntime interface {
	now() time.Time
	// read returns the bytes allocated on the heap since the start and
	// the bytes the runtime holds from the OS (mapped, not released).
	read() (allocs, held uint64)
	setGCPercent(int) int
	setMemoryLimit(int64) int64
	// freeOSMemory collects and returns the heap's free pages to the OS.
	freeOSMemory()
}

// Defaults: the periodic collection comes two minutes after the last
// one, and a gap of 100 s is taken for it. There is no test of the bytes
// allocated in the gap: the first periodic collection after work counts
// what the work allocated after its last collection. The quiet state's
// limit is what the runtime holds plus an eighth of it (at least 4 MiB),
// so that the runtime's scavenger, which aims at 95% of the limit, has
// nothing to return.
const (
	quietIdleGap      = 100 * time.Second
	quietHeadroomMin  = 4 << 20
	quietHeadroomFrac = 8
)

// startQuietGC starts the hook on the daemon's runtime. It runs for the
// life of the process; release (nil for none) is called at each idle
// collection.
func startQuietGC(log *slog.Logger, release func()) *quietGC {
	q := &quietGC{idleGap: quietIdleGap, log: log, rt: newRealGCRuntime(), release: release}
	q.lastCycle = q.rt.now()
	q.lastAllocs, _ = q.rt.read()
	q.arm()
	return q
}

// gcSentinel is garbage from the moment it is made: its finalizer runs
// after the next collection. The pointer keeps it out of the runtime's
// tiny-object blocks, whose finalizers may never run.
type gcSentinel struct{ _ *byte }

func (q *quietGC) arm() {
	runtime.SetFinalizer(&gcSentinel{}, func(*gcSentinel) {
		if q.stopped.Load() {
			return
		}
		q.cycle()
		q.arm()
	})
}

// cycle runs after each collection.
func (q *quietGC) cycle() {
	now := q.rt.now()
	allocs, held := q.rt.read()
	q.mu.Lock()
	defer q.mu.Unlock()
	gap, alloc := now.Sub(q.lastCycle), allocs-q.lastAllocs
	q.lastCycle, q.lastAllocs = now, allocs
	if q.quiet {
		// The memory limit made the runtime collect: the daemon works again.
		q.rt.setGCPercent(q.gcPercent)
		q.rt.setMemoryLimit(q.limit)
		q.quiet = false
		q.log.Debug("garbage collector back to normal", "allocated_kib", alloc>>10)
		return
	}
	if gap < q.idleGap {
		return
	}
	// Called from the finalizer before the next sentinel is armed, so the
	// collection freeOSMemory makes does not count as a cycle.
	if q.release != nil {
		q.release()
	}
	q.rt.freeOSMemory()
	heldBefore := held
	q.lastAllocs, held = q.rt.read()
	q.log.Debug("idle: memory given back", "held_kib_before", heldBefore>>10, "held_kib_after", held>>10)
	prevPercent := q.rt.setGCPercent(-1)
	if prevPercent < 0 {
		return // GOGC=off already: nothing periodic to stop, and no setting to restore
	}
	prevLimit := q.rt.setMemoryLimit(-1)
	limit := int64(held + max(quietHeadroomMin, held/quietHeadroomFrac))
	if limit > prevLimit {
		// Near a memory budget's limit: with GOGC off the heap would grow
		// to that limit before the next collection, past where the
		// proportional collector would have run. Stay as is.
		q.rt.setGCPercent(prevPercent)
		return
	}
	q.rt.setMemoryLimit(limit)
	q.gcPercent, q.limit, q.quiet = prevPercent, prevLimit, true
	q.log.Debug("idle: periodic garbage collection stopped", "idle_for", gap.Round(time.Second), "memory_limit_mib", limit>>20)
}

// setMemoryLimit sets the Go heap's soft limit that the daemon works
// under (a memory budget's, which may change while it runs): at once, or,
// in the quiet state, as the limit that the end of it puts back.
func (q *quietGC) setMemoryLimit(limit int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.quiet {
		q.limit = limit
		return
	}
	q.rt.setMemoryLimit(limit)
}

// realGCRuntime is the process's runtime.
type realGCRuntime struct {
	mu      sync.Mutex
	samples []metrics.Sample
}

func newRealGCRuntime() *realGCRuntime {
	return &realGCRuntime{samples: []metrics.Sample{
		{Name: "/gc/heap/allocs:bytes"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}}
}

func (*realGCRuntime) now() time.Time { return time.Now() }

func (r *realGCRuntime) read() (allocs, held uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	metrics.Read(r.samples)
	v := func(i int) uint64 {
		if r.samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return r.samples[i].Value.Uint64()
	}
	return v(0), v(1) - v(2)
}

func (*realGCRuntime) setGCPercent(p int) int       { return debug.SetGCPercent(p) }
func (*realGCRuntime) setMemoryLimit(l int64) int64 { return debug.SetMemoryLimit(l) }
func (*realGCRuntime) freeOSMemory()                { debug.FreeOSMemory() }
