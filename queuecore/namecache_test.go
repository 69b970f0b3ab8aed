package queuecore

import (
	"fmt"
	"testing"
)

func TestNameCacheBoundAndGenerations(t *testing.T) {
	var nc nameCache
	for i := 0; i < nameCacheMax+100; i++ {
		nc.wrote(Message{Name: fmt.Sprintf("m%d", i), State: StateReady}, false)
	}
	if n := len(nc.entries); n != nameCacheMax {
		t.Fatalf("%d entries, want the bound %d", n, nameCacheMax)
	}
	last := fmt.Sprintf("m%d", nameCacheMax+99)
	if e, ok := nc.get(last); !ok || !e.live {
		t.Fatalf("the last name written is not cached: %+v %v", e, ok)
	}

	// A read that a commit overtook is not kept.
	gen := nc.generation()
	nc.wrote(Message{Name: "x", State: StateLeased}, false)
	nc.learn(gen, "x", nameEntry{}) // stale: x was absent when read
	if e, ok := nc.get("x"); !ok || !e.live || e.m.State != StateLeased {
		t.Fatalf("a stale read replaced a commit's entry: %+v %v", e, ok)
	}
	// Gone, archived, or forgotten: no entry.
	nc.wrote(Message{Name: "x", State: StateArchived}, false)
	if _, ok := nc.get("x"); ok {
		t.Fatal("an archived message still has a live entry")
	}
	nc.wrote(Message{Name: "y", State: StateReady}, false)
	nc.wrote(Message{Name: "y"}, true)
	if _, ok := nc.get("y"); ok {
		t.Fatal("a removed message still has an entry")
	}
	nc.wrote(Message{Name: "z", State: StateDead}, false)
	gen = nc.generation()
	nc.forget("z")
	if _, ok := nc.get("z"); ok || nc.generation() == gen {
		t.Fatal("forget kept the entry or the generation")
	}
	// A read with the current generation is kept, negative ones too.
	gen = nc.generation()
	nc.learn(gen, "w", nameEntry{})
	if e, ok := nc.get("w"); !ok || e.live {
		t.Fatalf("a fresh negative read was not kept: %+v %v", e, ok)
	}
}
