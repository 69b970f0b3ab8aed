package queuecore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ReasonReleased is the reason a consumer sets on its lease to give the
// message back without a failed attempt (a consumer stopping for a deploy
// or a restart): see Nack.
const ReasonReleased = "RELEASED"

// Rename gives a ready message that no one has leased a new name in the
// same inbox/, in one atomic store update: the temp-then-rename idiom of
// Python's NamedTemporaryFile + os.replace, Go's os.CreateTemp + os.Rename
// and C's mkstemp + rename(2), whose temporary file is published at its
// close. The message keeps its ID, its place in line and its attempts.
// ErrNotFound when no ready message has that name (a consumer leased it
// first: the message is then delivered once, under the temporary name);
// ErrExists when newName is live in the queue (a committed message is
// never replaced); an InputError for a name a publish would refuse
// (a draft's leading dot among them).
func (c *Core) Rename(ctx context.Context, queueName, name, newName string) (Message, error) {
	if err := CheckMessageName(newName); err != nil {
		return Message{}, err
	}
	q, err := c.queue(queueName)
	if err != nil {
		return Message{}, err
	}
	if name == newName {
		return c.lookup(ctx, q, StateReady, name)
	}
	claims := []claim{liveClaim(q, name), liveClaim(q, newName)}
	if err := c.acquire(claims); err != nil {
		return Message{}, err
	}
	var b batch
	defer c.finish(claims, &b)
	m, err := c.lookup(ctx, q, StateReady, name)
	if err != nil {
		return Message{}, err
	}
	if _, err := c.names.lookup(ctx, q, newName); err == nil {
		return Message{}, fmt.Errorf("%s/%s: %w (live in this queue)", queueName, newName, ErrExists)
	} else if !errors.Is(err, ErrNotFound) {
		return Message{}, err
	}
	old := m
	m.Name = newName
	b.update(q, old, m)
	// The old name is free now: the name cache and the notifier must hear
	// that it is gone, not only that the new one is there.
	b.touched = append(b.touched, touch{q: q, m: old, gone: true})
	b.events = append(b.events, Event{Queue: old.Queue, Name: old.Name, From: StateReady})
	if err := c.commit(ctx, &b); err != nil {
		return Message{}, fmt.Errorf("rename %s/inbox/%s: %w", queueName, name, err)
	}
	return m, nil
}

// releaseOps gives a leased message back to inbox/ at once, its attempts
// unchanged: the nack of a consumer that set reason RELEASED on its lease.
func (c *Core) releaseOps(q *queue, m Message, now time.Time, b *batch) {
	old := m
	m.State, m.Seq, m.StateAt, m.Deadline = StateReady, c.newSeq(), now, time.Time{}
	if m.ReasonMessage == "" {
		m.ReasonMessage = "given back by its consumer"
	}
	b.update(q, old, m)
}

// releasedByConsumer reports whether the consumer of this lease set reason
// RELEASED on it (a reason left from an earlier failure has FailedAt set).
func releasedByConsumer(m Message) bool {
	return m.Reason == ReasonReleased && m.FailedAt.IsZero()
}
