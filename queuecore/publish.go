package queuecore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// PublishOptions come from the producer: who it is and what it set on the
// file before the commit.
type PublishOptions struct {
	UID, GID uint32
	Delay    time.Duration // user.yirangmq.delay_sec
	DedupKey string        // user.yirangmq.dedup_key
	// ID, when not zero, is the message's ID, reserved with NewID when the
	// file was created, so its inode number holds from create to ack.
	ID uint64
	// MTime, when not zero, is the modification time the writer set on
	// its file before the commit (rsync, cp -p, tar): the message's inbox
	// mtime (PublishedAt) keeps it, so that rsync finds it unchanged on a
	// re-run. FirstAt stays the commit time.
	MTime time.Time
}

// PublishResult is what a publish committed.
type PublishResult struct {
	Message      Message // zero when Deduplicated
	Deduplicated bool    // accepted and dropped: its dedup key was seen within the window
}

// Publish commits a message called name into a queue's inbox (or delayed/
// when it asks for a delay). A body that the queue's format or schema
// rejects is kept in dlq/ with reason VALIDATION_ERROR and the error is a
// *ValidationError. Fanout copies are committed in the same batch.
func (c *Core) Publish(ctx context.Context, queueName, name string, body []byte, o PublishOptions) (PublishResult, error) {
	if err := CheckMessageName(name); err != nil {
		return PublishResult{}, err
	}
	q, err := c.queue(queueName)
	if err != nil {
		return PublishResult{}, err
	}
	return c.publish(ctx, q, name, body, o)
}

func (c *Core) publish(ctx context.Context, q *queue, name string, body []byte, o PublishOptions) (PublishResult, error) {
	p := policyOf(q)
	if p.broken != "" {
		c.log.Warn("publish refused: the queue's stored policy cannot be loaded", logQueue, q.name, "name", name, logErr, p.broken)
		return PublishResult{}, fmt.Errorf("queue %q: %w", q.name, ErrPolicyBroken)
	}
	if int64(len(body)) > p.MaxMessageBytes {
		return PublishResult{}, fmt.Errorf("%s: %d bytes: %w (%d)", name, len(body), ErrTooLarge, p.MaxMessageBytes)
	}
	now := c.now()
	chk, verr := p.checkBody(q.name, body, now)
	dedupKey := o.DedupKey
	if dedupKey == "" {
		dedupKey = chk.facts.DedupKey
	}
	window := time.Duration(p.DedupWindowSec) * time.Second
	if verr == nil && window > 0 && dedupKey != "" {
		q.mu.Lock()
		at, seen := q.dedup[dedupKey]
		q.mu.Unlock()
		if seen && now.Sub(at) < window {
			q.counters.deduplicated.Add(1)
			return PublishResult{Deduplicated: true}, nil
		}
	}

	claims := []claim{liveClaim(q, name)}
	var fan []*queue
	if verr == nil {
		for _, f := range p.Fanout {
			fq, err := c.queue(f)
			if err != nil {
				c.log.Warn("fanout queue is gone, copy skipped", logQueue, q.name, "fanout", f)
				continue
			}
			if policyOf(fq).broken != "" {
				c.log.Warn("fanout queue is closed (its stored policy cannot be loaded), copy skipped", logQueue, q.name, "fanout", f)
				continue
			}
			fan = append(fan, fq)
			claims = append(claims, liveClaim(fq, name))
		}
	}
	if err := c.acquire(claims); err != nil {
		return PublishResult{}, err
	}
	var b batch
	defer c.finish(claims, &b)

	m := Message{
		Queue: q.name, Name: name, State: StateReady,
		Priority: chk.facts.Priority, Size: int64(len(chk.body)),
		MessageID: chk.facts.MessageID, PublishedAt: now, FirstAt: now, StateAt: now,
		DedupKey: dedupKey, UID: o.UID, GID: o.GID,
	}
	if !o.MTime.IsZero() {
		m.PublishedAt = o.MTime
	}
	if m.MessageID == "" {
		m.MessageID = c.newMessageID()
	}
	delay := max(o.Delay, chk.facts.Delay)
	var vmsg string
	switch {
	case verr != nil:
		vmsg = verr.Error()
		m.State, m.Reason, m.ReasonMessage, m.FailedAt = StateDead, ReasonValidation, vmsg, now
	case delay > 0:
		m.State, m.Deadline = StateDelayed, now.Add(delay)
	}

	// Backpressure: counted against ready messages plus publishes under way.
	toReady := m.State == StateReady
	if toReady && c.shared != nil && p.MaxReady > 0 {
		// Other daemons lease and publish too: go by the store's count
		// (at most countsTTL old), not by this daemon's own moves.
		if err := c.refreshCounts(ctx); err != nil {
			return PublishResult{}, fmt.Errorf("publish %s/%s: %w", q.name, name, err)
		}
	}
	for _, cl := range claims {
		cq := cl.q
		cq.mu.Lock()
		limit := cq.policy.MaxReady
		if toReady && limit > 0 && cq.gauges[StateReady].N+cq.inserting >= limit {
			cq.mu.Unlock()
			return PublishResult{}, fmt.Errorf("queue %q: %w (%d)", cq.name, ErrQueueFull, limit)
		}
		cq.mu.Unlock()
	}
	for _, cl := range claims {
		cl.q.mu.Lock()
		cl.q.inserting++
		cl.q.mu.Unlock()
	}
	defer func() {
		for _, cl := range claims {
			cl.q.mu.Lock()
			cl.q.inserting--
			cl.q.mu.Unlock()
		}
	}()

	if c.space != nil {
		if err := c.space.admit(int64(len(chk.body)) * int64(1+len(fan))); err != nil {
			return PublishResult{}, fmt.Errorf("publish %s/%s: %w", q.name, name, err)
		}
	}

	var err error
	m.ID = o.ID
	if m.ID == 0 {
		if m.ID, err = c.newID(); err != nil {
			return PublishResult{}, fmt.Errorf("publish %s/%s: %w", q.name, name, err)
		}
	}
	m.Seq = c.newSeq() // delivery order is commit order
	b.insert(q, m, chk.body, false)
	for _, fq := range fan {
		cp := m
		if cp.ID, err = c.newID(); err != nil {
			return PublishResult{}, fmt.Errorf("publish %s/%s: %w", q.name, name, err)
		}
		cp.Seq = c.newSeq()
		cp.Queue = fq.name
		b.insert(fq, cp, chk.body, true)
	}
	b.count(func(now time.Time) {
		if verr != nil {
			q.counters.rejected.Add(1)
			return
		}
		for _, cq := range append([]*queue{q}, fan...) {
			cq.counters.published.Add(1)
			cq.mu.Lock()
			cq.rates.add(now, ratePublished)
			cq.mu.Unlock()
		}
		if window > 0 && dedupKey != "" {
			q.mu.Lock()
			q.dedup[dedupKey] = now
			q.pruneDedup(now, window)
			q.mu.Unlock()
		}
	})
	// A live name is refused by the store itself (ErrExists), so the
	// common case costs no read; which queue holds it is looked up only
	// then, for the message.
	if err := c.commit(ctx, &b); err != nil {
		if errors.Is(err, ErrExists) {
			return PublishResult{}, fmt.Errorf("%s/%s: %w", q.name, name, c.whereExists(ctx, claims, name))
		}
		if verr != nil {
			c.log.Error("validation failure could not be kept in dlq", logQueue, q.name, logName, name, logErr, err)
			return PublishResult{}, &ValidationError{Queue: q.name, Name: name, Reason: vmsg}
		}
		return PublishResult{}, fmt.Errorf("publish %s/%s: %w", q.name, name, err)
	}
	if verr != nil {
		c.log.Warn("message failed validation, kept in dlq", logQueue, q.name, logName, name, logReason, vmsg)
		return PublishResult{Message: m}, &ValidationError{Queue: q.name, Name: name, Reason: vmsg, Kept: true}
	}
	return PublishResult{Message: m}, nil
}

// newMessageID makes a random (version 4) UUID for a message that brought
// none, from a buffered source: one getrandom(2) per 256 of them rather
// than one each.
func (c *Core) newMessageID() string {
	c.randMu.Lock()
	u, err := uuid.NewRandomFromReader(c.rand)
	c.randMu.Unlock()
	if err != nil {
		return uuid.NewString()
	}
	return u.String()
}

// whereExists explains an ErrExists of a publish: which of the claimed
// queues (the target or a fanout queue) holds the name.
func (c *Core) whereExists(ctx context.Context, claims []claim, name string) error {
	for i, cl := range claims {
		if _, err := c.store.Lookup(ctx, cl.q.name, name, false); err == nil {
			if i == 0 {
				return fmt.Errorf("%w (live in this queue)", ErrExists)
			}
			return fmt.Errorf("%w in fanout queue %q", ErrExists, cl.q.name)
		}
	}
	return ErrExists
}

// NewID reserves a message ID for a later Publish. It is 0 when a shared
// store could not be reached; Publish then picks one itself.
func (c *Core) NewID() uint64 {
	id, err := c.newID()
	if err != nil {
		c.log.Warn("no message ID reserved", logErr, err)
	}
	return id
}

// CheckPublish tells early whether a publish of name could succeed, so
// that a create(2) fails at once rather than at close: ErrExists when the
// name is live, ErrQueueFull at maxReady, ErrDiskLow under the floor.
// The publish itself checks again.
func (c *Core) CheckPublish(ctx context.Context, queueName, name string) error {
	if err := CheckMessageName(name); err != nil {
		return err
	}
	q, err := c.queue(queueName)
	if err != nil {
		return err
	}
	if c.shared != nil && policyOf(q).MaxReady > 0 {
		if err := c.refreshCounts(ctx); err != nil {
			return err
		}
	}
	q.mu.Lock()
	_, claimed := q.claims[claimKey{name: name}]
	limit, ready := q.policy.MaxReady, q.gauges[StateReady].N+q.inserting
	q.mu.Unlock()
	if limit > 0 && ready >= limit {
		return fmt.Errorf("queue %q: %w (%d)", queueName, ErrQueueFull, limit)
	}
	if c.space != nil {
		if err := c.space.admit(0); err != nil {
			return fmt.Errorf("%s/%s: %w", queueName, name, err)
		}
	}
	if claimed {
		return nil // under way: the publish will tell
	}
	if _, err := c.lookupLive(ctx, q, name); err == nil {
		return fmt.Errorf("%s/%s: %w", queueName, name, ErrExists)
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}
