package queuecore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DeadLetter moves a ready, leased or delayed message to dlq/ by hand
// (reason MANUAL, or the reason its consumer set).
func (c *Core) DeadLetter(ctx context.Context, queueName, name string, from State) (Message, error) {
	if from != StateReady && from != StateLeased && from != StateDelayed {
		return Message{}, fmt.Errorf("%s to dlq: %w", from.Dir(), ErrNotAllowed)
	}
	return c.single(ctx, queueName, name, from, false, func(q *queue, m Message, p *Policy, now time.Time, b *batch) error {
		old := m
		if !(from == StateLeased && m.FailedAt.IsZero() && m.Reason != "") {
			m.Reason, m.ReasonMessage = ReasonManual, "moved to dlq by hand"
		}
		m.State, m.StateAt, m.FailedAt, m.Deadline = StateDead, now, now, time.Time{}
		b.update(q, old, m)
		b.count(func(time.Time) { q.counters.deadLettered.Add(1) })
		return nil
	})
}

// Redrive sends a dead letter back to inbox/: attempts reset, redrive count
// and first publish time kept. A body that the queue's format or schema, as
// they are now, reject is not redriven (a *ValidationError; the message
// stays in dlq/): a consumer is never handed what its queue refuses.
func (c *Core) Redrive(ctx context.Context, queueName, name string) (Message, error) {
	return c.single(ctx, queueName, name, StateDead, false, func(q *queue, m Message, p *Policy, now time.Time, b *batch) error {
		if err := c.validateAgain(ctx, q, m, p, now, "redrive"); err != nil {
			return err
		}
		old := m
		m.State, m.Seq, m.Attempts, m.StateAt, m.PublishedAt = StateReady, c.newSeq(), 0, now, now
		m.Redrives++
		b.update(q, old, m)
		b.count(func(time.Time) { q.counters.redriven.Add(1) })
		return nil
	})
}

// RunNow sends a delayed message to inbox/ at once.
func (c *Core) RunNow(ctx context.Context, queueName, name string) (Message, error) {
	return c.single(ctx, queueName, name, StateDelayed, false, func(q *queue, m Message, p *Policy, now time.Time, b *batch) error {
		old := m
		m.State, m.Seq, m.StateAt, m.Deadline = StateReady, c.newSeq(), now, time.Time{}
		b.update(q, old, m)
		return nil
	})
}

// Replay publishes the body of an archived message again under its name;
// the archived copy stays.
func (c *Core) Replay(ctx context.Context, queueName, name string) (PublishResult, error) {
	q, err := c.queue(queueName)
	if err != nil {
		return PublishResult{}, err
	}
	m, err := c.lookup(ctx, q, StateArchived, name)
	if err != nil {
		return PublishResult{}, err
	}
	body, err := c.store.Body(ctx, m.ID)
	if err != nil {
		return PublishResult{}, fmt.Errorf("replay %s/%s: %w", queueName, name, err)
	}
	return c.publish(ctx, q, name, body, PublishOptions{UID: m.UID, GID: m.GID, DedupKey: ""})
}

// Forward acknowledges a leased message here and publishes its body under
// the same name in another queue's inbox, in one atomic step.
func (c *Core) Forward(ctx context.Context, queueName, name, toQueue string) (Message, error) {
	q, err := c.queue(queueName)
	if err != nil {
		return Message{}, err
	}
	tq, err := c.queue(toQueue)
	if err != nil {
		return Message{}, err
	}
	if q == tq {
		return c.Nack(ctx, queueName, name)
	}
	p, tp := policyOf(q), policyOf(tq)
	claims := []claim{liveClaim(q, name), liveClaim(tq, name)}
	if p.Archive.Enabled {
		claims = append(claims, archivedClaim(q, name))
	}
	if err := c.acquire(claims); err != nil {
		return Message{}, err
	}
	var b batch
	defer c.finish(claims, &b)
	m, err := c.lookup(ctx, q, StateLeased, name)
	if err != nil {
		return Message{}, err
	}
	if _, err := c.store.Lookup(ctx, toQueue, name, false); err == nil {
		return Message{}, fmt.Errorf("%s/%s: %w", toQueue, name, ErrExists)
	} else if !errors.Is(err, ErrNotFound) {
		return Message{}, err
	}
	now := c.now()
	chk, err := c.forwardBody(ctx, m, toQueue, &tp, now)
	if err != nil {
		return Message{}, err
	}
	// The target's backpressure, as for a publish (a DeleteQueue of the
	// target now sees it is not empty).
	toClaim := []claim{liveClaim(tq, name)}
	if err := c.reserveReady(ctx, tq, name, toClaim, &tp, true); err != nil {
		return Message{}, err
	}
	defer unreserveReady(toClaim)
	if err := c.ackOps(ctx, q, m, &p, now, &b); err != nil {
		return Message{}, err
	}
	fid, err := c.newID()
	if err != nil {
		return Message{}, fmt.Errorf("forward %s/%s to %q: %w", queueName, name, toQueue, err)
	}
	fm := Message{
		ID: fid, Queue: toQueue, Name: name, State: StateReady,
		Priority: chk.facts.Priority, Size: int64(len(chk.body)), MessageID: m.MessageID,
		PublishedAt: now, FirstAt: now, StateAt: now, DedupKey: m.DedupKey, UID: m.UID, GID: m.GID,
	}
	fm.Seq = c.newSeq()
	b.insert(tq, fm, chk.body, true)
	b.count(func(now time.Time) {
		tq.counters.published.Add(1)
		tq.mu.Lock()
		tq.rates.add(now, ratePublished)
		tq.mu.Unlock()
	})
	if err := c.commit(ctx, &b); err != nil {
		return Message{}, fmt.Errorf("forward %s/%s to %q: %w", queueName, name, toQueue, err)
	}
	return fm, nil
}

// forwardBody reads a forwarded message's body and checks it against the
// target queue's policy: size, format and schema.
func (c *Core) forwardBody(ctx context.Context, m Message, toQueue string, tp *Policy, now time.Time) (checked, error) {
	body, err := c.store.Body(ctx, m.ID)
	if err != nil {
		return checked{}, err
	}
	if tp.broken != "" {
		return checked{}, fmt.Errorf("forward to %q: %w", toQueue, ErrPolicyBroken)
	}
	if int64(len(body)) > tp.MaxMessageBytes {
		return checked{}, fmt.Errorf("forward to %q: %w (%d)", toQueue, ErrTooLarge, tp.MaxMessageBytes)
	}
	chk, verr := tp.checkBody(toQueue, body, now)
	if verr != nil {
		return checked{}, &ValidationError{Queue: toQueue, Name: m.Name, Reason: verr.Error()}
	}
	return chk, nil
}

// validateAgain checks a stored message's body against the queue's
// format and schema as they are now, before what (a redrive) hands it to
// consumers again: it may have been dead-lettered for failing them, or
// published before they were set. A replay and a forward publish the body
// anew and so are checked by publish and Forward.
func (c *Core) validateAgain(ctx context.Context, q *queue, m Message, p *Policy, now time.Time, what string) error {
	if p.Format == "raw" && p.schema == nil {
		return nil
	}
	body, err := c.store.Body(ctx, m.ID)
	if err != nil {
		return fmt.Errorf("%s %s/%s: %w", what, q.name, m.Name, err)
	}
	if _, verr := p.checkBody(q.name, body, now); verr != nil {
		// Not logged here: the caller logs it, naming who asked.
		return &ValidationError{Queue: q.name, Name: m.Name, Reason: verr.Error()}
	}
	return nil
}
