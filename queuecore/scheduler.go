package queuecore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// scheduler runs everything that happens at a time rather than on a
// request: lease expiry, the end of a backoff or delay, and retention. One
// goroutine and one timer for the whole core, armed for the earliest due
// time the store knows; it sleeps when nothing is due.
type scheduler struct {
	c      *Core
	kickCh chan struct{}

	// countsStale is set by a commit of this core that may have put an
	// archive over its limit: the next run reads the counts again.
	countsStale atomic.Bool

	mu      sync.Mutex
	armedAt time.Time // when the timer fires; zero when no timer is armed
	timer   Timer
	// running is true while a run reads the store and acts; its arm
	// ends it.
	running bool
	// stopped: the core is closed; no timer is armed any more.
	stopped bool
	// untimed is when the last run wanted to look again for something
	// other than a message's deadline (retention, another daemon): zero
	// for never. noDeadlines re-arms for it.
	untimed time.Time
}

// dueBatch bounds the work of one commit of the scheduler.
const dueBatch = 256

// busyRetry is how soon the scheduler looks again at a due message that an
// operation held (say, an ack racing the expiry).
const busyRetry = 10 * time.Millisecond

func newScheduler(c *Core) *scheduler {
	return &scheduler{c: c, kickCh: make(chan struct{}, 1)}
}

// kick makes the scheduler look at the store now.
func (s *scheduler) kick() {
	select {
	case s.kickCh <- struct{}{}:
	default:
	}
}

// wakeBy makes sure the scheduler wakes no later than t. Between runs
// it arms the timer for t itself: no run is needed to learn what a
// commit has just said. While a run is under way it kicks another, since
// that run may have read the store's next due time before this commit.
func (s *scheduler) wakeBy(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.armedAt.IsZero() && !t.Before(s.armedAt) {
		return
	}
	if s.running {
		s.kick()
		return
	}
	s.armLocked(t)
}

func (s *scheduler) run() {
	defer s.c.wg.Done()
	for {
		select {
		case <-s.kickCh:
		case <-s.c.done:
			s.mu.Lock()
			s.armLocked(time.Time{})
			s.stopped = true
			s.mu.Unlock()
			return
		}
		// While work runs, every new deadline must kick again: it may come
		// after work read the store's next due time.
		s.mu.Lock()
		s.armedAt, s.running = time.Time{}, true
		s.mu.Unlock()
		next, untimed := s.work()
		s.mu.Lock()
		s.untimed, s.running = untimed, false
		s.armLocked(next)
		s.mu.Unlock()
	}
}

// noDeadlines runs when a commit of this daemon leaves no message leased
// or delayed (Core.timed) in a store of this daemon alone. A timer armed
// for the deadline of a message since acked would wake an idle daemon
// for nothing: it is re-armed for what else the last run waits for.
//
// Core.timed is checked again under s.mu. A commit that adds a deadline
// adds to Core.timed before its wakeBy takes s.mu: either this sees the
// new count and keeps the timer, or that wakeBy finds the timer dropped
// and arms it again. While a run is under way nothing changes: its arm
// may then wake once for a deadline gone meanwhile.
func (s *scheduler) noDeadlines() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c.timed.Load() != 0 || s.running || s.armedAt.IsZero() || s.armedAt.Equal(s.untimed) {
		return
	}
	s.armLocked(s.untimed)
}

// armLocked sets the timer for next (none when zero). s.mu is held.
func (s *scheduler) armLocked(next time.Time) {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.armedAt = next
	if next.IsZero() || s.stopped {
		return
	}
	d := max(next.Sub(s.c.now()), 0)
	s.timer = s.c.clock.AfterFunc(d, s.kick)
}

// work does what is due and returns when to look again (zero: never,
// until kicked), and when to look again if no message had a deadline.
func (s *scheduler) work() (next, untimed time.Time) {
	c := s.c
	ctx := context.Background()
	now := c.now()
	c.leaser.backstop(ctx, now)
	if !c.leaser.duty() {
		t := c.leaser.lookAgain(now) // another daemon does it; look again for a takeover
		return t, t
	}
	soonest := func(t time.Time) {
		next, untimed = earliest(next, t), earliest(untimed, t)
	}
	busy := false
	expired := 0
	for {
		due, err := c.store.Due(ctx, now, dueBatch)
		if err != nil {
			c.log.Error("scheduler: read due messages", LogErr, err)
			return now.Add(time.Second), now.Add(time.Second)
		}
		n, held := s.handleDue(ctx, due, now)
		expired += n
		busy = busy || held > 0
		if len(due) < dueBatch || n == 0 {
			break
		}
	}
	if expired > 0 {
		c.log.Debug("scheduler moved due messages", "count", expired)
	}
	counts, err := c.leaser.beforeRetention(ctx, now)
	if err != nil {
		c.log.Error("scheduler: read counts", LogErr, err)
		return now.Add(time.Second), now.Add(time.Second)
	}
	for _, name := range c.QueueNames() {
		q, err := c.queue(name)
		if err != nil {
			continue
		}
		archived := int64(-1) // the gauge
		if counts != nil {
			archived = counts[name][StateArchived].N
		}
		t, held := s.retention(ctx, q, now, archived)
		soonest(t)
		busy = busy || held
	}
	if t, ok, err := c.store.NextDue(ctx); err != nil {
		c.log.Error("scheduler: read next due time", LogErr, err)
		soonest(now.Add(time.Second))
	} else if ok {
		next = earliest(next, t) // a message's deadline: not untimed
	}
	if busy {
		soonest(now.Add(busyRetry))
	}
	soonest(c.leaser.lookAgain(now))
	return next, untimed
}

// earliest returns the earlier of a and b, a zero time being never.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// tryClaim reserves one name without waiting.
func tryClaim(cl claim) bool {
	cl.q.mu.Lock()
	defer cl.q.mu.Unlock()
	if _, busy := cl.q.claims[cl.k]; busy || cl.q.deleted {
		return false
	}
	cl.q.claims[cl.k] = make(chan struct{})
	return true
}

// handleDue expires leases and ends backoffs of the due messages, in one
// commit. It returns how many it moved and how many it skipped because an
// operation held them.
func (s *scheduler) handleDue(ctx context.Context, due []Message, now time.Time) (moved, held int) {
	c := s.c
	b := batch{byDaemon: true}
	var claims []claim
	expiredBy := map[*queue]int64{}
	if c.leaser.oneByOne() && len(due) > 1 {
		for i := range due {
			n, h := s.handleDue(ctx, due[i:i+1], now)
			moved, held = moved+n, held+h
		}
		return moved, held
	}
	for _, m := range due {
		q, err := c.queue(m.Queue)
		if err != nil {
			continue
		}
		cl := liveClaim(q, m.Name)
		if !tryClaim(cl) {
			held++
			continue
		}
		claims = append(claims, cl)
		// Look again under the claim: an extend or ack may have come first.
		cur, err := c.store.Lookup(ctx, m.Queue, m.Name, false)
		if err != nil || cur.ID != m.ID || cur.State != m.State || cur.Deadline.After(now) {
			continue
		}
		p := policyOf(q)
		switch cur.State {
		case StateLeased:
			c.failOps(q, cur, &p, now, ReasonLeaseExpired, "lease ran out at "+cur.Deadline.UTC().Format(time.RFC3339)+" without an ack", &b)
			expiredBy[q]++
		case StateDelayed:
			old := cur
			cur.State, cur.Seq, cur.StateAt, cur.Deadline = StateReady, c.newSeq(), now, time.Time{}
			b.update(q, old, cur)
		}
		moved++
	}
	for q, n := range expiredBy {
		b.count(func(time.Time) { q.counters.expired.Add(n) })
	}
	if err := c.commit(ctx, &b); c.leaser.lostRace(err) {
		c.log.Debug("scheduler: a due message was moved by another daemon", LogErr, err)
		moved = 0
	} else if err != nil {
		c.log.Error("scheduler: commit expiries", LogErr, err)
		moved = 0
	}
	c.finish(claims, &b)
	if len(expiredBy) > 0 {
		total := int64(0)
		for _, n := range expiredBy {
			total += n
		}
		if total >= 10 {
			c.log.Warn("lease expiry burst", "count", total)
		}
	}
	return moved, held
}

// retention deletes archived and dead messages past their policy's
// retention or count limit; it returns when the next one is due. archived
// is the queue's archive count, or -1 for its gauge.
func (s *scheduler) retention(ctx context.Context, q *queue, now time.Time, archived int64) (next time.Time, held bool) {
	c := s.c
	q.mu.Lock()
	p := q.policy
	if archived < 0 {
		archived = q.gauges[StateArchived].N
	}
	q.mu.Unlock()
	type rule struct {
		state  State
		keep   time.Duration // 0: no time limit
		excess int64         // messages over the count limit
	}
	rules := []rule{{state: StateArchived, keep: time.Duration(p.Archive.RetentionSec) * time.Second}}
	if p.Archive.MaxMessages > 0 && archived > p.Archive.MaxMessages {
		rules[0].excess = archived - p.Archive.MaxMessages
	}
	rules = append(rules, rule{state: StateDead, keep: time.Duration(p.DLQ.RetentionDays) * 24 * time.Hour})
	for _, r := range rules {
		if r.keep == 0 && r.excess == 0 {
			continue
		}
		for {
			var victims []Message
			var first time.Time
			excess := r.excess
			err := c.store.List(ctx, q.name, r.state, func(m Message) bool {
				if excess > 0 || (r.keep > 0 && !m.StateAt.Add(r.keep).After(now)) {
					victims = append(victims, m)
					excess--
					return len(victims) < dueBatch
				}
				if r.keep > 0 {
					first = m.StateAt.Add(r.keep)
				}
				return false
			})
			if err != nil {
				c.log.Error("scheduler: read retention", LogQueue, q.name, LogErr, err)
				return now.Add(time.Second), false
			}
			if len(victims) == 0 {
				if !first.IsZero() && (next.IsZero() || first.Before(next)) {
					next = first
				}
				break
			}
			b := batch{byDaemon: true}
			var claims []claim
			for _, m := range victims {
				cl := claim{q, claimKey{name: m.Name, archived: r.state == StateArchived}}
				if !tryClaim(cl) {
					held = true
					continue
				}
				claims = append(claims, cl)
				// Look again under the claim: the name may hold a newer message.
				if cur, err := c.store.Lookup(ctx, q.name, m.Name, r.state == StateArchived); err == nil && cur.ID == m.ID {
					b.remove(q, cur)
				}
			}
			err = c.commit(ctx, &b)
			c.finish(claims, &b)
			if c.leaser.lostRace(err) {
				return now.Add(busyRetry), false // another daemon changed one: read again
			}
			if err != nil {
				c.log.Error("scheduler: retention commit", LogQueue, q.name, LogErr, err)
				return now.Add(time.Second), false
			}
			r.excess -= int64(len(b.ops))
			if len(b.ops) == 0 {
				break
			}
			s.countsStale.Store(true) // the counts read for this run are past
		}
	}
	return next, held
}
