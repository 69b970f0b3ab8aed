package queuecore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrConflict is what a shared store returns when an update or delete finds
// the message changed since the core read it: another daemon moved it
// first. It wraps ErrNotFound, so that a caller sees "not where you said"
// (ENOENT) and never a second lease.
var ErrConflict = fmt.Errorf("%w (changed by another daemon)", ErrNotFound)

// SharedStore is a Store that several daemons, on one or several hosts,
// use at the same time (the postgres store). The core then keeps nothing
// about messages that another daemon could change without it: every
// operation is checked against the store, the timed work is done by one
// daemon at a time, and what other daemons commit reaches it as hints.
//
// On top of the Store contract:
//
//   - Apply checks revisions: an OpUpdate or OpDelete applies only if the
//     stored message still has revision Msg.Rev, and an update stores
//     revision Msg.Rev+1. Otherwise the whole batch fails with ErrConflict
//     and nothing of it is applied. Lookup, List, Due and LeaseNext return
//     each message with its current revision.
//   - Every committed batch is announced to the other daemons (Subscribe).
type SharedStore interface {
	Store

	// ReserveIDs returns the first of n consecutive message IDs that no
	// other daemon of the store will ever use.
	ReserveIDs(ctx context.Context, n int) (first uint64, err error)

	// LeaseNext takes, in one transaction, the first ready message of queue
	// in delivery order (by SortKey, then Seq) whose name is not in skip and
	// that no other transaction holds (FOR UPDATE SKIP LOCKED), stores
	// change(m) in its place (with the revision check above) and returns
	// what it stored. ErrEmpty when there is none.
	LeaseNext(ctx context.Context, queue string, skip []string, change func(Message) Message) (Message, error)

	// Subscribe registers fn to hear what other daemons commit. Changes are
	// hints: they can be late or lost, and a Change with an empty Queue
	// means "anything may have changed" (sent after the store lost and
	// regained its connection). fn is called on one goroutine and must not
	// block for long.
	Subscribe(fn func(Change))

	// CreateQueue creates a queue that must not exist yet: ErrExists when
	// another daemon made one of that name first (PutQueue would replace
	// its policy).
	CreateQueue(ctx context.Context, q QueueInfo) error
	// UpdateQueue replaces the policy and permissions of a queue that
	// exists: ErrNotFound when another daemon deleted it (PutQueue would
	// create it again, empty).
	UpdateQueue(ctx context.Context, q QueueInfo) error

	// DeleteEmptyQueue removes a queue only if it holds no message, in
	// one step against the publishes of other daemons: ErrNotEmpty when it
	// holds one, ErrNotFound when there is no such queue. A publish racing
	// it either lands first (ErrNotEmpty) or fails with ErrNotFound;
	// never is a committed message deleted with the queue.
	DeleteEmptyQueue(ctx context.Context, name string) error

	// Duty reports whether this daemon now holds the store's timed work:
	// lease expiry, the end of backoffs and delays, retention. At most one
	// daemon of a store holds it at a time; when it dies another takes it
	// over within seconds.
	Duty() bool
}

// Change is a hint from a shared store that another daemon committed a
// change. Name is empty for a change of the queue itself (created, deleted,
// new policy or owner); Queue is empty for "anything may have changed".
// The core passes queue-level changes on to its Notifier as an Event with
// an empty Name.
type Change struct {
	Queue, Name string
	From, To    State // as in Event
}

// sharedPoll bounds how long a daemon on a shared store goes without
// looking at the store by itself: a blocked Next looks again, and the
// scheduler checks its duty and the next due time, at least this often,
// so that progress never depends on a hint arriving.
const sharedPoll = time.Second

// countsTTL is how old the gauges of a shared store may be when read.
const countsTTL = time.Second

// external hears a hint from a shared store that another daemon committed
// something: it wakes blocked readers, tells the kernel, and reloads the
// queues when a queue changed.
func (c *Core) external(ch Change) {
	if c.closed.Load() {
		return
	}
	if ch.Queue == "" || ch.Name == "" {
		if err := c.reloadQueues(context.Background()); err != nil {
			c.log.Warn("reload queues from the shared store", LogErr, err)
		}
		if ch.Queue == "" {
			// Hints were lost: any queue may have ready messages now.
			c.gauges.force()
			c.sched.kick()
			c.mu.Lock()
			for _, q := range c.queues {
				q.mu.Lock()
				q.wakeReaders()
				q.mu.Unlock()
			}
			c.mu.Unlock()
		}
		return
	}
	c.mu.Lock()
	q := c.queues[ch.Queue]
	c.mu.Unlock()
	if q == nil {
		if err := c.reloadQueues(context.Background()); err != nil {
			c.log.Warn("reload queues from the shared store", LogErr, err)
		}
		return
	}
	if ch.To == StateReady {
		q.mu.Lock()
		if q.waiting > 0 {
			q.wakeReaders()
		}
		q.mu.Unlock()
	}
	if ch.To == StateDelayed {
		c.sched.kick() // its delay may end before the scheduler looks again
	}
	if c.notify != nil {
		c.notify.Notify(Event{Queue: ch.Queue, Name: ch.Name, From: ch.From, To: ch.To, ByDaemon: true, Remote: true})
	}
}

// reloadQueues makes the core's queues those of the shared store: new ones
// appear, deleted ones go (their blocked readers wake with ErrNotFound),
// and policies and owners changed elsewhere take effect.
func (c *Core) reloadQueues(ctx context.Context) error {
	c.reloadMu.Lock()
	defer c.reloadMu.Unlock()
	var infos []QueueInfo
	for try := 0; ; try++ {
		c.mu.Lock()
		gen := c.queueGen
		c.mu.Unlock()
		var err error
		if infos, err = c.store.Queues(ctx); err != nil {
			return err
		}
		c.mu.Lock()
		if c.queueGen == gen {
			break // c.mu stays held: nothing of this core's came between
		}
		c.mu.Unlock()
		// This core created, deleted or changed a queue while the store
		// was read: that read may not have it. Read again.
		if try == 4 {
			return errors.New("queues change too fast here to reload them")
		}
	}
	seen := make(map[string]bool, len(infos))
	var changed []string
	for _, info := range infos {
		seen[info.Name] = true
		p, perr := ParsePolicy(info.Policy)
		q := c.queues[info.Name]
		if perr != nil {
			if q == nil || q.policy.broken == "" {
				c.log.Error("STORED POLICY CANNOT BE LOADED: queue closed (leasing paused, publishes refused with EIO) until a valid policy is written to its .policy",
					LogQueue, info.Name, LogErr, perr)
			}
			p = brokenPolicy(perr)
		}
		if q == nil {
			if !c.creating[info.Name] {
				c.queues[info.Name] = newQueue(info, p)
				c.log.Info("queue created by another daemon", LogQueue, info.Name)
				changed = append(changed, info.Name)
			}
			continue
		}
		q.mu.Lock()
		wasPaused := q.policy.Paused
		q.info, q.policy = info, p
		if wasPaused && !p.Paused {
			q.wakeReaders()
		}
		q.mu.Unlock()
	}
	for name, q := range c.queues {
		if seen[name] {
			continue
		}
		q.mu.Lock()
		q.deleted = true
		q.wakeReaders()
		q.mu.Unlock()
		delete(c.queues, name)
		c.log.Info("queue deleted by another daemon", LogQueue, name)
		changed = append(changed, name)
	}
	c.mu.Unlock()
	c.gauges.force()
	if c.notify != nil {
		for _, name := range changed {
			c.notify.Notify(Event{Queue: name, ByDaemon: true, Remote: true}) // the kernel may cache the queue's absence
		}
	}
	return nil
}

// sharedIDs reserves message IDs in the store by blocks of idBlock, and
// makes each Seq the commit time in nanoseconds (strictly increasing
// here), so that the messages of several daemons line up by time.
type sharedIDs struct {
	store SharedStore
	clock Clock

	mu        sync.Mutex // guards next, end: the block of IDs reserved
	next, end uint64
	lastSeq   atomic.Uint64 // last Seq handed out
}

// idBlock is how many message IDs a daemon reserves at once in a shared
// store.
const idBlock = 1024

func (s *sharedIDs) newID() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next == s.end {
		first, err := s.store.ReserveIDs(context.Background(), idBlock)
		if err != nil {
			return 0, fmt.Errorf("reserve message IDs: %w", err)
		}
		s.next, s.end = first, first+idBlock
	}
	id := s.next
	s.next++
	return id, nil
}

func (s *sharedIDs) newSeq() uint64 {
	now := uint64(s.clock.Now().UnixNano())
	for {
		last := s.lastSeq.Load()
		next := max(last+1, now)
		if s.lastSeq.CompareAndSwap(last, next) {
			return next
		}
	}
}

// sharedGauges reads the gauges of every queue from a shared store when
// they are older than countsTTL: other daemons change them too. Between
// reads, this core's own commits update them as they go (applied).
type sharedGauges struct {
	c  *Core
	mu sync.Mutex // orders refreshes
	at time.Time  // when the gauges were last read; zero: read at the next refresh
}

// refresh reads the store's counts if they are older than countsTTL.
//
// A commit of this core that overlaps the read would be counted twice
// (in the store's counts, then by applied) or lost (applied, then
// overwritten by counts read before it). So the counts of a queue are
// installed only if none of this core's commits of the queue was under
// way or began between the start of the read and the install; otherwise
// the queue keeps its gauges, exact for this core's own commits, and the
// next read tries again. A queue whose commits overlap countsMaxMisses
// reads in a row takes the store's counts with this core's commits since
// the read began on top (possibly counting a commit that overlapped the
// read twice, until the next read), so that what other daemons did shows.
func (g *sharedGauges) refresh(ctx context.Context) error {
	c := g.c
	g.mu.Lock()
	defer g.mu.Unlock()
	now := c.now()
	if !g.at.IsZero() && now.Sub(g.at) < countsTTL {
		return nil
	}
	type mark struct {
		q      *queue
		begun  uint64
		busy   bool
		gauges [StateArchived + 1]Count
	}
	qs := c.queueList()
	marks := make([]mark, len(qs))
	for i, q := range qs {
		q.mu.Lock()
		marks[i] = mark{q: q, begun: q.commitsBegun, busy: q.committing > 0, gauges: q.gauges}
		q.mu.Unlock()
	}
	counts, err := c.store.Counts(ctx)
	if err != nil {
		return err
	}
	for _, mk := range marks {
		q := mk.q
		q.mu.Lock()
		clean := !mk.busy && q.commitsBegun == mk.begun
		if !clean && q.countMisses < countsMaxMisses {
			q.countMisses++
			q.mu.Unlock()
			continue
		}
		for _, s := range States {
			n := counts[q.name][s]
			if !clean {
				n.N += q.gauges[s].N - mk.gauges[s].N
				n.Bytes += q.gauges[s].Bytes - mk.gauges[s].Bytes
			}
			q.gauges[s] = n
		}
		q.countMisses = 0
		q.mu.Unlock()
	}
	g.at = now
	return nil
}

// countsMaxMisses is how many reads of a shared store's counts in a row
// may leave a queue's gauges alone because a commit overlapped them.
const countsMaxMisses = 3

func (g *sharedGauges) force() {
	g.mu.Lock()
	g.at = time.Time{}
	g.mu.Unlock()
}

func (g *sharedGauges) committing(ds []gaugeDelta) {
	for _, d := range ds {
		d.q.commitBegins()
	}
}

func (g *sharedGauges) done(ds []gaugeDelta) {
	for _, d := range ds {
		d.q.commitEnds()
	}
}

// commitBegins and commitEnds bracket a commit of this core that changes
// q's gauges, for sharedGauges.refresh.
func (q *queue) commitBegins() {
	q.mu.Lock()
	q.committing++
	q.commitsBegun++
	q.mu.Unlock()
}

func (q *queue) commitEnds() {
	q.mu.Lock()
	q.committing--
	q.mu.Unlock()
}

// sharedLeaser shares the timed work with the other daemons of the store:
// the one that holds the store's duty does it. Next leases through the
// store, and looks again every sharedPoll, since the commits of other
// daemons do not wake it.
type sharedLeaser struct {
	c  *Core
	ss SharedStore

	// The scheduler's goroutine only: the counts retention goes by, read
	// at most every sharedCountsTTL (a scan of the table), and when the
	// queues were last reloaded.
	counts     map[string]map[State]Count
	countsAt   time.Time
	reloadedAt time.Time
}

func (l *sharedLeaser) poll() time.Duration { return sharedPoll }
func (l *sharedLeaser) duty() bool          { return l.ss.Duty() }

func (l *sharedLeaser) reportDuty() *bool {
	duty := l.ss.Duty()
	return &duty
}

// backstop reloads the queues every sharedReload, for lost hints about
// queues. Every daemon does, not only the duty holder: a daemon whose
// listener is down would otherwise learn of queues other daemons made,
// changed or deleted only when its listener came back.
func (l *sharedLeaser) backstop(ctx context.Context, now time.Time) {
	if now.Sub(l.reloadedAt) < sharedReload {
		return
	}
	if err := l.c.reloadQueues(ctx); err != nil {
		l.c.log.Warn("scheduler: reload queues from the shared store", LogErr, err)
		return
	}
	l.reloadedAt = now
}

// beforeRetention reads the store's counts for retention by count (other
// daemons archive too; the gauges are left to Stats, which refreshes them
// in step with the caller).
func (l *sharedLeaser) beforeRetention(ctx context.Context, now time.Time) (map[string]map[State]Count, error) {
	return l.retentionCounts(ctx, now)
}

// With a shared store, the duty holder's retention by count reads the
// store's counts at most every sharedCountsTTL, and every daemon reloads
// its queues every sharedReload whatever the hints said.
const (
	sharedCountsTTL = 10 * time.Second
	sharedReload    = 30 * time.Second
)

func (l *sharedLeaser) retentionCounts(ctx context.Context, now time.Time) (map[string]map[State]Count, error) {
	if l.counts != nil && now.Sub(l.countsAt) < sharedCountsTTL && !l.c.sched.countsStale.Swap(false) {
		return l.counts, nil
	}
	counts, err := l.c.store.Counts(ctx)
	if err != nil {
		return nil, err
	}
	l.counts, l.countsAt = counts, now
	return counts, nil
}

// lookAgain: other daemons set deadlines this one hears of only as hints,
// and the duty must be checked: the scheduler looks again within
// sharedPoll.
func (l *sharedLeaser) lookAgain(now time.Time) time.Time { return now.Add(sharedPoll) }

// oneByOne: other daemons ack and touch due messages at the same time, and
// one conflict fails a whole batch.
func (l *sharedLeaser) oneByOne() bool { return true }

func (l *sharedLeaser) lostRace(err error) bool { return errors.Is(err, ErrNotFound) }

// pick is Next's attempt on a shared store: the store picks and leases
// the message in one transaction (FOR UPDATE SKIP LOCKED), so daemons on
// several hosts never lease one message twice. Names this daemon has an
// operation on are skipped.
func (l *sharedLeaser) pick(ctx context.Context, q *queue, consumer string, nonblock bool) (picked, error) {
	c := l.c
	q.mu.Lock()
	if err := c.nextRefused(q); err != nil {
		q.mu.Unlock()
		return picked{}, err
	}
	r := picked{wake: q.readyCh, paused: q.policy.Paused}
	p := q.policy
	var skip []string
	for k := range q.claims {
		if !k.archived {
			skip = append(skip, k.name)
		}
	}
	if !nonblock {
		q.waiting++ // before the store is asked: a commit meanwhile wakes the wait
	}
	q.mu.Unlock()
	unwait := func() {
		if !nonblock {
			q.mu.Lock()
			q.waiting--
			q.mu.Unlock()
		}
	}
	if r.paused {
		return r, nil
	}
	var b batch
	now := c.now()
	q.commitBegins() // a lease moves a message out of ready
	defer q.commitEnds()
	m, err := l.ss.LeaseNext(context.WithoutCancel(ctx), q.name, skip, func(m Message) Message {
		b = batch{}
		c.leaseOps(q, m, &p, now, consumer, &b)
		return b.ops[0].Msg
	})
	switch {
	case err == nil:
		unwait()
		c.applied(&b)
		c.finish(nil, &b)
		r.m, r.found = m, true
		return r, nil
	case errors.Is(err, ErrEmpty):
		return r, nil
	default:
		unwait()
		return picked{}, fmt.Errorf("lease from %q: %w", q.name, err)
	}
}
