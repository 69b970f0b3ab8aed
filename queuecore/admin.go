package queuecore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

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
