package queuecore

import (
	"context"
	"sync"
)

// nameCacheMax bounds the name cache of one queue; when full, an entry
// goes for each new one.
const nameCacheMax = 8192

// nameCache holds, for some live names of one queue, what the store holds
// under them: the message's metadata, or that no live message has the
// name. It spares the store the point reads that every kernel LOOKUP and
// every operation would make (about a quarter of the daemon's CPU per
// message through a mount, before it).
//
// It stays exact because every change of a live name is a commit of this
// core (applied calls wrote for each name a batch wrote, overwriting or
// dropping its entry), and a read of the store is kept only if no commit
// of the queue came between the read and its insertion (gen). A store that
// other daemons share is not cached at all: its core reads names through
// sharedNames (mode.go), and the cache stays empty.
//
// When the cache holds every live name of its queue (complete: the queue
// was small when the core opened it, or new, and no entry has had to go
// since), a name it does not hold is known to be free, without a read:
// the publish's LOOKUP of a new name costs nothing then.
type nameCache struct {
	mu       sync.Mutex
	gen      uint64 // bumped by every wrote
	entries  map[string]nameEntry
	complete bool
}

type nameEntry struct {
	m    Message
	live bool // false: no live message has this name
}

// wrote records a commit that wrote m (or removed it, gone).
func (nc *nameCache) wrote(m Message, gone bool) {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	nc.gen++
	if gone || !m.State.Live() {
		delete(nc.entries, m.Name)
		return
	}
	if _, ok := nc.entries[m.Name]; !ok {
		nc.makeRoom()
	}
	nc.entries[m.Name] = nameEntry{m: m, live: true}
}

// makeRoom drops an entry, any one, when the cache is full: with more
// live names than it holds, it keeps answering for most of them rather
// than start from nothing. nc.mu must be held.
func (nc *nameCache) makeRoom() {
	if nc.entries == nil {
		nc.entries = make(map[string]nameEntry)
	}
	if len(nc.entries) < nameCacheMax {
		return
	}
	nc.complete = false
	for name := range nc.entries { // Go starts a map's iteration at random
		delete(nc.entries, name)
		return
	}
}

// fill makes the cache hold the live messages ms, all of its queue's.
func (nc *nameCache) fill(ms []Message) {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	nc.entries = make(map[string]nameEntry, len(ms))
	for _, m := range ms {
		nc.entries[m.Name] = nameEntry{m: m, live: true}
	}
	nc.complete = len(ms) < nameCacheMax
}

// forget drops what the cache knows of name, and any read under way.
func (nc *nameCache) forget(name string) {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	nc.gen++
	delete(nc.entries, name)
	nc.complete = false // the store may hold name after all
}

// get returns the entry of name, if there is one; a complete cache has
// one for every name (free when it holds none).
func (nc *nameCache) get(name string) (nameEntry, bool) {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	e, ok := nc.entries[name]
	if !ok && nc.complete {
		return nameEntry{}, true
	}
	return e, ok
}

// generation is read before a store read whose result may be kept.
func (nc *nameCache) generation() uint64 {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	return nc.gen
}

// learn keeps what a store read found, unless a commit came since gen.
func (nc *nameCache) learn(gen uint64, name string, e nameEntry) {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	if nc.gen != gen || nc.complete {
		return // stale, or nothing to learn
	}
	if _, ok := nc.entries[name]; !ok {
		nc.makeRoom()
	}
	nc.entries[name] = e
}

// loadNames fills the name cache of a small queue at open, so that it is
// complete (nameCache). A larger queue's cache fills as it goes.
func (c *Core) loadNames(ctx context.Context, q *queue, live int64) error {
	if live >= nameCacheMax/2 {
		return nil
	}
	var ms []Message
	for _, s := range States {
		if !s.Live() {
			continue
		}
		if err := c.store.List(ctx, q.name, s, func(m Message) bool {
			ms = append(ms, m)
			return true
		}); err != nil {
			return err
		}
	}
	q.names.fill(ms)
	return nil
}
