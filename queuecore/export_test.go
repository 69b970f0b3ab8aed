package queuecore

import "context"

// Waiting is how many Next calls wait on queue: a test waits for a reader
// to block before it publishes or cancels.
func Waiting(c *Core, queue string) int {
	q, err := c.queue(queue)
	if err != nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiting
}

// SettledStats reads a queue's stats with the gauges read again from a
// shared store first. A shared core takes its gauges from the store at
// most once per countsTTL of its clock, and a read that overlapped a
// commit of its own to a queue is not taken for that queue (sharedGauges);
// a test whose fake clock stands still polls with this, as real time
// passing would.
func SettledStats(c *Core, ctx context.Context, queue string) (QueueStats, error) {
	c.gauges.force()
	return c.Stats(ctx, queue)
}

// SpaceIdle reports whether the free-space tick idles: it waits for the
// next commit (or a wake) with no timer.
func SpaceIdle(c *Core) bool {
	return c.space != nil && c.space.idle.Load()
}
