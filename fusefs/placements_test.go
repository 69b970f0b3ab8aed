package fusefs

import (
	"testing"

	"yirangmq/queuecore"
)

// A generation is never given twice to one message, even after the
// record of its placement went with a FORGET: the kernel may still hold
// an older inode of it elsewhere (TestRenameLeaseRace in testenv/torture
// is the scenario through a mount).
func TestPlacementsNeverReuseGenerations(t *testing.T) {
	var p placements
	const id = 7
	p.created(id)                               // inbox/X: gen 0
	g1 := p.lookedUp(id, queuecore.StateLeased) // leased by .next, looked up in processing/
	p.forgotten(id, g1)                         // the kernel forgets processing/X's inode
	g2 := p.lookedUp(id, queuecore.StateLeased) // and looks it up again
	g3 := p.lookedUp(id, queuecore.StateReady)  // then inbox/X
	seen := map[uint64]bool{0: true}
	for _, g := range []uint64{g1, g2, g3} {
		if seen[g] {
			t.Fatalf("generation %d given twice (gens 0, %d, %d, %d)", g, g1, g2, g3)
		}
		seen[g] = true
	}
	if g := p.lookedUp(id, queuecore.StateReady); g != g3 {
		t.Errorf("a lookup where the kernel last saw it changed the generation: %d, want %d", g, g3)
	}
}
