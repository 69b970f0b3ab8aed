package fusefs

import (
	"sync"

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
type placements struct {
	mu sync.Mutex
	m  map[uint64]placement
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
	if ok && pl.state != s {
		pl.gen++
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
