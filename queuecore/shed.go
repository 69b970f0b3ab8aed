package queuecore

// CacheShedder is implemented by a store that can give back memory it
// keeps only to be faster (page caches): Core.ShedCaches calls it when the
// daemon runs near its memory budget.
type CacheShedder interface {
	ShedCaches()
}

// ShedCaches empties the name cache of every queue and asks the store to
// give back what it caches, when it can (CacheShedder). Nothing that is
// needed for correctness is dropped: a name the cache no longer holds is
// read from the store again.
func (c *Core) ShedCaches() {
	for _, q := range c.queueList() {
		q.names.shed()
	}
	if s, ok := c.store.(CacheShedder); ok {
		s.ShedCaches()
	}
}

// shed drops every entry; a read under way is not kept (gen).
func (nc *nameCache) shed() {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	nc.gen++
	nc.entries = nil
	nc.complete = false
}
