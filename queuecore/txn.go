package queuecore

import (
	"context"
	"time"
)

// claim is a name reserved in a queue while an operation on it is under way.
type claim struct {
	q *queue
	k claimKey
}

func liveClaim(q *queue, name string) claim { return claim{q, claimKey{name: name}} }
func archivedClaim(q *queue, name string) claim {
	return claim{q, claimKey{name: name, archived: true}}
}

// acquire reserves every claim or none. When a name is taken it lets go of
// what it holds, waits for that name and starts over, so two operations
// never wait on each other (no deadlock across queues).
//
// It does not watch the request's context: a FUSE request is cancelled by
// any signal to its caller (even Go's SIGURG), and a commit at close(2) or
// rename(2) must not be dropped for that. Only Next waits on the context.
func (c *Core) acquire(claims []claim) error {
retry:
	for i, cl := range claims {
		cl.q.mu.Lock()
		if cl.q.deleted {
			cl.q.mu.Unlock()
			c.release(claims[:i])
			return errQueueGone(cl.q)
		}
		if ch, busy := cl.q.claims[cl.k]; busy {
			cl.q.mu.Unlock()
			c.release(claims[:i])
			select {
			case <-ch:
				goto retry
			case <-c.done:
				return ErrClosed
			}
		}
		cl.q.claims[cl.k] = make(chan struct{})
		cl.q.mu.Unlock()
	}
	return nil
}

func (c *Core) release(claims []claim) {
	for _, cl := range claims {
		cl.q.mu.Lock()
		if ch, ok := cl.q.claims[cl.k]; ok {
			delete(cl.q.claims, cl.k)
			close(ch)
		}
		if cl.q.waiting > 0 && !cl.k.archived {
			// Blocked Next calls skip claimed names, so a message that
			// became ready is theirs only now: wake them here, once.
			cl.q.wakeReaders()
		}
		cl.q.mu.Unlock()
	}
}

// batch is the changes of one operation: store ops plus what to do to the
// in-memory gauges and who to tell once the store has them.
type batch struct {
	ops       []Op
	deltas    []gaugeDelta
	events    []Event
	counts    []func(now time.Time) // counter updates, run after the commit under q.mu-free context
	byDaemon  bool
	deadline  time.Time // earliest lease deadline or due time set; zero if none
	kick      bool      // the scheduler must look again (retention)
	committed bool      // the store has it; its events may be announced
	redeliver bool      // undone by a power cut, it only means a redelivery (a lease, an ack): Op.NoSync
	touched   []touch   // live names written, for the name cache
}

// touch is one live name a batch wrote: its new metadata, or gone.
type touch struct {
	q    *queue
	m    Message
	gone bool
}

// finish releases an operation's claims, then tells the notifier what its
// batch moved. In that order: the notifier may wait for the kernel, and the
// kernel for a request that waits for one of these claims.
func (c *Core) finish(claims []claim, b *batch) {
	c.release(claims)
	if c.notify == nil || b == nil || !b.committed {
		return
	}
	for _, e := range b.events {
		c.notify.Notify(e)
	}
}

type gaugeDelta struct {
	q     *queue
	s     State
	n, sz int64
}

func (b *batch) insert(q *queue, m Message, body []byte, byDaemon bool) {
	b.ops = append(b.ops, Op{Kind: OpInsert, Msg: m, Body: body})
	b.touched = append(b.touched, touch{q: q, m: m})
	b.deltas = append(b.deltas, gaugeDelta{q: q, s: m.State, n: 1, sz: m.Size})
	b.events = append(b.events, Event{Queue: m.Queue, Name: m.Name, To: m.State, ByDaemon: b.byDaemon || byDaemon})
	b.noteDeadline(m)
}

func (b *batch) update(q *queue, old, m Message) {
	b.ops = append(b.ops, Op{Kind: OpUpdate, Msg: m, From: old.State})
	b.touched = append(b.touched, touch{q: q, m: m})
	if old.State != m.State {
		b.deltas = append(b.deltas,
			gaugeDelta{q: q, s: old.State, n: -1, sz: -old.Size},
			gaugeDelta{q: q, s: m.State, n: 1, sz: m.Size})
	}
	b.events = append(b.events, Event{Queue: m.Queue, Name: m.Name, From: old.State, To: m.State, ByDaemon: b.byDaemon})
	b.noteDeadline(m)
}

func (b *batch) remove(q *queue, old Message) {
	b.ops = append(b.ops, Op{Kind: OpDelete, Msg: Message{ID: old.ID, Queue: old.Queue, Name: old.Name, State: old.State, Size: old.Size, Rev: old.Rev}, From: old.State})
	b.touched = append(b.touched, touch{q: q, m: old, gone: true})
	b.deltas = append(b.deltas, gaugeDelta{q: q, s: old.State, n: -1, sz: -old.Size})
	b.events = append(b.events, Event{Queue: old.Queue, Name: old.Name, From: old.State, ByDaemon: b.byDaemon})
}

func (b *batch) count(f func(now time.Time)) { b.counts = append(b.counts, f) }

func (b *batch) noteDeadline(m Message) {
	if (m.State == StateLeased || m.State == StateDelayed) && (b.deadline.IsZero() || m.Deadline.Before(b.deadline)) {
		b.deadline = m.Deadline
	}
}

// inserts reports whether the batch puts a new message in (a publish, a
// fanout or forward copy), which the reserve is not for.
func (b *batch) inserts() bool {
	for i := range b.ops {
		if b.ops[i].Kind == OpInsert {
			return true
		}
	}
	return false
}

// commit hands the batch to the store, with no lock held, and on success
// updates gauges, counters and the scheduler (finish tells the notifier).
// A cancelled ctx does not cancel the commit: a change the caller asked
// for is never half done because a signal arrived.
func (c *Core) commit(ctx context.Context, b *batch) error {
	if len(b.ops) == 0 {
		return nil
	}
	c.gauges.committing(b.deltas)
	defer c.gauges.done(b.deltas)
	if b.redeliver && !b.inserts() {
		// A lease or an ack (with the archive entry it replaces): a
		// power cut that undoes it delivers the message again, which
		// at-least-once allows. A forward's copy is a publish: it waits.
		for i := range b.ops {
			b.ops[i].NoSync = true
		}
	}
	err := c.store.Apply(context.WithoutCancel(ctx), b.ops)
	if err != nil && c.space != nil && !b.inserts() && c.space.relieve(ctx, err) {
		// A drain (lease, ack, nack, delete) met a full disk: the
		// reserve was given back for it. A failed batch changed nothing.
		err = c.store.Apply(context.WithoutCancel(ctx), b.ops)
	}
	if err != nil {
		// A store that failed may hold some of it anyway (the fs store
		// keeps its index when an fdatasync fails, then refuses writes):
		// forget what the name cache knew of these names.
		for _, t := range b.touched {
			t.q.names.forget(t.m.Name)
		}
		if c.space != nil {
			c.space.noteWriteError(err)
		}
		return err
	}
	if c.space != nil {
		c.space.committed()
	}
	c.applied(b)
	return nil
}

// applied updates gauges, counters, the lease cache and the scheduler for
// a batch the store has committed.
func (c *Core) applied(b *batch) {
	now := c.now()
	timedLeft := int64(-1) // leased and delayed messages after this batch; -1: it changed none
	for _, d := range b.deltas {
		if c.shared == nil && (d.s == StateLeased || d.s == StateDelayed) {
			timedLeft = c.timed.Add(d.n)
		}
		d.q.mu.Lock()
		g := &d.q.gauges[d.s]
		wasEmpty := g.N == 0
		g.N += d.n
		g.Bytes += d.sz
		if d.n > 0 && wasEmpty && (d.s == StateDead || d.s == StateArchived) {
			b.kick = true // the retention timer may have nothing to wait for yet
		}
		if limit := d.q.policy.Archive.MaxMessages; d.s == StateArchived && limit > 0 && g.N > limit+archiveSlack(limit) {
			b.kick = true
		}
		d.q.mu.Unlock()
	}
	c.names.wrote(b.touched)
	for _, f := range b.counts {
		f(now)
	}
	b.committed = true
	if b.kick {
		c.sched.countsStale.Store(true)
		c.sched.kick()
	} else if !b.deadline.IsZero() {
		c.sched.wakeBy(b.deadline)
	} else if timedLeft == 0 {
		c.sched.noDeadlines()
	}
}

// archiveSlack is how far the archive may grow past its maxMessages before
// the scheduler trims it (back to maxMessages): a large archive is trimmed
// in batches rather than with one commit per ack.
func archiveSlack(limit int64) int64 { return min(limit/100, dueBatch/4) }
