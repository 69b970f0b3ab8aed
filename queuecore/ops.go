package queuecore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

func errQueueGone(q *queue) error { return fmt.Errorf("queue %q: %w", q.name, ErrNotFound) }

func errNoMessage(queue string, s State, name string) error {
	return &noMessageError{queue, s, name}
}

// noMessageError is ErrNotFound for one path. Every negative LOOKUP of
// the kernel makes one, so it is built without formatting.
type noMessageError struct {
	queue string
	state State
	name  string
}

func (e *noMessageError) Error() string {
	return e.queue + "/" + e.state.Dir() + "/" + e.name + ": " + ErrNotFound.Error()
}

func (e *noMessageError) Unwrap() error { return ErrNotFound }

// policyOf returns a copy of q's policy.
func policyOf(q *queue) Policy {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.policy
}

// lookup finds the message called name in one state of q.
func (c *Core) lookup(ctx context.Context, q *queue, s State, name string) (Message, error) {
	var m Message
	var err error
	if s == StateArchived {
		m, err = c.store.Lookup(ctx, q.name, name, true)
	} else {
		m, err = c.lookupLive(ctx, q, name)
	}
	if errors.Is(err, ErrNotFound) || err == nil && m.State != s {
		return Message{}, errNoMessage(q.name, s, name)
	}
	return m, err
}

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

// Get returns the metadata of the message called name in one state.
func (c *Core) Get(ctx context.Context, queueName string, s State, name string) (Message, error) {
	q, err := c.queue(queueName)
	if err != nil {
		return Message{}, err
	}
	return c.lookup(ctx, q, s, name)
}

// Body returns a message's body (a peek: no lease).
func (c *Core) Body(ctx context.Context, m Message) ([]byte, error) {
	return c.store.Body(ctx, m.ID)
}

// List calls fn for the messages of a queue in one state, in delivery
// order for inbox/ and by timestamp elsewhere, until fn returns false.
func (c *Core) List(ctx context.Context, queueName string, s State, fn func(Message) bool) error {
	if _, err := c.queue(queueName); err != nil {
		return err
	}
	return c.store.List(ctx, queueName, s, fn)
}

// single runs one operation on one named message: it claims the name (and
// the archived name too when archive is set), looks the message up in
// state from, lets change build the batch and commits it.
func (c *Core) single(ctx context.Context, queueName, name string, from State, alsoArchived bool,
	change func(q *queue, m Message, p *Policy, now time.Time, b *batch) error) (Message, error) {
	q, err := c.queue(queueName)
	if err != nil {
		return Message{}, err
	}
	claims := []claim{{q, claimKey{name: name, archived: from == StateArchived}}}
	if alsoArchived {
		claims = append(claims, archivedClaim(q, name))
	}
	if err := c.acquire(claims); err != nil {
		return Message{}, err
	}
	var b batch
	defer c.finish(claims, &b)
	m, err := c.lookup(ctx, q, from, name)
	if err != nil {
		return Message{}, err
	}
	p := policyOf(q)
	if err := change(q, m, &p, c.now(), &b); err != nil {
		return Message{}, err
	}
	if err := c.commit(ctx, &b); err != nil {
		return Message{}, fmt.Errorf("%s/%s/%s: %w", queueName, from.Dir(), name, err)
	}
	if len(b.ops) > 0 && b.ops[0].Kind == OpUpdate {
		return b.ops[0].Msg, nil
	}
	return m, nil
}

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
	if c.shared != nil {
		return c.nextShared(ctx, q, consumer, nonblock)
	}
	for {
		if err := ctx.Err(); err != nil {
			return Message{}, err // a signal came with a wake-up: take no lease
		}
		q.mu.Lock()
		if q.deleted {
			q.mu.Unlock()
			return Message{}, errQueueGone(q)
		}
		if c.closed.Load() {
			q.mu.Unlock()
			return Message{}, ErrClosed
		}
		wake := q.readyCh
		var cand Message
		found := false
		var lerr error
		if !q.policy.Paused {
			lerr = c.store.List(ctx, queueName, StateReady, func(m Message) bool {
				if _, busy := q.claims[claimKey{name: m.Name}]; busy {
					return true
				}
				cand, found = m, true
				return false
			})
		}
		paused := q.policy.Paused
		if found {
			q.claims[claimKey{name: cand.Name}] = make(chan struct{})
		} else if !nonblock && lerr == nil {
			q.waiting++
		}
		p := q.policy
		q.mu.Unlock()
		if lerr != nil {
			return Message{}, lerr
		}
		if found {
			cl := []claim{liveClaim(q, cand.Name)}
			var b batch
			c.leaseOps(q, cand, &p, c.now(), consumer, &b)
			err := c.commit(ctx, &b)
			c.finish(cl, &b)
			if err != nil {
				return Message{}, fmt.Errorf("lease from %q: %w", queueName, err)
			}
			return b.ops[0].Msg, nil
		}
		if nonblock {
			if paused {
				return Message{}, fmt.Errorf("queue %q: %w", queueName, ErrPaused)
			}
			return Message{}, fmt.Errorf("queue %q: %w", queueName, ErrEmpty)
		}
		var werr error
		select {
		case <-wake:
		case <-ctx.Done():
			werr = ctx.Err()
		case <-c.done:
			werr = ErrClosed
		}
		q.mu.Lock()
		q.waiting--
		q.mu.Unlock()
		if werr != nil {
			return Message{}, werr
		}
	}
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
		c.log.Warn("retries spent, message dropped (dlq disabled)", logQueue, m.Queue, logName, m.Name, logReason, m.Reason)
		b.remove(q, old)
		return
	case m.Attempts > p.Retry.Limit:
		m.State = StateDead
		c.log.Info("message dead-lettered", logQueue, m.Queue, logName, m.Name, logReason, m.Reason, "attempts", m.Attempts)
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
// and first publish time kept.
func (c *Core) Redrive(ctx context.Context, queueName, name string) (Message, error) {
	return c.single(ctx, queueName, name, StateDead, false, func(q *queue, m Message, p *Policy, now time.Time, b *batch) error {
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

// Delete removes a message from inbox/, delayed/, dlq/ or archive/ (rm).
// A leased message is removed with Ack.
func (c *Core) Delete(ctx context.Context, queueName string, s State, name string) error {
	if s == StateLeased || !s.Valid() {
		return fmt.Errorf("delete from %s: %w", s.Dir(), ErrNotAllowed)
	}
	_, err := c.single(ctx, queueName, name, s, false, func(q *queue, m Message, p *Policy, now time.Time, b *batch) error {
		b.remove(q, m)
		return nil
	})
	return err
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
	body, err := c.store.Body(ctx, m.ID)
	if err != nil {
		return Message{}, err
	}
	if tp.broken != "" {
		return Message{}, fmt.Errorf("forward to %q: %w", toQueue, ErrPolicyBroken)
	}
	if int64(len(body)) > tp.MaxMessageBytes {
		return Message{}, fmt.Errorf("forward to %q: %w (%d)", toQueue, ErrTooLarge, tp.MaxMessageBytes)
	}
	now := c.now()
	chk, verr := tp.checkBody(toQueue, body, now)
	if verr != nil {
		return Message{}, &ValidationError{Queue: toQueue, Name: name, Reason: verr.Error()}
	}
	tq.mu.Lock()
	full := tp.MaxReady > 0 && tq.gauges[StateReady].N+tq.inserting >= tp.MaxReady
	if !full {
		tq.inserting++ // a DeleteQueue of the target now sees it is not empty
	}
	tq.mu.Unlock()
	if full {
		return Message{}, fmt.Errorf("queue %q: %w (%d)", toQueue, ErrQueueFull, tp.MaxReady)
	}
	defer func() {
		tq.mu.Lock()
		tq.inserting--
		tq.mu.Unlock()
	}()
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

// Purge deletes every message of a queue in one state (rm inbox/*); it
// returns how many went. Leased messages cannot be purged.
func (c *Core) Purge(ctx context.Context, queueName string, s State) (int, error) {
	if s == StateLeased || !s.Valid() {
		return 0, fmt.Errorf("purge %s: %w", s.Dir(), ErrNotAllowed)
	}
	q, err := c.queue(queueName)
	if err != nil {
		return 0, err
	}
	total := 0
	for {
		var names []string
		if err := c.store.List(ctx, queueName, s, func(m Message) bool {
			names = append(names, m.Name)
			return len(names) < 256
		}); err != nil {
			return total, err
		}
		if len(names) == 0 {
			return total, nil
		}
		claims := make([]claim, len(names))
		for i, n := range names {
			claims[i] = claim{q, claimKey{name: n, archived: s == StateArchived}}
		}
		if err := c.acquire(claims); err != nil {
			return total, err
		}
		var b batch
		for _, n := range names {
			if m, err := c.lookup(ctx, q, s, n); err == nil {
				b.remove(q, m)
			}
		}
		err := c.commit(ctx, &b)
		c.finish(claims, &b)
		if errors.Is(err, ErrNotFound) {
			continue // another daemon moved or deleted one of them: list again
		}
		if err != nil {
			return total, err
		}
		total += len(b.ops)
	}
}

// Move is a rename in a mount: it carries out the transition of docs/contract.md §2
// from (queue, state from, name) to (toQueue, state to), or fails with
// ErrNotAllowed for a transition the table does not have and ErrNotFound
// when the message is not where the caller says.
func (c *Core) Move(ctx context.Context, queueName string, from State, name, toQueue string, to State, consumer string) (Message, error) {
	if toQueue != queueName {
		if from == StateLeased && to == StateReady {
			return c.Forward(ctx, queueName, name, toQueue)
		}
		return Message{}, fmt.Errorf("%s/%s to %s/%s: %w", queueName, from.Dir(), toQueue, to.Dir(), ErrNotAllowed)
	}
	switch {
	case from == to:
		return c.Get(ctx, queueName, from, name)
	case from == StateReady && to == StateLeased:
		return c.Lease(ctx, queueName, name, consumer)
	case from == StateLeased && to == StateReady:
		return c.Nack(ctx, queueName, name)
	case to == StateDead && (from == StateReady || from == StateLeased || from == StateDelayed):
		return c.DeadLetter(ctx, queueName, name, from)
	case from == StateDead && to == StateReady:
		return c.Redrive(ctx, queueName, name)
	case from == StateArchived && to == StateReady:
		r, err := c.Replay(ctx, queueName, name)
		return r.Message, err
	case from == StateDelayed && to == StateReady:
		return c.RunNow(ctx, queueName, name)
	}
	return Message{}, fmt.Errorf("%s to %s: %w", from.Dir(), to.Dir(), ErrNotAllowed)
}

// AckRate is a queue's acks per second over the last minute.
func (c *Core) AckRate(queueName string) float64 {
	q, err := c.queue(queueName)
	if err != nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	_, _, acked := q.rates.perSec(c.now())
	return acked
}

// Position is a ready message's place in line (0: next) and the expected
// wait at the ack rate of the last minute (-1 when nothing was acked).
func (c *Core) Position(ctx context.Context, m Message) (pos int, eta time.Duration, err error) {
	q, err := c.queue(m.Queue)
	if err != nil {
		return 0, 0, err
	}
	found := false
	err = c.store.List(ctx, m.Queue, StateReady, func(x Message) bool {
		if x.ID == m.ID {
			found = true
			return false
		}
		pos++
		return true
	})
	if err != nil {
		return 0, 0, err
	}
	if !found {
		return 0, 0, errNoMessage(m.Queue, StateReady, m.Name)
	}
	q.mu.Lock()
	_, _, acked := q.rates.perSec(c.now())
	q.mu.Unlock()
	if acked <= 0 {
		return pos, -1, nil
	}
	return pos, time.Duration(float64(pos+1) / acked * float64(time.Second)), nil
}

// Find returns the live message called name (in any live state), or with
// archived the archived one. The filesystem uses it to follow a message
// that moved while the kernel held on to its inode.
func (c *Core) Find(ctx context.Context, queueName, name string, archived bool) (Message, error) {
	q, err := c.queue(queueName)
	if err != nil {
		return Message{}, err
	}
	var m Message
	if archived {
		m, err = c.store.Lookup(ctx, queueName, name, true)
	} else {
		m, err = c.lookupLive(ctx, q, name)
	}
	if errors.Is(err, ErrNotFound) {
		return Message{}, fmt.Errorf("%s/%s: %w", queueName, name, ErrNotFound)
	}
	return m, err
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
