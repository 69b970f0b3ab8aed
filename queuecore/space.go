package queuecore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A full disk must never freeze a queue. A store that runs out of space
// refuses every write, leases and acks included, and nothing inside the
// mount can free space any more: the queue is frozen until a person makes
// room. So the core keeps a free-space floor under its store (RabbitMQ's
// disk alarm is the model): below it publishes are refused with
// ErrDiskLow, while leases, acks, nacks, dead-lettering, redrives,
// deletes and purges go on in the room the floor keeps, and drain the
// backlog. Under the floor the core also
//   - gives the store's reserve file back (space.reserve, preallocated in
//     the store's directory), so that draining has room even when something
//     outside the store filled the disk;
//   - asks the store to give space back (SpaceReclaimer: a WAL checkpoint,
//     a journal compaction) and to finish work a full disk stalled;
//   - trims the archive, oldest first, and acks delete instead of archiving.
//
// When space is back (free at least floor plus reserve) the reserve file
// is made again; publishes are admitted again as soon as free space is
// above the floor, checked at every publish and every spaceTick.

// SpaceReclaimer is a Store that can give space back when the disk is
// low (checkpoint and shrink a write-ahead log, compact a journal) and
// that puts off, rather than fails on, work a full disk stopped (body
// files, a checkpoint). Reclaim is called about once a second: urgent
// while free space is under the floor or just after a write failed for
// lack of space, when the store should free what it can; otherwise only
// to retry what was put off, which must cost nothing when there is none.
// It must be safe to call at any time.
type SpaceReclaimer interface {
	Reclaim(ctx context.Context, urgent bool) error
}

// Disk is the host's side of the floor: the file system under the store,
// as the core asks it (backends/disk is the real one; tests fake it). The
// core decides when space is short and what to free; a Disk only does the
// system calls.
type Disk interface {
	// Path names where the store is, for the log and .stats.
	Path() string
	// Free returns the bytes free to the daemon and the file system's size.
	Free() (free, total int64, err error)
	// Reserve gives the reserve file size bytes of real blocks; on failure
	// it holds none.
	Reserve(size int64) error
	// Release gives the reserve's blocks back to the file system.
	Release() error
	// Reserved is how many bytes of real blocks the reserve holds now
	// (one an earlier run made).
	Reserved() int64
	// ReservePath names the reserve file, for the log.
	ReservePath() string
}

// SpaceReuser is a Store that keeps free pages inside its own files (the
// SQLite freelist): space a publish takes before the filesystem's, so it
// counts as free against the floor.
type SpaceReuser interface {
	ReusableBytes(ctx context.Context) int64
}

// Floor defaults: a tenth of the filesystem, at least 2 MiB and at most
// 64 MiB, and never more than half the filesystem (a tiny one still takes
// publishes).
const (
	minFreeFloorLow  = 2 << 20
	minFreeFloorHigh = 64 << 20
	spaceTick        = 200 * time.Millisecond
	maxReserve       = 16 << 20
	trimBatch        = 128
)

// floorHeadroom is how far above the floor free space must be again to
// end a low: a quarter of the floor. A low that ended at the floor itself
// would refuse the next publish again (a publisher flapping between OK and
// ENOSPC, and the archive trim stopping at the floor so that it goes on
// flapping while the archive could still give way).
func floorHeadroom(floor int64) int64 { return floor / 4 }

// lowUntil is the free space that ends a low: the floor, its headroom and
// the publish that was refused.
func (sp *space) lowUntil(floor int64) int64 {
	return floor + floorHeadroom(floor) + sp.refusedSize.Load()
}

// DefaultMinFree is the floor for a filesystem of total bytes.
func DefaultMinFree(total int64) int64 {
	f := min(max(total/10, minFreeFloorLow), minFreeFloorHigh)
	return min(f, total/2)
}

// DiskStats is the free-space state of the store's filesystem (in
// MOUNT/.stats as "disk").
type DiskStats struct {
	Path         string `json:"path"`
	FreeBytes    int64  `json:"free_bytes"` // free to us, including space the store reuses
	TotalBytes   int64  `json:"total_bytes"`
	MinFreeBytes int64  `json:"min_free_bytes"`
	ReserveBytes int64  `json:"reserve_bytes"` // held in space.reserve now
	// Low is true from when free space goes under the floor until it is a
	// quarter of the floor above it again: publishes are refused with
	// ENOSPC.
	Low                   bool  `json:"low"`
	PublishesRefusedTotal int64 `json:"publishes_refused_total"`
	ArchiveTrimmedTotal   int64 `json:"archive_trimmed_total"`
	LowEventsTotal        int64 `json:"low_events_total"`
}

// space watches the filesystem under the store.
type space struct {
	c       *Core
	disk    Disk
	minFree int64 // the floor; 0 until the first measure when defaulted
	auto    bool  // minFree follows the filesystem's size

	free, total  atomic.Int64
	measuredAt   atomic.Int64 // of free, unix ns
	sinceMeasure atomic.Int64 // bytes admitted since
	reusable     atomic.Int64
	reserveHeld  atomic.Int64
	low          atomic.Bool
	refused      atomic.Int64
	refusedSize  atomic.Int64 // bytes of the last publish refused for the floor
	trimmed      atomic.Int64
	lowEvents    atomic.Int64
	pressure     atomic.Bool // a store write failed for lack of space: reclaim at the next tick
	mu           sync.Mutex  // one tick at a time
	reserveMu    sync.Mutex  // making or freeing space.reserve (a commit frees it too)
	noteMu       sync.Mutex
	noted        map[string]*notedKind // note: last line per kind
	lastReclaim  time.Time
	reserveFails int

	// An idle daemon must not wake the machine: once a tick finds no
	// commit since the one before (and the disk above its floor), run
	// waits for the next commit (kick). Publishes and stats reads measure
	// by themselves when the last measure is older than admitFresh.
	commits atomic.Uint64
	idle    atomic.Bool
	kick    chan struct{}
}

// newSpace starts watching disk; minFree < 0 turns the floor off but
// keeps the watch (stats, reclaim after a failed write).
func newSpace(c *Core, disk Disk, minFree int64) *space {
	sp := &space{c: c, disk: disk, minFree: minFree, auto: minFree == 0, kick: make(chan struct{}, 1)}
	if minFree < 0 {
		sp.minFree = 0
	}
	return sp
}

// floor is the free-space floor in bytes (0: none).
func (sp *space) floor() int64 {
	if sp.auto {
		return DefaultMinFree(sp.total.Load())
	}
	return sp.minFree
}

// measure reads the free space now. The reserve file's blocks are the
// store's own: they count as free.
func (sp *space) measure() (int64, error) {
	free, total, err := sp.disk.Free()
	if err != nil {
		return 0, err
	}
	sp.total.Store(total)
	free += sp.reusable.Load() + sp.reserveHeld.Load()
	sp.free.Store(free)
	sp.sinceMeasure.Store(0)
	sp.measuredAt.Store(time.Now().UnixNano())
	return free, nil
}

// admitFresh is how long a measure serves publishes far from the floor
// (twice the floor and more): a statfs(2) per publish would cost a few
// percent of a publish through the mount, so those go by the last
// measure less what was admitted since. Near the floor every publish
// measures. A disk filled at once from outside is thus seen within
// admitFresh; meanwhile the store itself still fails a commit that does
// not fit.
const admitFresh = 100 * time.Millisecond

// admit checks a publish of n bytes against the floor: at create (n = 0)
// and again just before its commit.
func (sp *space) admit(n int64) error {
	floor := sp.floor()
	if floor <= 0 {
		return nil
	}
	if time.Now().UnixNano()-sp.measuredAt.Load() < int64(admitFresh) && sp.free.Load()-sp.sinceMeasure.Add(n) >= 2*floor {
		return nil // far from the floor: the last measure will do
	}
	free, err := sp.measure()
	if err != nil {
		return nil // no measure, no refusal: the store itself will tell
	}
	if free-n < floor || sp.low.Load() && free < sp.lowUntil(floor) {
		sp.refused.Add(1)
		if !sp.low.Load() || n > sp.refusedSize.Load() {
			sp.refusedSize.Store(n) // a create refused while low (n = 0) keeps the size a commit was refused for
		}
		sp.setLow(true, free, floor)
		return fmt.Errorf("%w: %d bytes free, floor %d, publishes accepted again from %d free", ErrDiskLow, free, floor, sp.lowUntil(floor))
	}
	// Accepted (again): the stats and the log say so from this publish
	// on, not from the next tick.
	sp.setLow(false, free, floor)
	return nil
}

// setLow records a crossing of the floor with one log line.
func (sp *space) setLow(low bool, free, floor int64) {
	// Every admitted publish calls this: a load, not a write, when
	// nothing changes.
	if sp.low.Load() == low || sp.low.Swap(low) == low {
		return
	}
	if low {
		sp.wake()
		sp.lowEvents.Add(1)
		sp.note(slog.LevelWarn, "free space under the store is below the floor: publishes refused with ENOSPC until it is back; consumers go on",
			"path", sp.disk.Path(), "free_bytes", free, "min_free_bytes", floor)
	} else {
		sp.note(slog.LevelInfo, "free space under the store is back above the floor: publishes accepted again",
			"path", sp.disk.Path(), "free_bytes", free, "min_free_bytes", floor)
	}
}

// noteWriteError is told of every failed store write: one that failed for
// lack of space makes the next tick give the reserve back and reclaim.
func (sp *space) noteWriteError(err error) {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		sp.pressure.Store(true)
		sp.wake()
	}
}

// relieve is called by a commit that failed for lack of space and puts no
// new message in: it gives the reserve back at once, so that a drain that
// found the disk full (filled from outside) succeeds when tried again.
// It reports whether a retry may succeed.
func (sp *space) relieve(ctx context.Context, err error) bool {
	if !(errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)) {
		return false
	}
	sp.pressure.Store(true)
	sp.wake()
	return sp.dropReserve()
}

// run ticks until the core closes: every spaceTick while commits come;
// once a tick has seen none (and the disk is above its floor), only at the
// next commit. An idle daemon has no timer here: a publish measures for
// itself when the last measure is older than admitFresh, and so does a
// read of the stats, so nothing waits on a tick that idling skipped.
func (sp *space) run() {
	defer sp.c.wg.Done()
	t := time.NewTimer(spaceTick)
	defer t.Stop()
	sp.tick()
	last := sp.commits.Load()
	for {
		select {
		case <-sp.c.done:
			return
		case <-t.C:
		case <-sp.kick:
			t.Stop() // Go 1.23 timers: no stale value to drain
		}
		sp.idle.Store(false)
		sp.tick()
		now := sp.commits.Load()
		if now == last && !sp.low.Load() && !sp.pressure.Load() {
			sp.idle.Store(true)
			if sp.commits.Load() == now {
				last = now
				continue // no timer: the next commit kicks
			}
			sp.idle.Store(false)
		}
		last = now
		t.Reset(spaceTick)
	}
}

// committed tells run that the store changed, waking it if it idles.
func (sp *space) committed() {
	sp.commits.Add(1)
	sp.wake()
}

// wake makes an idle run tick now: after a commit, and when a publish
// found the disk under its floor or a write failed for lack of space
// while no commit came (then only the tick trims the archive and gives
// the reserve back, and it ticks on while the disk stays low).
func (sp *space) wake() {
	if sp.idle.Load() && sp.idle.CompareAndSwap(true, false) {
		select {
		case sp.kick <- struct{}{}:
		default:
		}
	}
}

// tick measures, crosses the floor either way, and under it frees what it
// can: the reserve, the store's reclaimable space, the archive.
func (sp *space) tick() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	ctx := context.Background()
	if r, ok := sp.c.store.(SpaceReuser); ok {
		sp.reusable.Store(r.ReusableBytes(ctx))
	}
	free, err := sp.measure()
	if err != nil {
		return
	}
	floor := sp.floor()
	pressure := sp.pressure.Swap(false)
	// Under the floor, or low and not yet back above its headroom with room
	// for the publish that was refused: a store that gives nothing back by
	// itself (the fs store) would otherwise sit at the floor, refusing
	// every publish while the archive it could trim stays whole.
	below := floor > 0 && (free < floor || sp.low.Load() && free < sp.lowUntil(floor))
	if !below && !pressure {
		sp.setLow(false, free, floor)
		sp.keepReserve(free, floor)
		// Near the floor the store is asked to give space back already
		// (a WAL checkpoint), so that the floor is not met early.
		sp.reclaim(ctx, free < 2*floor, false)
		return
	}
	if below {
		sp.setLow(true, free, floor)
	}
	// Draining needs room first: the reserve goes once what is really
	// free is under half the floor, or at once after a failed write.
	raw := free - sp.reserveHeld.Load() - sp.reusable.Load()
	if sp.reserveHeld.Load() > 0 && (pressure || raw < floor/2) {
		sp.dropReserve()
	}
	sp.reclaim(ctx, true, pressure)
	if below {
		sp.trimArchive(ctx, floor)
	}
}

// reclaim asks the store to give space back (urgent) or to retry what a
// full disk put off, at most once a second unless a write just failed.
func (sp *space) reclaim(ctx context.Context, urgent, now bool) {
	s, ok := sp.c.store.(SpaceReclaimer)
	if !ok || (!now && time.Since(sp.lastReclaim) < time.Second) {
		return
	}
	sp.lastReclaim = time.Now()
	if err := s.Reclaim(ctx, urgent); err != nil {
		sp.note(slog.LevelWarn, "store could not give space back yet", "path", sp.disk.Path(), LogErr, err)
	}
}

// reserveSize is how much space.reserve holds: half the floor, at most
// maxReserve.
func (sp *space) reserveSize(floor int64) int64 {
	return min(floor/2, maxReserve) &^ 4095
}

// keepReserve makes the reserve file once there is room for it above the
// floor.
func (sp *space) keepReserve(free, floor int64) {
	want := sp.reserveSize(floor)
	if want <= 0 || sp.reserveHeld.Load() >= want || free-sp.reserveHeld.Load() < floor+want || sp.reserveFails > 3 {
		return
	}
	sp.reserveMu.Lock()
	defer sp.reserveMu.Unlock()
	if err := sp.disk.Reserve(want); err != nil {
		sp.reserveFails++
		sp.note(slog.LevelWarn, "cannot make the space reserve", "path", sp.disk.ReservePath(), LogErr, err)
		return
	}
	sp.reserveHeld.Store(want)
	sp.note(slog.LevelInfo, "space reserve in place", "path", sp.disk.ReservePath(), "bytes", want)
}

// dropReserve gives the reserve's space back to the filesystem; it
// reports whether there was any.
func (sp *space) dropReserve() bool {
	sp.reserveMu.Lock()
	defer sp.reserveMu.Unlock()
	held := sp.reserveHeld.Swap(0)
	if held == 0 {
		return false
	}
	if err := sp.disk.Release(); err != nil {
		sp.note(slog.LevelWarn, "cannot free the space reserve", "path", sp.disk.ReservePath(), LogErr, err)
		return false
	}
	sp.note(slog.LevelWarn, "disk short: space reserve given back to let consumers drain", "path", sp.disk.ReservePath(), "bytes", held)
	return true
}

// loadReserve counts a reserve file left by an earlier run.
func (sp *space) loadReserve() { sp.reserveHeld.Store(sp.disk.Reserved()) }

// trimArchive deletes archived messages, oldest first across every queue,
// one batch per tick while free space is under the floor.
func (sp *space) trimArchive(ctx context.Context, floor int64) {
	c := sp.c
	type old struct {
		q  *queue
		m  Message
		at time.Time
	}
	var cand []old
	for _, name := range c.QueueNames() {
		q, err := c.queue(name)
		if err != nil {
			continue
		}
		q.mu.Lock()
		n := q.gauges[StateArchived].N
		q.mu.Unlock()
		if n == 0 {
			continue
		}
		_ = c.store.List(ctx, name, StateArchived, func(m Message) bool {
			cand = append(cand, old{q, m, m.StateAt})
			return len(cand)%trimBatch != 0
		})
	}
	if len(cand) == 0 {
		return
	}
	sort.Slice(cand, func(i, j int) bool { return cand[i].at.Before(cand[j].at) })
	cand = cand[:min(len(cand), trimBatch)]
	claims := make([]claim, len(cand))
	for i, o := range cand {
		claims[i] = claim{o.q, claimKey{name: o.m.Name, archived: true}}
	}
	if err := c.acquire(claims); err != nil {
		return
	}
	var b batch
	for _, o := range cand {
		if m, err := c.lookup(ctx, o.q, StateArchived, o.m.Name); err == nil && m.ID == o.m.ID {
			b.remove(o.q, m)
		}
	}
	n := len(b.ops)
	err := c.commit(ctx, &b)
	c.finish(claims, &b)
	if err != nil {
		sp.note(slog.LevelWarn, "could not trim the archive on a low disk", LogErr, err)
		return
	}
	sp.trimmed.Add(int64(n))
	sp.note(slog.LevelWarn, "disk low: archive trimmed, oldest first", "messages", n, "oldest_acked_at", cand[0].at.UTC().Format(time.RFC3339),
		"archive_trimmed_total", sp.trimmed.Load(), "min_free_bytes", floor)
}

// noteEvery is how often one kind of free-space line is logged: at the
// floor, publishes and drains can cross it back and forth several times a
// second, and the log is on that disk, often.
const noteEvery = 10 * time.Second

// note logs a free-space line, at most one per kind (message) per
// noteEvery; the next one logged says how many were left out.
func (sp *space) note(level slog.Level, msg string, args ...any) {
	now := time.Now()
	sp.noteMu.Lock()
	if sp.noted == nil {
		sp.noted = map[string]*notedKind{}
	}
	k := sp.noted[msg]
	if k == nil {
		k = &notedKind{}
		sp.noted[msg] = k
	}
	if !k.at.IsZero() && now.Sub(k.at) < noteEvery {
		k.skipped++
		sp.noteMu.Unlock()
		return
	}
	k.at = now
	if k.skipped > 0 {
		args = append(args, "suppressed", k.skipped)
		k.skipped = 0
	}
	sp.noteMu.Unlock()
	sp.c.log.Log(context.Background(), level, msg, args...)
}

type notedKind struct {
	at      time.Time
	skipped int
}

// stats is the DiskStats snapshot.
func (sp *space) stats() *DiskStats {
	if time.Now().UnixNano()-sp.measuredAt.Load() >= int64(admitFresh) {
		// An idle daemon does not tick: measure for the reader (on error,
		// the last measure), and a disk found under its floor wakes the
		// tick as a refused publish would.
		if free, err := sp.measure(); err == nil {
			if floor := sp.floor(); floor > 0 && free < floor {
				sp.setLow(true, free, floor)
			}
		}
	}
	return &DiskStats{
		Path: sp.disk.Path(), FreeBytes: sp.free.Load(), TotalBytes: sp.total.Load(), MinFreeBytes: sp.floor(),
		ReserveBytes: sp.reserveHeld.Load(), Low: sp.low.Load(), PublishesRefusedTotal: sp.refused.Load(),
		ArchiveTrimmedTotal: sp.trimmed.Load(), LowEventsTotal: sp.lowEvents.Load(),
	}
}
