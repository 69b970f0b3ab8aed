package fusefs

import (
	"testing"
	"time"

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

// successors keeps a rename's new message for ttl, and an old entry goes
// when a later add finds it expired, unless it was added again since.
func TestSuccessorsExpire(t *testing.T) {
	s := successors{ttl: 10 * time.Second}
	t0 := time.Unix(1000, 0)
	s.add(1, "q", 101, t0)
	s.add(2, "q", 102, t0.Add(time.Second))
	s.add(1, "q", 111, t0.Add(5*time.Second)) // 1 renamed again: its newest successor
	for i := uint64(10); i < 10010; i++ {
		s.add(i, "r", i+1000, t0.Add(6*time.Second))
	}
	if v, ok := s.get(1, t0.Add(12*time.Second)); !ok || v.id != 111 {
		t.Errorf("get(1) = %v, %v; want the successor added again at 5 s (111)", v, ok)
	}
	s.add(3, "q", 103, t0.Add(12*time.Second)) // drops 2 (added at 1 s), keeps 1 (added again at 5 s)
	if _, ok := s.m[2]; ok {
		t.Error("2 was kept past its ttl")
	}
	if v, ok := s.m[1]; !ok || v.id != 111 {
		t.Errorf("1 = %v, %v after the expiry of its first add; want 111", v, ok)
	}
	s.add(4, "q", 104, t0.Add(17*time.Second)) // everything up to 6 s has expired
	if len(s.m) != 2 || len(s.order) != 2 {
		t.Errorf("%d entries, %d in order, want 2 (3 and 4)", len(s.m), len(s.order))
	}
	if _, ok := s.get(4, t0.Add(28*time.Second)); ok {
		t.Error("get of an entry past its ttl found it")
	}
}
