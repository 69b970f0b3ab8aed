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

func TestNameCacheComplete(t *testing.T) {
	var nc nameCache
	nc.fill([]Message{{Name: "a", State: StateReady}})
	if e, ok := nc.get("b"); !ok || e.live {
		t.Fatalf("a complete cache does not know b is free: %+v %v", e, ok)
	}
	if e, ok := nc.get("a"); !ok || !e.live {
		t.Fatalf("a complete cache lost a: %+v %v", e, ok)
	}
	nc.wrote(Message{Name: "b", State: StateReady}, false)
	if e, ok := nc.get("b"); !ok || !e.live {
		t.Fatalf("b published but not known: %+v %v", e, ok)
	}
	nc.forget("b") // a failed commit: b may be in the store or not
	if _, ok := nc.get("c"); ok {
		t.Fatal("after forget the cache still claims to know every name")
	}

	nc.fill(nil)
	for i := 0; i <= nameCacheMax; i++ {
		nc.wrote(Message{Name: fmt.Sprintf("m%d", i), State: StateReady}, false)
	}
	if nc.complete {
		t.Fatal("a cache that had to drop an entry still claims to know every name")
	}
	if _, ok := nc.get("never-published"); ok {
		t.Fatal("an incomplete cache answered for a name it does not hold")
	}
}
