package fusefs

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// The kernel keeps an inode (and its dentry) for every message it has
// seen, until its own memory runs short; go-fuse keeps a node for each
// inode the kernel holds, so the daemon's memory grew with every message
// published through the mount and still waiting (what each costs:
// docs/performance-history.md, "Memory with a backlog"). Two things bound
// it:
//
//   - the pruner: past Options.MaxMessageInodes message nodes, it asks the
//     kernel to forget the least recently used ones, the messages published
//     last first (see trackNew) (FUSE_NOTIFY_PRUNE,
//     Linux 6.18); the kernel drops those nobody uses and sends FORGET,
//     and go-fuse frees the node. Why this notification cannot wedge a
//     killed daemon the way entry invalidations did: docs/fusefs.md.
//   - the memory budget (Options.MemoryBudget): near it the daemon sheds
//     what it caches and prunes harder; at it, it refuses new messages
//     with ENOSPC until it is back under.

// DefaultMaxMessageInodes is how many message inodes the kernel may keep
// before the pruner asks it to forget some. A backlog up to that size is
// consumed without a LOOKUP per lease; what the nodes cost, and what a
// smaller bound cost the leases of a burst: docs/performance-history.md.
const DefaultMaxMessageInodes = 4096

// Memory levels, as fractions of the budget, in percent: at shedPct the
// daemon sheds its caches and prunes down to a small set of inodes; at
// fullPct it refuses new messages, until it is back under resumePct.
const (
	shedPct   = 70
	fullPct   = 90
	resumePct = 80
	calmPct   = 60
)

// nodeLRU lists the message nodes the kernel may hold, least recently
// used first. The links live in the nodes (msgNode.lru), two pointers each.
type nodeLRU struct {
	mu         sync.Mutex
	head, tail *msgNode
	n          int
	kick       chan struct{} // wakes the pruner when n passes the limit
}

// lruLinks are a message node's place in nodeLRU.
type lruLinks struct {
	prev, next *msgNode
	in         bool
	stale      bool // found forgotten by go-fuse once: dropped the next time
}

// track puts n at the most recently used end.
func (f *FS) track(n *msgNode) { f.put(n, false) }

// trackNew puts n, the file of a message being published, at the least
// recently used end: past the limit, the messages published last are
// forgotten first. A queue is consumed oldest first, so those are the
// ones its consumers name last; forgetting the oldest instead, as plain
// LRU order would, forgets each message just before its lease needs it,
// and every lease of a backlog larger than the limit then costs a
// LOOKUP. A node looked up, or found again (track), goes to the recently
// used end as before.
func (f *FS) trackNew(n *msgNode) { f.put(n, true) }

// put moves n to one end of the list (the least recently used one if
// first) and wakes the pruner when the list is past the limit.
func (f *FS) put(n *msgNode, first bool) {
	l := &f.lru
	l.mu.Lock()
	added := !n.lru.in
	if !added {
		l.unlinkLocked(n)
	}
	l.pushLocked(n, first)
	over := l.n > f.inodeLimit()
	l.mu.Unlock()
	if added {
		f.wakeMemWatch() // a new node: the daemon holds more
	}
	if over {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// untrack drops n (the kernel forgot it).
func (f *FS) untrack(n *msgNode) {
	l := &f.lru
	l.mu.Lock()
	if n.lru.in {
		l.unlinkLocked(n)
	}
	l.mu.Unlock()
}

// pushLocked puts n at the recently used end of the list, or at the
// least recently used end (the one the pruner takes from) if first.
func (l *nodeLRU) pushLocked(n *msgNode, first bool) {
	n.lru = lruLinks{in: true}
	switch {
	case l.head == nil:
		l.head, l.tail = n, n
	case first:
		n.lru.next = l.head
		l.head.lru.prev = n
		l.head = n
	default:
		n.lru.prev = l.tail
		l.tail.lru.next = n
		l.tail = n
	}
	l.n++
}

func (l *nodeLRU) unlinkLocked(n *msgNode) {
	if n.lru.prev != nil {
		n.lru.prev.lru.next = n.lru.next
	} else {
		l.head = n.lru.next
	}
	if n.lru.next != nil {
		n.lru.next.lru.prev = n.lru.prev
	} else {
		l.tail = n.lru.prev
	}
	n.lru = lruLinks{}
	l.n--
}

// MessageInodes is how many message nodes the daemon holds for the kernel.
func (f *FS) MessageInodes() int {
	f.lru.mu.Lock()
	defer f.lru.mu.Unlock()
	return f.lru.n
}

// inodeLimit is the pruner's limit: Options.MaxMessageInodes, an eighth of
// it under memory pressure.
func (f *FS) inodeLimit() int {
	limit := f.opts.MaxMessageInodes
	if limit <= 0 {
		return int(^uint(0) >> 1) // no limit
	}
	if f.pressure.Load() {
		limit = max(limit/8, 64)
	}
	return limit
}

// pruneBatch bounds one notification (the kernel reads 512 ids at a time).
const pruneBatch = 2048

// prune runs until Stop: when more message nodes than the limit are
// held, it asks the kernel to forget the least recently used ones, down
// to three quarters of the limit.
//
// It runs in a goroutine of its own and holds no lock of the daemon while
// it writes the notification, so no FUSE request ever waits for it.
func (f *FS) prune(root *fs.Inode) {
	defer f.wg.Done()
	// An idle daemon must not wake: the pruner waits for a kick (a node
	// past the limit, memory pressure), and looks again after a second
	// only while its last look left more nodes than the limit (the kernel
	// keeps the inodes of open files).
	var again <-chan time.Time
	for {
		select {
		case <-f.done:
			return
		case <-again:
		case <-f.lru.kick:
		}
		again = nil
		nodes := f.pruneCandidates(f.inodeLimit())
		if f.lru.len() > f.inodeLimit() {
			again = time.After(time.Second)
		}
		if len(nodes) == 0 {
			continue
		}
		errno := root.NotifyPrune(nodes)
		f.pruned.Add(int64(len(nodes)))
		if errno == syscall.ENOSYS {
			f.log.Warn("the kernel cannot be asked to forget inodes (FUSE_NOTIFY_PRUNE needs Linux 6.18): the daemon's memory grows with the messages the kernel caches",
				"max_message_inodes", f.opts.MaxMessageInodes)
			return
		}
		if errno != 0 {
			f.log.Debug("prune notification failed", queuecore.LogErr, errno, "nodes", len(nodes))
		}
		// At most one notification per pruneGap: inodes the kernel keeps
		// (open files) come round again, and must not cost a notification
		// per message published.
		select {
		case <-f.done:
			return
		case <-time.After(pruneGap):
		}
	}
}

// pruneGap is the shortest time between two prune notifications.
const pruneGap = 20 * time.Millisecond

// pruneCandidates picks the least recently used message nodes past three
// quarters of limit and moves them to the recently used end: a node the
// kernel keeps because it is in use (an open file) is asked about again
// only after the others. Files being written are skipped, and nodes
// go-fuse has dropped without a FORGET are taken off the list.
func (f *FS) pruneCandidates(limit int) []*fs.Inode {
	l := &f.lru
	l.mu.Lock()
	if l.n <= limit {
		l.mu.Unlock()
		return nil
	}
	want := min(l.n-limit*3/4, pruneBatch)
	picked := make([]*msgNode, 0, want)
	for i := 0; i < want && l.head != nil; i++ {
		n := l.head
		stale := n.lru.stale
		l.unlinkLocked(n)
		if stale {
			continue // forgotten by go-fuse without a FORGET (see below)
		}
		l.pushLocked(n, false)
		picked = append(picked, n)
	}
	l.mu.Unlock()
	nodes := make([]*fs.Inode, 0, len(picked))
	for _, n := range picked {
		n.mu.Lock()
		writing := n.pend != nil && !n.pend.done // a refused or deduplicated file is settled: it may go
		n.mu.Unlock()
		if writing {
			continue
		}
		// A node made for a LOOKUP that go-fuse answered with an inode it
		// already had never reaches the kernel and never gets a FORGET.
		// Forgotten is also true for a moment before a new node joins the
		// tree, so a node is dropped only when found so twice.
		//lint:ignore SA1019 OnForget is never called for such a node; Forgotten is what tells it
		if n.Inode.Forgotten() {
			l.mu.Lock()
			if n.lru.in {
				n.lru.stale = true
			}
			l.mu.Unlock()
			continue
		}
		nodes = append(nodes, &n.Inode)
	}
	return nodes
}

// watchMemory runs until Stop when a budget is set: it reads the daemon's
// RSS twice a second and moves between the levels (see shedPct).
//
// An idle daemon must not wake twice a second (each look wakes several
// threads: docs/performance-history.md, "An idle daemon's wake-ups"). After memWatchCalmLooks looks under the
// calm level with the RSS steady (within 1% of the budget over them), the
// watcher parks until what the daemon holds grows: a new message
// (memoryFull), a draft's buffer, a new message node (a lookup; the pruner
// bounds their number on its own). A create that wakes it looks at the
// RSS itself.
//
// Without a budget (none yet: FollowBudget may give one later) it parks
// the same way, and a create that finds a budget wakes it.
func (f *FS) watchMemory() {
	defer f.wg.Done()
	t := time.NewTicker(memWatchEvery)
	defer func() { t.Stop() }()
	var lastFree time.Time
	var st steadiness
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
		}
		f.followBudget()
		budget := f.budget.Load()
		rss := readRSS()
		if budget > 0 {
			if rss <= 0 {
				continue
			}
			calm := rss*100/budget < calmPct && !f.pressure.Load() && !f.full.Load()
			st.look(rss, budget, calm)
		} else {
			st.looks = memWatchCalmLooks // no budget (yet): nothing to watch
		}
		if st.looks >= memWatchCalmLooks {
			t.Stop()
			if !f.parkMemWatch() {
				return
			}
			st = steadiness{}
			t = time.NewTicker(memWatchEvery)
			// Look at once: the daemon holds more than when it parked.
			f.followBudget()
			if budget = f.budget.Load(); budget <= 0 {
				continue
			}
			if rss = readRSS(); rss <= 0 {
				continue
			}
		}
		f.memoryLevels(rss, budget, &lastFree)
	}
}

// steadiness counts the memory watcher's calm looks in a row with the RSS
// within 1% of the budget of the first of them, so that slow growth does
// not count as steady.
type steadiness struct {
	looks int
	from  int64 // the RSS at the first of the steady looks
}

func (s *steadiness) look(rss, budget int64, calm bool) {
	switch d := rss - s.from; {
	case !calm:
		s.looks = 0
	case s.looks > 0 && d < budget/100 && -d < budget/100:
		s.looks++
	default:
		s.looks, s.from = 1, rss
	}
}

// parkMemWatch parks the memory watcher until wakeMemWatch; false when the
// filesystem stops meanwhile.
func (f *FS) parkMemWatch() bool {
	f.memParked.Store(true)
	select {
	case <-f.done:
		return false
	case <-f.memWake:
		return true
	}
}

// memoryLevels moves between the levels for one look at the RSS: shedding
// (with a cache shed and a return of free memory to the system at most
// every 5 s, after which it looks again) and refusing new messages.
func (f *FS) memoryLevels(rss, budget int64, lastFree *time.Time) {
	pct := rss * 100 / budget
	switch {
	case pct >= shedPct && !f.pressure.Load():
		f.pressure.Store(true)
		f.log.Warn("memory near the budget: shedding caches and pruning inodes harder",
			"rss_mib", rss>>20, "budget_mib", budget>>20)
		select {
		case f.lru.kick <- struct{}{}:
		default:
		}
	case pct < calmPct && f.pressure.Load():
		f.pressure.Store(false)
		f.log.Info("memory back under the budget's lower mark", "rss_mib", rss>>20, "budget_mib", budget>>20)
	}
	if f.pressure.Load() && time.Since(*lastFree) > 5*time.Second {
		*lastFree = time.Now()
		if f.core != nil {
			f.core.ShedCaches()
		}
		debug.FreeOSMemory()
		rss = readRSS()
		pct = rss * 100 / budget
	}
	switch {
	case pct >= fullPct && !f.full.Load():
		f.full.Store(true)
		f.refused.Store(0)
		f.log.Error("memory at the budget: new messages are refused with ENOSPC until it is back under",
			"rss_mib", rss>>20, "budget_mib", budget>>20)
	case pct < resumePct && f.full.Load():
		f.full.Store(false)
		f.log.Warn("memory back under the budget: new messages are accepted again",
			"rss_mib", rss>>20, "budget_mib", budget>>20, "refused", f.refused.Load())
	}
}

// How often the memory watcher looks, and after how many calm, steady
// looks it parks (watchMemory).
const (
	memWatchEvery     = 500 * time.Millisecond
	memWatchCalmLooks = 4
)

// wakeMemWatch wakes a parked memory watcher, and reports whether this
// call did. Cheap when it is not parked: one atomic load.
func (f *FS) wakeMemWatch() bool {
	if !f.memParked.Load() || f.budget.Load() <= 0 || !f.memParked.CompareAndSwap(true, false) {
		return false
	}
	select {
	case f.memWake <- struct{}{}:
	default:
	}
	return true
}

// growDrafts is draftBytes.grow, waking a parked memory watcher when the
// bytes held grow.
func (f *FS) growDrafts(uid uint32, delta int64) bool {
	if !f.drafts.grow(&f.opts, uid, delta) {
		return false
	}
	if delta > 0 {
		f.wakeMemWatch()
	}
	return true
}

// memoryFull says whether a new message must be refused (ENOSPC). It
// wakes a parked memory watcher; the create that wakes it looks at the
// RSS itself, since the watcher's look comes after it.
func (f *FS) memoryFull() bool {
	f.followBudget()
	budget := f.budget.Load()
	if budget <= 0 {
		return false
	}
	if f.wakeMemWatch() {
		if rss := readRSS(); rss > 0 && rss*100/budget >= fullPct {
			f.refused.Add(1)
			return true
		}
	}
	if f.full.Load() {
		f.refused.Add(1)
		return true
	}
	return false
}

// readRSS returns the resident set size of this process in bytes, or 0.
func readRSS() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// followBudget asks Options.FollowBudget for the budget, at most once a
// second (a look reads /proc/self/cgroup and a limit file or two), and
// takes a new one: the watcher then measures against it, creates are
// refused at its 90%, and a small one trims the request buffers
// (trimWrite). It costs a clock read on every call.
func (f *FS) followBudget() {
	follow := f.opts.FollowBudget
	if follow == nil {
		return
	}
	now := time.Now().UnixNano()
	last := f.budgetAt.Load()
	if now-last < int64(time.Second) || !f.budgetAt.CompareAndSwap(last, now) {
		return
	}
	budget := follow()
	old := f.budget.Swap(budget)
	if budget == old {
		return
	}
	trim := f.maxWrite > smallMaxWrite && smallBudgetFor(budget)
	f.trimWrites.Store(trim)
	if budget <= 0 {
		f.pressure.Store(false)
		f.full.Store(false)
	}
	f.log.Warn("memory budget changed with the cgroup's memory limit", "budget_mib", budget>>20, "was_mib", old>>20, "trim_write_buffers", trim)
	if f.opts.BudgetChanged != nil {
		f.opts.BudgetChanged(budget)
	}
	if budget > 0 && (old <= 0 || budget < old) {
		// Give back at once what the buffers and caches hold beyond
		// what is in use: the pool's request buffers go with a collection.
		debug.FreeOSMemory()
	}
	f.wakeMemWatch()
}

// trimWrite gives the kernel back the pages of a request buffer that a
// WRITE of data filled, once its bytes are copied: under a small budget
// (smallBudgetFor) on a mount made with 1 MiB requests. The kernel's
// max_write is agreed once, at the mount, so the requests stay up to
// 1 MiB; what shrinks is what the buffers keep resident, back to the
// pages that requests of at most smallMaxWrite touch. The buffer is
// go-fuse's, reused for the next request, whose read(2) fills it anew:
// MADV_DONTNEED only drops bytes already copied (the next touch of a
// page gets a zeroed one). A []byte holds no pointers, so the garbage
// collector never reads it.
func (f *FS) trimWrite(data []byte) {
	if len(data) <= smallMaxWrite || !f.trimWrites.Load() {
		return
	}
	page := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	end := start + uintptr(len(data))
	from := (start + smallMaxWrite + page - 1) &^ (page - 1) // the first smallMaxWrite stay: every request uses them
	to := end &^ (page - 1)
	if to <= from {
		return
	}
	_ = unix.Madvise(data[from-start:to-start], unix.MADV_DONTNEED)
}

// memState is the FS's part of the above.
type memState struct {
	budget     atomic.Int64 // the memory budget now (Options.MemoryBudget, then FollowBudget)
	budgetAt   atomic.Int64 // when FollowBudget was last asked (unix ns)
	trimWrites atomic.Bool  // trimWrite gives back request buffer pages
	maxWrite   int          // the mount's max_write
	lru        nodeLRU
	pressure   atomic.Bool  // at shedPct: caches shed, inodes pruned harder
	full       atomic.Bool  // at fullPct: new messages refused
	refused    atomic.Int64 // creates refused since full
	pruned     atomic.Int64 // inodes the kernel was asked to forget
	// memParked: the memory watcher waits on memWake (watchMemory).
	memParked atomic.Bool
	memWake   chan struct{}
}

// appendMemoryMetrics adds the daemon's memory figures to MOUNT/.metrics.
func (f *FS) appendMemoryMetrics(b []byte) []byte {
	full := 0
	if f.full.Load() {
		full = 1
	}
	b = fmt.Appendf(b, "# HELP yirangmq_message_inodes Message inodes the kernel holds (a node each in the daemon).\n# TYPE yirangmq_message_inodes gauge\nyirangmq_message_inodes %d\n", f.MessageInodes())
	b = fmt.Appendf(b, "# HELP yirangmq_pruned_inodes_total Message inodes the kernel was asked to forget.\n# TYPE yirangmq_pruned_inodes_total counter\nyirangmq_pruned_inodes_total %d\n", f.pruned.Load())
	b = fmt.Appendf(b, "# HELP yirangmq_rss_bytes Resident memory of the daemon.\n# TYPE yirangmq_rss_bytes gauge\nyirangmq_rss_bytes %d\n", readRSS())
	b = fmt.Appendf(b, "# HELP yirangmq_memory_budget_bytes The memory budget (0: none).\n# TYPE yirangmq_memory_budget_bytes gauge\nyirangmq_memory_budget_bytes %d\n", f.budget.Load())
	trim := 0
	if f.trimWrites.Load() {
		trim = 1
	}
	b = fmt.Appendf(b, "# HELP yirangmq_write_buffers_trimmed 1 while the pages of a request buffer past what a small budget's requests use are given back after each write.\n# TYPE yirangmq_write_buffers_trimmed gauge\nyirangmq_write_buffers_trimmed %d\n", trim)
	b = fmt.Appendf(b, "# HELP yirangmq_memory_full 1 while new messages are refused for memory.\n# TYPE yirangmq_memory_full gauge\nyirangmq_memory_full %d\n", full)
	parked := 0
	if f.memParked.Load() {
		parked = 1
	}
	b = fmt.Appendf(b, "# HELP yirangmq_memory_watch_parked 1 while the memory watcher sleeps until the next new message (calm and steady).\n# TYPE yirangmq_memory_watch_parked gauge\nyirangmq_memory_watch_parked %d\n", parked)
	return b
}

// len is the number of message nodes on the list.
func (l *nodeLRU) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}
