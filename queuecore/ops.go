// This file holds what the operations share: reading a message (Get,
// Body, List, Find, Position), running a change on one named message
// (single) and the rename table (Move). Publishing, leasing, dead letters
// and administration each have their own file.

package queuecore

import (
	"context"
	"errors"
	"fmt"
	"time"
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
		m, err = c.names.lookup(ctx, q, name)
	}
	if errors.Is(err, ErrNotFound) || err == nil && m.State != s {
		return Message{}, errNoMessage(q.name, s, name)
	}
	return m, err
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

// MoveRequest is a rename in a mount: the message called Name in state
// From of Queue goes to state To of ToQueue. Consumer describes the
// leaser (uid, pid, command) when To is StateLeased.
type MoveRequest struct {
	Queue    string
	From     State
	Name     string
	ToQueue  string
	To       State
	Consumer string
}

// Move carries out the transition of docs/contract.md §2 that r names, or
// fails with ErrNotAllowed for a transition the table does not have and
// ErrNotFound when the message is not where the caller says.
func (c *Core) Move(ctx context.Context, r MoveRequest) (Message, error) {
	queueName, from, name, toQueue, to := r.Queue, r.From, r.Name, r.ToQueue, r.To
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
		return c.Lease(ctx, queueName, name, r.Consumer)
	case from == StateLeased && to == StateReady:
		return c.Nack(ctx, queueName, name)
	case to == StateDead && (from == StateReady || from == StateLeased || from == StateDelayed):
		return c.DeadLetter(ctx, queueName, name, from)
	case from == StateDead && to == StateReady:
		return c.Redrive(ctx, queueName, name)
	case from == StateArchived && to == StateReady:
		res, err := c.Replay(ctx, queueName, name)
		return res.Message, err
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
		m, err = c.names.lookup(ctx, q, name)
	}
	if errors.Is(err, ErrNotFound) {
		return Message{}, fmt.Errorf("%s/%s: %w", queueName, name, ErrNotFound)
	}
	return m, err
}
