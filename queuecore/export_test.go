package queuecore

// WithStatfs makes the core measure free space with f (a fake disk).
func WithStatfs(o Options, f func(dir string) (free, total int64, err error)) Options {
	o.statfs = f
	return o
}

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
