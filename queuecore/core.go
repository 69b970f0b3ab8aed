package queuecore

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Event tells a Notifier that a message changed place.
type Event struct {
	// Name is empty for a queue that another daemon of a shared store
	// created or deleted.
	Queue, Name string
	From, To    State // 0: the message did not exist before / does not exist after
	// ByDaemon is true when the core moved the message by itself (lease
	// expiry, backoff due, retention) or as a side effect (fanout copies,
	// forwards, validation failures kept in dlq/), not as the direct
	// result of the caller's own request.
	ByDaemon bool
	// Remote is set (with ByDaemon) when another daemon of a shared store
	// made the change: the Notifier hears of it from the store's hints,
	// on the goroutine that delivers them, which it should not hold up.
	Remote bool
}

// Notifier hears about moves. Notify is called once the operation's store
// commit is done and its claims and locks are released, on the goroutine
// of the operation (a request, or the scheduler for expiry, backoff and
// retention). It must not block for long, and never on the kernel: a
// daemon thread waiting on a lock the kernel holds for a client can keep
// a killed daemon from ever exiting.
type Notifier interface {
	Notify(Event)
}

// Options configure a Core.
type Options struct {
	Clock    Clock        // nil: SystemClock
	Notifier Notifier     // nil: none
	Logger   *slog.Logger // nil: discard
	// Backend and StorePath describe the store in daemon stats.
	Backend, StorePath string
	Version            string
	// Disk is the file system under the store (backends/disk): the
	// free-space floor is measured there and the reserve file kept there
	// (space.go). nil turns the floor off (a database server's store).
	Disk Disk
	// MinFree is the free-space floor in bytes: 0 for the default
	// (DefaultMinFree of the filesystem's size), -1 for none.
	MinFree int64
}

// Core is a set of queues on one store.
type Core struct {
	store   Store
	clock   Clock
	notify  Notifier
	log     *slog.Logger
	opts    Options
	started time.Time

	// What depends on other daemons sharing the store, chosen in Open
	// (mode.go).
	ids    idSource
	gauges gaugeSource
	leaser leaser
	names  nameSource

	// shared is the store again when several daemons use it (nil for a
	// store of this process alone); see shared.go.
	shared   SharedStore
	reloadMu sync.Mutex // one reloadQueues at a time

	randMu sync.Mutex
	rand   *bufio.Reader // crypto/rand, buffered: see newMessageID

	mu       sync.Mutex // guards queues, creating and queueGen; never held across a commit
	queues   map[string]*queue
	creating map[string]bool // names of queues being created
	// queueGen counts this core's own changes of queues (create, delete,
	// policy and owner), so that a reload from a shared store that read
	// the store before one of them does not undo it (reloadQueues).
	queueGen uint64

	sched *scheduler
	// timed counts the leased and delayed messages of a store of this
	// daemon alone, from the gauges: when it falls to zero the scheduler
	// drops a timer armed for a deadline that no message has any more
	// (scheduler.noDeadlines), so an idle daemon does not wake for an
	// acked lease. Unused on a shared store.
	timed  atomic.Int64
	space  *space // nil without Options.Disk
	closed atomic.Bool
	done   chan struct{}
	wg     sync.WaitGroup
}

// Open loads the queues of store and starts the timer that runs lease
// expiry, backoff and retention. The store stays the caller's: Close does
// not close it.
func Open(ctx context.Context, store Store, opts Options) (*Core, error) {
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Core{
		store: store, clock: opts.Clock, notify: opts.Notifier, log: opts.Logger, opts: opts,
		queues: map[string]*queue{}, creating: map[string]bool{}, done: make(chan struct{}),
		rand: bufio.NewReaderSize(rand.Reader, 4096),
	}
	c.started = c.clock.Now()
	if err := c.openCounters(ctx); err != nil {
		return nil, fmt.Errorf("open queue core: %w", err)
	}
	if err := c.loadQueues(ctx); err != nil {
		return nil, fmt.Errorf("open queue core: %w", err)
	}
	c.sched = newScheduler(c)
	c.applyHandChanges(ctx)
	if c.shared != nil {
		c.shared.Subscribe(c.external)
		// What other daemons changed between the load above and the
		// subscription was not heard: read the queues once more.
		if err := c.reloadQueues(ctx); err != nil {
			return nil, fmt.Errorf("open queue core: %w", err)
		}
	}
	c.wg.Add(1)
	go c.sched.run()
	c.sched.kick()
	if opts.Disk != nil {
		c.space = newSpace(c, opts.Disk, opts.MinFree)
		c.space.loadReserve()
		c.wg.Add(1)
		go c.space.run()
	}
	return c, nil
}

// openCounters picks the IDs, gauges, leaser and names for the store: a
// shared store's are the database's, a local store's the core's own.
func (c *Core) openCounters(ctx context.Context) error {
	if ss, ok := c.store.(SharedStore); ok {
		c.shared = ss
		c.ids = &sharedIDs{store: ss, clock: c.clock}
		c.gauges = &sharedGauges{c: c, at: c.now()}
		c.leaser = &sharedLeaser{c: c, ss: ss}
		c.names = sharedNames{store: c.store}
		return nil
	}
	maxID, err := c.store.MaxID(ctx)
	if err != nil {
		return err
	}
	ids := &localIDs{}
	ids.last.Store(maxID)
	c.ids, c.gauges, c.leaser, c.names = ids, localGauges{}, localLeaser{c}, localNames{c}
	return nil
}

// loadQueues reads the store's queues, their policies and counts.
func (c *Core) loadQueues(ctx context.Context) error {
	infos, err := c.store.Queues(ctx)
	if err != nil {
		return err
	}
	counts, err := c.store.Counts(ctx)
	if err != nil {
		return err
	}
	for _, info := range infos {
		p, err := ParsePolicy(info.Policy)
		if err != nil {
			// A policy the store kept but this version rejects: the queue
			// fails closed, never silently on defaults (which would accept
			// what its schema refuses, drop its fanout, resume it).
			c.log.Error("STORED POLICY CANNOT BE LOADED: queue closed (leasing paused, publishes refused with EIO) until a valid policy is written to its .policy",
				LogQueue, info.Name, LogErr, err)
			p = brokenPolicy(err)
		}
		q := newQueue(info, p)
		live := int64(0)
		for s, n := range counts[info.Name] {
			if s.Valid() {
				q.gauges[s] = n
				if s == StateLeased || s == StateDelayed {
					c.timed.Add(n.N)
				}
				if s.Live() {
					live += n.N
				}
			}
		}
		if err := c.names.opened(ctx, q, live); err != nil {
			return err
		}
		c.queues[info.Name] = q
	}
	return nil
}

// queueList is the queues open now, to work on one at a time without
// holding the core's lock.
func (c *Core) queueList() []*queue {
	c.mu.Lock()
	defer c.mu.Unlock()
	qs := make([]*queue, 0, len(c.queues))
	for _, q := range c.queues {
		qs = append(qs, q)
	}
	return qs
}

// Close stops the timer and wakes every blocked Next with ErrClosed.
// Operations under way finish; later ones fail with ErrClosed.
func (c *Core) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	close(c.done)
	c.wg.Wait()
	c.mu.Lock()
	for _, q := range c.queues {
		q.mu.Lock()
		q.wakeReaders()
		q.mu.Unlock()
	}
	c.mu.Unlock()
	return nil
}

func (c *Core) now() time.Time { return c.clock.Now() }

// newID hands out a message ID.
func (c *Core) newID() (uint64, error) { return c.ids.newID() }

// newSeq hands out the Seq of a message entering inbox/.
func (c *Core) newSeq() uint64 { return c.ids.newSeq() }

// queue returns a live queue or ErrNotFound.
func (c *Core) queue(name string) (*queue, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	c.mu.Lock()
	q := c.queues[name]
	c.mu.Unlock()
	if q == nil {
		return nil, fmt.Errorf("queue %q: %w", name, ErrNotFound)
	}
	return q, nil
}

// QueueNames lists the queues, sorted.
func (c *Core) QueueNames() []string {
	c.mu.Lock()
	names := make([]string, 0, len(c.queues))
	for n := range c.queues {
		names = append(names, n)
	}
	c.mu.Unlock()
	sort.Strings(names)
	return names
}

// QueueInfo returns a queue's name, owner, mode and creation time.
func (c *Core) QueueInfo(name string) (QueueInfo, error) {
	q, err := c.queue(name)
	if err != nil {
		return QueueInfo{}, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.info, nil
}

// CreateQueue makes a queue with the default policy.
func (c *Core) CreateQueue(ctx context.Context, name string, uid, gid, mode uint32) error {
	if err := CheckQueueName(name); err != nil {
		return err
	}
	if c.closed.Load() {
		return ErrClosed
	}
	// Reserve the name, then commit with no lock held: c.mu is taken by
	// every operation of every queue, so it must never wait on an fsync.
	c.mu.Lock()
	if c.queues[name] != nil || c.creating[name] {
		c.mu.Unlock()
		return fmt.Errorf("queue %q: %w", name, ErrExists)
	}
	c.creating[name] = true
	c.mu.Unlock()
	p := DefaultPolicy()
	info := QueueInfo{Name: name, Policy: p.StoredJSON(), UID: uid, GID: gid, Mode: mode & 0o7777, CreatedAt: c.now()}
	put := c.store.PutQueue
	if c.shared != nil {
		put = c.shared.CreateQueue // another daemon may have made it meanwhile
	}
	err := put(context.WithoutCancel(ctx), info)
	c.mu.Lock()
	delete(c.creating, name)
	if err == nil {
		q := newQueue(info, p)
		c.names.created(q)
		c.queues[name] = q
		c.queueGen++
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("create queue %q: %w", name, err)
	}
	c.log.Info("queue created", LogQueue, name)
	return nil
}

// DeleteQueue removes a queue. Unless force, it must hold no message in
// any state (ErrNotEmpty); with force its messages go with it.
func (c *Core) DeleteQueue(ctx context.Context, name string, force bool) error {
	q, err := c.queue(name)
	if err != nil {
		return err
	}
	if !force {
		// Other daemons of a shared store fill it too: look at the store,
		// not at old gauges.
		c.gauges.force()
		if err := c.gauges.refresh(ctx); err != nil {
			return fmt.Errorf("delete queue %q: %w", name, err)
		}
	}
	q.mu.Lock()
	if !force && !q.emptyLocked() {
		q.mu.Unlock()
		return fmt.Errorf("queue %q: %w", name, ErrNotEmpty)
	}
	q.deleted = true // new operations now fail with ErrNotFound
	q.wakeReaders()
	for len(q.claims) > 0 { // let operations under way finish
		var ch chan struct{}
		for _, ch = range q.claims {
			break
		}
		q.mu.Unlock()
		<-ch
		q.mu.Lock()
	}
	if !force && !q.emptyLocked() {
		// Something committed while the operations under way finished.
		q.deleted = false
		q.mu.Unlock()
		return fmt.Errorf("queue %q: %w", name, ErrNotEmpty)
	}
	q.mu.Unlock()
	del := c.store.DeleteQueue
	if c.shared != nil && !force {
		del = c.shared.DeleteEmptyQueue // other daemons may publish into it meanwhile
	}
	if err := del(context.WithoutCancel(ctx), name); err != nil {
		q.mu.Lock()
		q.deleted = false
		q.mu.Unlock()
		return fmt.Errorf("delete queue %q: %w", name, err)
	}
	c.mu.Lock()
	delete(c.queues, name)
	c.queueGen++
	c.mu.Unlock()
	if c.shared == nil {
		q.mu.Lock()
		timed := q.gauges[StateLeased].N + q.gauges[StateDelayed].N
		q.mu.Unlock()
		if timed != 0 && c.timed.Add(-timed) == 0 {
			c.sched.noDeadlines()
		}
	}
	c.log.Info("queue deleted", LogQueue, name, "force", force)
	return nil
}

// SetQueueOwner changes a queue directory's owner and mode (chown, chmod).
func (c *Core) SetQueueOwner(ctx context.Context, name string, uid, gid, mode uint32) error {
	q, err := c.queue(name)
	if err != nil {
		return err
	}
	return c.updateQueue(ctx, q, func(info *QueueInfo, _ *Policy) error {
		info.UID, info.GID, info.Mode = uid, gid, mode&0o7777
		return nil
	})
}

// Policy returns a queue's policy in effect.
func (c *Core) Policy(name string) (Policy, error) {
	q, err := c.queue(name)
	if err != nil {
		return Policy{}, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.policy, nil
}

// SetPolicy replaces a queue's policy with the document data. An invalid
// document is an *InputError and leaves the old policy in place; it is not
// logged here (the filesystem layer logs it with its writer and records it
// with NotePolicyRefusal).
func (c *Core) SetPolicy(ctx context.Context, name string, data []byte) error {
	p, err := ParsePolicy(data)
	for _, f := range p.Fanout {
		if err != nil {
			break
		}
		if f == name {
			err = &InputError{Field: "policy field fanout", Msg: "a queue cannot fan out to itself"}
		} else if _, qerr := c.queue(f); qerr != nil {
			err = &InputError{Field: "policy field fanout", Msg: "no queue named " + quote(f)}
		}
	}
	if err == nil {
		// What is stored must load again under the same limits: check the
		// stored form now rather than find out at the next mount.
		// (Its schema was compiled just now: the same schema, compact.)
		if _, lerr := parsePolicy(p.StoredJSON(), false); lerr != nil {
			err = &InputError{Field: "policy", Msg: "its stored form would not load: " + lerr.Error()}
		}
	}
	if err != nil {
		return err // the caller logs it, naming who wrote it
	}
	q, err := c.queue(name)
	if err != nil {
		return err
	}
	if err := c.updateQueue(ctx, q, func(_ *QueueInfo, old *Policy) error {
		*old = p
		return nil
	}); err != nil {
		return err
	}
	q.policyAccepted()
	return nil
}

// SetPaused pauses or resumes leasing on a queue (publishing goes on).
func (c *Core) SetPaused(ctx context.Context, name string, paused bool) error {
	q, err := c.queue(name)
	if err != nil {
		return err
	}
	return c.updateQueue(ctx, q, func(_ *QueueInfo, p *Policy) error {
		if p.broken != "" {
			return fmt.Errorf("queue %q: %w", name, ErrPolicyBroken)
		}
		p.Paused = paused
		return nil
	})
}

// updateQueue changes a queue's record. Updates of one queue are ordered
// by q.updMu; q.mu is not held across the commit, so the queue's own
// operations, the scheduler and other queues never wait on its fsync.
func (c *Core) updateQueue(ctx context.Context, q *queue, change func(*QueueInfo, *Policy) error) error {
	q.updMu.Lock()
	defer q.updMu.Unlock()
	q.mu.Lock()
	if q.deleted {
		q.mu.Unlock()
		return fmt.Errorf("queue %q: %w", q.name, ErrNotFound)
	}
	info, p := q.info, q.policy
	q.mu.Unlock()
	if err := change(&info, &p); err != nil {
		return err
	}
	if p.broken == "" {
		info.Policy = p.StoredJSON()
	} // else keep the stored document as it is: defaults must not replace it
	put := c.store.PutQueue
	if c.shared != nil {
		put = c.shared.UpdateQueue // another daemon may have deleted it meanwhile
	}
	if err := put(context.WithoutCancel(ctx), info); err != nil {
		return fmt.Errorf("update queue %q: %w", q.name, err)
	}
	c.mu.Lock()
	q.mu.Lock()
	wasPaused := q.policy.Paused
	q.info, q.policy = info, p
	if wasPaused && !p.Paused {
		q.wakeReaders()
	}
	q.mu.Unlock()
	c.queueGen++
	c.mu.Unlock()
	c.sched.kick() // retention may have changed
	return nil
}

// queue is one queue's in-memory state: its record, gauges, counters,
// claims and blocked readers. Messages themselves live in the store.
type queue struct {
	name    string     // never changes; read without a lock
	updMu   sync.Mutex // orders updates of info and policy
	mu      sync.Mutex
	info    QueueInfo
	policy  Policy
	deleted bool

	// claims are the names with an operation under way; the channel is
	// closed when it ends.
	claims map[claimKey]chan struct{}
	// inserting counts publishes under way, for maxReady.
	inserting int64
	gauges    [StateArchived + 1]Count

	// readyCh is closed (and replaced) whenever a message may have become
	// ready or leasable, to wake blocked Next calls; waiting counts them.
	readyCh chan struct{}
	waiting int

	dedup map[string]time.Time // dedup key → commit time

	names nameCache // what this core knows of its live names: see namecache.go

	counters counters
	rates    rates
	refused  refusals // the last refusals (refusals.go)

	// With a shared store, for sharedGauges.refresh: how many of this core's
	// batches that change the gauges are being committed, how many have
	// begun, and how many reads of the store's counts in a row a commit
	// overlapped.
	committing   int
	commitsBegun uint64
	countMisses  int
}

type claimKey struct {
	name     string
	archived bool
}

func newQueue(info QueueInfo, p Policy) *queue {
	return &queue{
		name: info.Name, info: info, policy: p,
		claims:  map[claimKey]chan struct{}{},
		readyCh: make(chan struct{}),
		dedup:   map[string]time.Time{},
	}
}

// emptyLocked reports whether the queue holds no message and none is
// being published into it. q.mu must be held.
func (q *queue) emptyLocked() bool {
	for _, s := range States {
		if q.gauges[s].N > 0 {
			return false
		}
	}
	return q.inserting == 0
}

// wakeReaders wakes every blocked Next. q.mu must be held.
func (q *queue) wakeReaders() {
	close(q.readyCh)
	q.readyCh = make(chan struct{})
}
