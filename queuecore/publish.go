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

// publish is Publish once the queue is found. Its steps, in order: refuse
// what the policy cannot take, drop a duplicate, claim the name in the
// queue and its fanout queues, build the message, hold a place under
// maxReady and the disk floor, assign IDs, commit.
func (c *Core) publish(ctx context.Context, q *queue, name string, body []byte, o PublishOptions) (PublishResult, error) {
	p := policyOf(q)
	if err := c.publishAllowed(q, &p, name, body); err != nil {
		return PublishResult{}, err
	}
	now := c.now()
	chk, verr := p.checkBody(q.name, body, now)
	dedupKey := o.DedupKey
	if dedupKey == "" {
		dedupKey = chk.facts.DedupKey
	}
	window := time.Duration(p.DedupWindowSec) * time.Second
	if verr == nil && q.dedupSeen(dedupKey, window, now) {
		q.counters.deduplicated.Add(1)
		return PublishResult{Deduplicated: true}, nil
	}

	claims := []claim{liveClaim(q, name)}
	var fan []*queue
	if verr == nil {
		fan = c.fanoutQueues(q, &p)
		for _, fq := range fan {
			claims = append(claims, liveClaim(fq, name))
		}
	}
	if err := c.acquire(claims); err != nil {
		return PublishResult{}, err
	}
	var b batch
	defer c.finish(claims, &b)

	m, vmsg := c.newPublished(q, name, chk, verr, o, dedupKey, now)

	if err := c.reserveReady(ctx, q, name, claims, &p, m.State == StateReady); err != nil {
		return PublishResult{}, err
	}
	defer unreserveReady(claims)
	if c.space != nil {
		if err := c.space.admit(int64(len(chk.body)) * int64(1+len(fan))); err != nil {
			return PublishResult{}, fmt.Errorf("publish %s/%s: %w", q.name, name, err)
		}
	}

	if err := c.insertPublished(&b, q, fan, &m, o.ID, chk.body); err != nil {
		return PublishResult{}, fmt.Errorf("publish %s/%s: %w", q.name, name, err)
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
		q.dedupNote(dedupKey, window, now)
	})
	// A live name is refused by the store itself (ErrExists), so the
	// common case costs no read; which queue holds it is looked up only
	// then, for the message.
	if err := c.commit(ctx, &b); err != nil {
		if errors.Is(err, ErrExists) {
			return PublishResult{}, fmt.Errorf("%s/%s: %w", q.name, name, c.whereExists(ctx, claims, name))
		}
		if verr != nil {
			c.log.Error("validation failure could not be kept in dlq", LogQueue, q.name, LogName, name, LogErr, err)
			return PublishResult{}, &ValidationError{Queue: q.name, Name: name, Reason: vmsg}
		}
		return PublishResult{}, fmt.Errorf("publish %s/%s: %w", q.name, name, err)
	}
	if verr != nil {
		c.log.Warn("message failed validation, kept in dlq", LogQueue, q.name, LogName, name, LogReason, vmsg, LogUID, o.UID)
		return PublishResult{Message: m}, &ValidationError{Queue: q.name, Name: name, Reason: vmsg, Kept: true}
	}
	return PublishResult{Message: m}, nil
}

// publishAllowed refuses a publish the queue's policy cannot take at all:
// a policy that could not be loaded, or a body over maxMessageBytes.
func (c *Core) publishAllowed(q *queue, p *Policy, name string, body []byte) error {
	if p.broken != "" {
		c.log.Warn("publish refused: the queue's stored policy cannot be loaded", LogQueue, q.name, LogName, name, LogErr, p.broken)
		return fmt.Errorf("queue %q: %w", q.name, ErrPolicyBroken)
	}
	if int64(len(body)) > p.MaxMessageBytes {
		return fmt.Errorf("%s: %d bytes: %w (%d)", name, len(body), ErrTooLarge, p.MaxMessageBytes)
	}
	return nil
}

// dedupSeen tells whether key was published within window before now.
func (q *queue) dedupSeen(key string, window time.Duration, now time.Time) bool {
	if window <= 0 || key == "" {
		return false
	}
	q.mu.Lock()
	at, seen := q.dedup[key]
	q.mu.Unlock()
	return seen && now.Sub(at) < window
}

// dedupNote remembers that key was published at now.
func (q *queue) dedupNote(key string, window time.Duration, now time.Time) {
	if window <= 0 || key == "" {
		return
	}
	q.mu.Lock()
	q.dedup[key] = now
	q.pruneDedup(now, window)
	q.mu.Unlock()
}

// fanoutQueues returns the queues that get a copy of a publish to q; a
// queue that is gone or closed is skipped with a warning.
func (c *Core) fanoutQueues(q *queue, p *Policy) []*queue {
	var fan []*queue
	for _, f := range p.Fanout {
		fq, err := c.queue(f)
		if err != nil {
			c.log.Warn("fanout queue is gone, copy skipped", LogQueue, q.name, "fanout", f)
			continue
		}
		if policyOf(fq).broken != "" {
			c.log.Warn("fanout queue is closed (its stored policy cannot be loaded), copy skipped", LogQueue, q.name, "fanout", f)
			continue
		}
		fan = append(fan, fq)
	}
	return fan
}

// newPublished is the message a publish of name commits, still without
// IDs: ready, delayed when it asks for a delay, or dead when it failed
// validation (vmsg then says why).
func (c *Core) newPublished(q *queue, name string, chk checked, verr error, o PublishOptions, dedupKey string, now time.Time) (m Message, vmsg string) {
	m = Message{
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
	switch delay := max(o.Delay, chk.facts.Delay); {
	case verr != nil:
		vmsg = verr.Error()
		m.State, m.Reason, m.ReasonMessage, m.FailedAt = StateDead, ReasonValidation, vmsg, now
	case delay > 0:
		m.State, m.Deadline = StateDelayed, now.Add(delay)
	}
	return m, vmsg
}

// reserveReady is the backpressure step: a message bound for inbox/ is
// counted against ready messages plus publishes under way, in every
// claimed queue. On success each claimed queue counts one more publish
// under way until unreserveReady.
func (c *Core) reserveReady(ctx context.Context, q *queue, name string, claims []claim, p *Policy, toReady bool) error {
	if toReady && p.MaxReady > 0 {
		// Other daemons of a shared store lease and publish too: go by
		// the store's count (at most countsTTL old).
		if err := c.gauges.refresh(ctx); err != nil {
			return fmt.Errorf("publish %s/%s: %w", q.name, name, err)
		}
	}
	for _, cl := range claims {
		cq := cl.q
		cq.mu.Lock()
		limit := cq.policy.MaxReady
		if toReady && limit > 0 && cq.gauges[StateReady].N+cq.inserting >= limit {
			cq.mu.Unlock()
			return fmt.Errorf("queue %q: %w (%d)", cq.name, ErrQueueFull, limit)
		}
		cq.mu.Unlock()
	}
	for _, cl := range claims {
		cl.q.mu.Lock()
		cl.q.inserting++
		cl.q.mu.Unlock()
	}
	return nil
}

// unreserveReady ends the publishes under way that reserveReady counted.
func unreserveReady(claims []claim) {
	for _, cl := range claims {
		cl.q.mu.Lock()
		cl.q.inserting--
		cl.q.mu.Unlock()
	}
}

// insertPublished gives m its IDs (id when the caller reserved one) and
// adds it and its fanout copies to b. Delivery order is commit order, so
// each copy takes its sequence number here.
func (c *Core) insertPublished(b *batch, q *queue, fan []*queue, m *Message, id uint64, body []byte) error {
	var err error
	m.ID = id
	if m.ID == 0 {
		if m.ID, err = c.newID(); err != nil {
			return err
		}
	}
	m.Seq = c.newSeq()
	b.insert(q, *m, body, false)
	for _, fq := range fan {
		cp := *m
		if cp.ID, err = c.newID(); err != nil {
			return err
		}
		cp.Seq = c.newSeq()
		cp.Queue = fq.name
		b.insert(fq, cp, body, true)
	}
	return nil
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
		c.log.Warn("no message ID reserved", LogErr, err)
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
	if policyOf(q).MaxReady > 0 {
		if err := c.gauges.refresh(ctx); err != nil {
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
	if _, err := c.names.lookup(ctx, q, name); err == nil {
		return fmt.Errorf("%s/%s: %w", queueName, name, ErrExists)
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}
