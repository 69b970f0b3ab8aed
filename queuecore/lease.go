package queuecore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Lease takes the ready message called name (mv inbox/X processing/).
// consumer describes the leaser (uid, pid, command).
func (c *Core) Lease(ctx context.Context, queueName, name, consumer string) (Message, error) {
	return c.single(ctx, queueName, name, StateReady, false, func(q *queue, m Message, p *Policy, now time.Time, b *batch) error {
		if p.Paused {
			return fmt.Errorf("queue %q: %w", queueName, ErrPaused)
		}
		c.leaseOps(q, m, p, now, consumer, b)
		return nil
	})
}

func (c *Core) leaseOps(q *queue, m Message, p *Policy, now time.Time, consumer string, b *batch) {
	old := m
	m.State, m.StateAt, m.Deadline, m.Consumer = StateLeased, now, now.Add(p.VisibilityTimeout()), consumer
	if releasedByConsumer(m) {
		// The give-back of an earlier lease is no reason of this one: a
		// plain nack of this lease must count.
		m.Reason, m.ReasonMessage = "", ""
	}
	b.update(q, old, m)
	b.redeliver = true
	b.count(func(now time.Time) {
		q.counters.leased.Add(1)
		q.mu.Lock()
		q.rates.add(now, rateLeased)
		q.mu.Unlock()
	})
}

// Next leases the next ready message in delivery order, waiting for one
// unless nonblock (ErrEmpty, or ErrPaused on a paused queue). It returns
// ctx.Err() when ctx is cancelled while waiting; then no lease is taken.
func (c *Core) Next(ctx context.Context, queueName, consumer string, nonblock bool) (Message, error) {
	q, err := c.queue(queueName)
	if err != nil {
		return Message{}, err
	}
	pick, poll := c.leaser.pick, c.leaser.poll()
	for {
		if err := ctx.Err(); err != nil {
			return Message{}, err // a signal came with a wake-up: take no lease
		}
		r, err := pick(ctx, q, consumer, nonblock)
		if err != nil {
			return Message{}, err
		}
		if r.found {
			return r.m, nil
		}
		if nonblock {
			if r.paused {
				return Message{}, fmt.Errorf("queue %q: %w", queueName, ErrPaused)
			}
			return Message{}, fmt.Errorf("queue %q: %w", queueName, ErrEmpty)
		}
		if err := c.waitReady(ctx, q, r.wake, poll); err != nil {
			return Message{}, err
		}
	}
}

// picked is one attempt of Next to lease a message. When it found none
// and the caller is to wait (not nonblock), the caller is already counted
// in q.waiting, so that no commit between the attempt and the wait misses
// it, and wake is the channel that such a commit closes.
type picked struct {
	m      Message // the leased message, when found
	found  bool
	paused bool
	wake   chan struct{}
}

// nextRefused is why Next cannot go on in q, if it cannot: the queue is
// gone or the core closed. q.mu is held.
func (c *Core) nextRefused(q *queue) error {
	if q.deleted {
		return errQueueGone(q)
	}
	if c.closed.Load() {
		return ErrClosed
	}
	return nil
}

// pickLocal is Next's attempt on a store of this daemon alone: the first
// ready message in delivery order that no operation has claimed, leased.
func (c *Core) pickLocal(ctx context.Context, q *queue, consumer string, nonblock bool) (picked, error) {
	q.mu.Lock()
	if err := c.nextRefused(q); err != nil {
		q.mu.Unlock()
		return picked{}, err
	}
	r := picked{wake: q.readyCh, paused: q.policy.Paused}
	var lerr error
	if !r.paused {
		lerr = c.store.List(ctx, q.name, StateReady, func(m Message) bool {
			if _, busy := q.claims[claimKey{name: m.Name}]; busy {
				return true
			}
			r.m, r.found = m, true
			return false
		})
	}
	if r.found {
		q.claims[claimKey{name: r.m.Name}] = make(chan struct{})
	} else if !nonblock && lerr == nil {
		q.waiting++
	}
	p := q.policy
	q.mu.Unlock()
	if lerr != nil {
		return picked{}, lerr
	}
	if !r.found {
		return r, nil
	}
	cl := []claim{liveClaim(q, r.m.Name)}
	var b batch
	c.leaseOps(q, r.m, &p, c.now(), consumer, &b)
	err := c.commit(ctx, &b)
	c.finish(cl, &b)
	if err != nil {
		return picked{}, fmt.Errorf("lease from %q: %w", q.name, err)
	}
	r.m = b.ops[0].Msg
	return r, nil
}

// waitReady is Next's wait, counted in q.waiting by the attempt before
// it: until wake is closed, poll passes (when not zero), ctx is done or
// the core closes. Then the caller is no longer counted.
func (c *Core) waitReady(ctx context.Context, q *queue, wake chan struct{}, poll time.Duration) error {
	var tick <-chan time.Time
	if poll > 0 {
		t := time.NewTimer(poll)
		defer t.Stop()
		tick = t.C
	}
	var werr error
	select {
	case <-wake:
	case <-tick:
	case <-ctx.Done():
		werr = ctx.Err()
	case <-c.done:
		werr = ErrClosed
	}
	q.mu.Lock()
	q.waiting--
	q.mu.Unlock()
	return werr
}

// Extend moves a lease's deadline (touch): to now + visibility timeout when
// deadline is zero, else to deadline, capped at now + maxLeaseSec.
func (c *Core) Extend(ctx context.Context, queueName, name string, deadline time.Time) (Message, error) {
	return c.single(ctx, queueName, name, StateLeased, false, func(q *queue, m Message, p *Policy, now time.Time, b *batch) error {
		old := m
		if deadline.IsZero() {
			deadline = now.Add(p.VisibilityTimeout())
		}
		if limit := now.Add(time.Duration(p.MaxLeaseSec) * time.Second); deadline.After(limit) {
			deadline = limit
		}
		m.Deadline = deadline
		b.update(q, old, m)
		return nil
	})
}

// Ack acknowledges a leased message (rm processing/X): to archive/ when the
// policy keeps one, else gone.
func (c *Core) Ack(ctx context.Context, queueName, name string) error {
	q, err := c.queue(queueName)
	if err != nil {
		return err
	}
	archive := policyOf(q).Archive.Enabled
	_, err = c.single(ctx, queueName, name, StateLeased, archive, func(q *queue, m Message, p *Policy, now time.Time, b *batch) error {
		// The archived claim was taken, or not, by the policy read above:
		// a policy written since then applies from the next ack.
		p.Archive.Enabled = archive
		return c.ackOps(ctx, q, m, p, now, b)
	})
	return err
}

// ackOps acknowledges m; when the archive is on, the caller holds the
// archived claim on m.Name.
func (c *Core) ackOps(ctx context.Context, q *queue, m Message, p *Policy, now time.Time, b *batch) error {
	if p.Archive.Enabled && c.space != nil && c.space.low.Load() {
		// The disk is low: an ack frees the body rather than keep it.
		b.remove(q, m)
		b.count(func(time.Time) { c.space.trimmed.Add(1) })
	} else if p.Archive.Enabled {
		prev, err := c.store.Lookup(ctx, q.name, m.Name, true)
		switch {
		case err == nil:
			b.remove(q, prev) // archive/ keeps the latest ack of a name
		case !errors.Is(err, ErrNotFound):
			return err
		}
		old := m
		m.State, m.StateAt, m.Deadline = StateArchived, now, time.Time{}
		b.update(q, old, m)
	} else {
		b.remove(q, m)
	}
	b.redeliver = true
	b.count(func(now time.Time) {
		q.counters.acked.Add(1)
		q.mu.Lock()
		q.rates.add(now, rateAcked)
		q.mu.Unlock()
	})
	return nil
}

// Nack returns a leased message (mv processing/X inbox/): the attempt is
// counted and the message waits out its backoff, or is dead-lettered once
// the retry limit is spent. A consumer that set reason RELEASED on its
// lease gives the message back instead: to inbox/ at once, no attempt
// counted (a consumer stopping is not a failure of the message).
func (c *Core) Nack(ctx context.Context, queueName, name string) (Message, error) {
	return c.single(ctx, queueName, name, StateLeased, false, func(q *queue, m Message, p *Policy, now time.Time, b *batch) error {
		if releasedByConsumer(m) {
			c.releaseOps(q, m, now, b)
			return nil
		}
		c.failOps(q, m, p, now, ReasonNacked, "returned by its consumer", b)
		b.count(func(time.Time) { q.counters.nacked.Add(1) })
		return nil
	})
}

// failOps records a failed delivery of m and sends it to delayed/, inbox/
// or dlq/ as the retry policy says. A reason the consumer set on the lease
// (SetReason) wins over defaultReason.
func (c *Core) failOps(q *queue, m Message, p *Policy, now time.Time, defaultReason, defaultMsg string, b *batch) {
	old := m
	m.Attempts++
	if !(m.FailedAt.IsZero() && m.Reason != "") {
		m.Reason, m.ReasonMessage = defaultReason, defaultMsg
	}
	m.FailedAt, m.Deadline, m.StateAt = now, time.Time{}, now
	switch {
	case m.Attempts > p.Retry.Limit && !p.DLQ.Enabled:
		c.log.Warn("retries spent, message dropped (dlq disabled)", LogQueue, m.Queue, LogName, m.Name, LogReason, m.Reason)
		b.remove(q, old)
		return
	case m.Attempts > p.Retry.Limit:
		m.State = StateDead
		c.log.Info("message dead-lettered", LogQueue, m.Queue, LogName, m.Name, LogReason, m.Reason, "attempts", m.Attempts)
		b.count(func(time.Time) { q.counters.deadLettered.Add(1) })
	default:
		if d := p.Backoff(m.Attempts); d > 0 {
			m.State, m.Deadline = StateDelayed, now.Add(d)
		} else {
			m.State, m.Seq = StateReady, c.newSeq()
		}
	}
	b.update(q, old, m)
}

// SetReason records why a leased message failed, before a nack or a
// dead-lettering (setfattr user.yirangmq.reason).
func (c *Core) SetReason(ctx context.Context, queueName, name, reason, message string) error {
	if reason == "" || len(reason) > 64 || len(message) > 1024 {
		return &InputError{Field: "reason", Msg: "must be 1 to 64 bytes (and its message at most 1024)"}
	}
	_, err := c.single(ctx, queueName, name, StateLeased, false, func(q *queue, m Message, p *Policy, now time.Time, b *batch) error {
		old := m
		m.Reason, m.ReasonMessage, m.FailedAt = reason, message, time.Time{}
		b.update(q, old, m)
		return nil
	})
	return err
}
