package fusefs

import (
	"sync"
	"time"

	"yirangmq/queuecore"
)

// placements remembers, per message, the state directory where the kernel
// last saw it (its lookup, its create, a rename it sent us) and the inode
// generation it was given there.
//
// Why: the kernel knows nothing of the moves the daemon makes by itself (a
// lease through .next, an expiry, the end of a backoff). If a lookup in
// the new place returned the same inode the kernel still has cached under
// the old name, the kernel would hold one inode under two names, and
// `mv inbox/X processing/` would "succeed" without reaching us
// (vfs_rename does nothing when source and target are the same inode) for
// a message another consumer holds. So a lookup that finds a message away
// from where the kernel put it gives it a new generation: a new inode to
// the kernel, with the same st_ino. A rename the kernel sent us keeps the
// generation, so the usual publish → lease → ack path costs no extra
// LOOKUP.
//
// Generations are never reused for a message: each new one is the next
// value of a counter of the whole mount. The record of a message goes
// when the kernel forgets the inode of its current generation, while the
// kernel may still hold an older inode of it under another name (the
// pruner makes this common, see memory.go); a generation counted again
// from 0 would then be that older inode, and a lookup in the new place
// would hand the kernel one inode under two names once more.
type placements struct {
	mu   sync.Mutex
	m    map[uint64]placement
	last uint64 // the last generation given out (0 is a created file's)
}

type placement struct {
	state queuecore.State
	gen   uint64
}

// lookedUp returns the generation for a message found in state s.
func (p *placements) lookedUp(id uint64, s queuecore.State) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[uint64]placement{}
	}
	pl, ok := p.m[id]
	if !ok || pl.state != s {
		p.last++
		pl.gen = p.last
	}
	pl.state = s
	p.m[id] = pl
	return pl.gen
}

// created records a file created in inbox/ (generation 0).
func (p *placements) created(id uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[uint64]placement{}
	}
	p.m[id] = placement{state: queuecore.StateReady}
}

// moved records a rename the kernel sent us: its inode is now in s.
func (p *placements) moved(id uint64, s queuecore.State) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl, ok := p.m[id]; ok {
		pl.state = s
		p.m[id] = pl
	}
}

// forgotten drops the record once the kernel forgets the inode of that
// generation (a newer one may be in use).
func (p *placements) forgotten(id, gen uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl, ok := p.m[id]; ok && pl.gen == gen {
		delete(p.m, id)
	}
}

// successors remembers, for a while, which new message a rename made of
// an old one: a replay (`mv archive/X inbox/`) or a forward
// (`mv processing/X OTHER/inbox/`) publishes a new message with an ID of
// its own, but the kernel moved the old inode to the new name and keeps
// using it until its entry and attributes time out (the daemon never
// tells the kernel, see Options.EntryTimeout). An operation on that inode
// is served from its successor. Entries older than ttl are dropped: by
// then the kernel has looked the name up again and holds the new inode.
type successors struct {
	mu  sync.Mutex
	ttl time.Duration
	m   map[uint64]successor
	// order is the keys of m in the order they were added (their at
	// grows along it), so that expired ones are dropped from its front
	// and an add costs O(1), however many renames happened within ttl
	// (it scanned the whole map before).
	order []successorKey
}

type successor struct {
	queue string
	id    uint64
	at    time.Time
}

type successorKey struct {
	old uint64
	at  time.Time
}

func (s *successors) add(old uint64, queue string, id uint64, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[uint64]successor{}
	}
	drop := 0
	for _, k := range s.order {
		if now.Sub(k.at) <= s.ttl {
			break
		}
		if v, ok := s.m[k.old]; ok && v.at.Equal(k.at) {
			delete(s.m, k.old) // not added again since
		}
		drop++
	}
	s.order = append(s.order[drop:], successorKey{old, now})
	s.m[old] = successor{queue: queue, id: id, at: now}
}

func (s *successors) get(old uint64, now time.Time) (successor, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[old]
	if ok && now.Sub(v.at) > s.ttl {
		delete(s.m, old)
		return successor{}, false
	}
	return v, ok
}
