package backendtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// SharedOpener opens a new instance of a shared store on the data named by
// dir: two calls with the same dir give two instances on the same data, as
// two daemons would have (for the postgres store, two Stores on the same
// database).
type SharedOpener func(ctx context.Context, dir string) (queuecore.SharedStore, error)

// RunShared tests what a queuecore.SharedStore adds to the Store contract,
// with two instances of the store on the same data: revision checks on
// update and delete (ErrConflict, wrapping ErrNotFound, and nothing of the
// batch applied), current revisions in every read, ReserveIDs blocks that
// never overlap, LeaseNext exactly once under concurrency and in delivery
// order, change hints heard by the other instance only, and the duty held
// by one instance at a time and taken over when its holder closes. Run the
// Store contract itself with Run.
func RunShared(t *testing.T, open SharedOpener) {
	t.Helper()
	suites := []struct {
		name string
		run  func(*testing.T, SharedOpener)
	}{
		{"UpdateConflict", testUpdateConflict},
		{"DeleteConflict", testDeleteConflict},
		{"BatchConflict", testBatchConflict},
		{"Revisions", testRevisions},
		{"ReserveIDs", testReserveIDs},
		{"LeaseNextOrder", testLeaseNextOrder},
		{"LeaseNextOnce", testLeaseNextOnce},
		{"Subscribe", testSubscribe},
		{"Duty", testDuty},
		{"DeleteEmptyQueue", testDeleteEmptyQueue},
		{"CreateUpdateQueue", testCreateUpdateQueue},
	}
	for _, s := range suites {
		t.Run(s.name, func(t *testing.T) { s.run(t, open) })
	}
}

// openPair opens two instances on one new data set, closed at the end of
// the test (unless the test closes them first).
func openPair(t *testing.T, open SharedOpener) (queuecore.SharedStore, queuecore.SharedStore) {
	t.Helper()
	dir := t.TempDir()
	return openShared(t, open, dir), openShared(t, open, dir)
}

func openShared(t *testing.T, open SharedOpener, dir string) queuecore.SharedStore {
	t.Helper()
	s, err := open(context.Background(), dir)
	if err != nil {
		t.Fatalf("open shared store on %s: %v", dir, err)
	}
	if s == nil {
		t.Fatalf("open shared store on %s: nil store and nil error", dir)
	}
	cs := &closeOnceShared{SharedStore: s}
	t.Cleanup(func() {
		if err := cs.Close(); err != nil {
			t.Errorf("close shared store: %v", err)
		}
	})
	return cs
}

type closeOnceShared struct {
	queuecore.SharedStore
	once sync.Once
	err  error
}

func (c *closeOnceShared) Close() error {
	c.once.Do(func() { c.err = c.SharedStore.Close() })
	return c.err
}

// wantConflict checks that err is ErrConflict, which is also ErrNotFound.
func wantConflict(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, queuecore.ErrConflict) || !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("%s = %v, want ErrConflict (and so ErrNotFound)", what, err)
	}
}

// testUpdateConflict: two daemons read the same message and both update
// it; the first wins, the second gets ErrConflict and changes nothing.
func testUpdateConflict(t *testing.T, open SharedOpener) {
	ctx := context.Background()
	s1, s2 := openPair(t, open)
	putQueues(t, s1, "a")
	mustApply(t, s1, ins(msg(1, "a", "m1", ready)))

	r1, r2 := lookup(t, s1, "a", "m1", false), lookup(t, s2, "a", "m1", false)
	if r1.Rev != 0 || r2.Rev != 0 {
		t.Fatalf("revision of a new message = %d, %d; want 0 (as inserted)", r1.Rev, r2.Rev)
	}
	won := withState(r1, leased, at(time.Hour))
	if err := s1.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: won, From: ready}}); err != nil {
		t.Fatalf("first update: %v", err)
	}
	lost := withState(r2, dead, at(2*time.Hour))
	err := s2.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: lost, From: ready}})
	wantConflict(t, "second update from the same read", err)

	won.Rev = 1
	won.Size = int64(len(body(1)))
	wantLookup(t, s2, won)
	wantLookup(t, s1, won)
	wantList(t, s2, "a", dead)

	// An update from a fresh read applies, and stores the next revision.
	fresh := lookup(t, s2, "a", "m1", false)
	next := withState(fresh, dead, at(3*time.Hour))
	if err := s2.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: next, From: leased}}); err != nil {
		t.Fatalf("update from a fresh read: %v", err)
	}
	next.Rev = 2
	wantLookup(t, s1, next)

	// An update of an unknown ID is ErrNotFound, not ErrConflict.
	err = s1.Apply(ctx, []queuecore.Op{upd(msg(99, "a", "ghost", ready))})
	if !errors.Is(err, queuecore.ErrNotFound) || errors.Is(err, queuecore.ErrConflict) {
		t.Errorf("update of an unknown ID = %v, want ErrNotFound but not ErrConflict", err)
	}
}

// testDeleteConflict: a delete checks the revision as an update does.
func testDeleteConflict(t *testing.T, open SharedOpener) {
	ctx := context.Background()
	s1, s2 := openPair(t, open)
	putQueues(t, s1, "a")
	mustApply(t, s1, ins(msg(1, "a", "m1", ready)))
	stale := lookup(t, s2, "a", "m1", false)
	moved := withState(lookup(t, s1, "a", "m1", false), leased, at(time.Hour))
	mustApply(t, s1, queuecore.Op{Kind: queuecore.OpUpdate, Msg: moved, From: ready})

	delOp := func(m queuecore.Message) []queuecore.Op {
		return []queuecore.Op{{Kind: queuecore.OpDelete, Msg: m, From: m.State}}
	}
	wantConflict(t, "delete at a stale revision", s2.Apply(ctx, delOp(stale)))
	wantBody(t, s1, 1, body(1))

	cur := lookup(t, s2, "a", "m1", false)
	if cur.Rev != 1 {
		t.Fatalf("revision after one update = %d, want 1", cur.Rev)
	}
	if err := s2.Apply(ctx, delOp(cur)); err != nil {
		t.Fatalf("delete at the current revision: %v", err)
	}
	wantNoLookup(t, s1, "a", "m1", false)
	wantNoBody(t, s1, 1)
	err := s1.Apply(ctx, delOp(cur))
	if !errors.Is(err, queuecore.ErrNotFound) || errors.Is(err, queuecore.ErrConflict) {
		t.Errorf("delete of a deleted message = %v, want ErrNotFound but not ErrConflict", err)
	}
}

// testBatchConflict: one stale op fails the whole batch, whatever its
// place in it.
func testBatchConflict(t *testing.T, open SharedOpener) {
	ctx := context.Background()
	s1, s2 := openPair(t, open)
	putQueues(t, s1, "a")
	mustApply(t, s1, ins(msg(1, "a", "m1", ready)), ins(msg(2, "a", "m2", ready)), ins(msg(3, "a", "m3", ready)))
	stale := lookup(t, s2, "a", "m3", false)
	mustApply(t, s1, queuecore.Op{Kind: queuecore.OpUpdate, Msg: withState(stale, delayed, at(time.Hour)), From: ready})
	before, err := readSnapshot(ctx, s1)
	if err != nil {
		t.Fatal(err)
	}
	good2 := withState(lookup(t, s2, "a", "m2", false), leased, at(time.Hour))
	for _, place := range []string{"first", "last"} {
		ops := []queuecore.Op{
			ins(msg(10, "a", "new", ready)),
			{Kind: queuecore.OpDelete, Msg: lookup(t, s2, "a", "m1", false), From: ready},
			{Kind: queuecore.OpUpdate, Msg: good2, From: ready},
		}
		bad := queuecore.Op{Kind: queuecore.OpUpdate, Msg: withState(stale, dead, at(time.Hour)), From: ready}
		if place == "first" {
			ops = append([]queuecore.Op{bad}, ops...)
		} else {
			ops = append(ops, bad)
		}
		wantConflict(t, "batch with a stale update "+place, s2.Apply(ctx, ops))
		after, err := readSnapshot(ctx, s1)
		if err != nil {
			t.Fatal(err)
		}
		wantSnapshot(t, "after a batch with a stale update "+place, before, after, false)
	}
}

// testRevisions: Lookup, List, Due and Body agree on the current revision,
// which an insert takes as given and every update raises by one.
func testRevisions(t *testing.T, open SharedOpener) {
	ctx := context.Background()
	s1, s2 := openPair(t, open)
	putQueues(t, s1, "a")
	m := msg(1, "a", "m1", ready)
	m.Rev = 7 // an insert stores what it is given
	mustApply(t, s1, ins(m))
	m = withSize(m)
	wantLookup(t, s2, m)
	for i := range 3 {
		m = withState(m, []queuecore.State{leased, delayed, leased}[i], at(time.Duration(i)*time.Minute))
		mustApply(t, s1, queuecore.Op{Kind: queuecore.OpUpdate, Msg: m, From: m.State})
		m.Rev++
		wantLookup(t, s2, m)
		wantList(t, s2, "a", m.State, m)
		due, err := s2.Due(ctx, m.Deadline, 10)
		if err != nil || len(due) != 1 {
			t.Fatalf("Due = %v, %v; want message 1", ids(due), err)
		}
		checkMessage(t, "Due", m, due[0])
	}
	if m.Rev != 10 {
		t.Fatalf("test bug: revision %d", m.Rev)
	}
}

// testReserveIDs: blocks reserved from two instances and many goroutines
// at once never overlap, and lie above the IDs in the store.
func testReserveIDs(t *testing.T, open SharedOpener) {
	ctx := context.Background()
	s1, s2 := openPair(t, open)
	putQueues(t, s1, "a")
	mustApply(t, s1, ins(msg(5000, "a", "given", ready)))
	for _, n := range []int{0, -1} {
		if _, err := s1.ReserveIDs(ctx, n); err == nil {
			t.Errorf("ReserveIDs(%d) succeeded", n)
		}
	}
	type block struct{ first, n uint64 }
	var (
		mu     sync.Mutex
		blocks []block
		wg     sync.WaitGroup
	)
	for g := range 8 {
		s := []queuecore.SharedStore{s1, s2}[g%2]
		wg.Go(func() {
			for i := range 25 {
				n := 1 + (g*31+i*17)%100
				first, err := s.ReserveIDs(ctx, n)
				if err != nil {
					t.Errorf("ReserveIDs(%d): %v", n, err)
					return
				}
				mu.Lock()
				blocks = append(blocks, block{first, uint64(n)})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.SortFunc(blocks, func(a, b block) int {
		switch {
		case a.first < b.first:
			return -1
		case a.first > b.first:
			return 1
		}
		return 0
	})
	if len(blocks) > 0 && blocks[0].first <= 5000 {
		t.Errorf("ReserveIDs handed out %d, not above ID 5000 in the store", blocks[0].first)
	}
	for i := 1; i < len(blocks); i++ {
		if p := blocks[i-1]; p.first+p.n > blocks[i].first {
			t.Errorf("blocks [%d, +%d) and [%d, +%d) overlap", p.first, p.n, blocks[i].first, blocks[i].n)
		}
	}
}

// leaseChange is what a lease does to a ready message.
func leaseChange(m queuecore.Message) queuecore.Message {
	m = withState(m, leased, at(time.Hour))
	m.Consumer = "test"
	return m
}

// testLeaseNextOrder: LeaseNext takes ready messages by priority then Seq,
// skips the names it is given and the other states and queues, stores and
// returns the change with the next revision, and is ErrEmpty at the end.
func testLeaseNextOrder(t *testing.T, open SharedOpener) {
	ctx := context.Background()
	s1, s2 := openPair(t, open)
	putQueues(t, s1, "a", "b")
	var ops []queuecore.Op
	// (id, priority, seq): the delivery order is 4, 2, 5, 1, 3.
	for _, p := range [][3]int{{1, 0, 30}, {2, 5, 40}, {3, 0, 50}, {4, 9, 60}, {5, 0, 10}} {
		m := msg(uint64(p[0]), "a", fmt.Sprintf("m%d", p[0]), ready)
		m.Priority, m.Seq = p[1], uint64(p[2])
		ops = append(ops, ins(m))
	}
	ops = append(ops, ins(msg(6, "a", "leased", leased)), ins(msg(7, "a", "dead", dead)), ins(msg(8, "b", "other", ready)))
	mustApply(t, s1, ops...)

	lease := func(s queuecore.SharedStore, skip ...string) (queuecore.Message, error) {
		return s.LeaseNext(ctx, "a", skip, leaseChange)
	}
	got, err := lease(s2, "m4", "nonexistent")
	if err != nil {
		t.Fatalf("LeaseNext skipping m4: %v", err)
	}
	if got.ID != 2 {
		t.Errorf("LeaseNext skipping m4 = message %d, want 2 (next by priority)", got.ID)
	}
	stored := lookup(t, s1, "a", "m2", false)
	if got.Rev != 1 || stored.Rev != 1 {
		t.Errorf("revision after LeaseNext: returned %d, stored %d; want 1", got.Rev, stored.Rev)
	}
	checkMessage(t, "LeaseNext result", stored, got)
	if got.State != leased || got.Consumer != "test" {
		t.Errorf("LeaseNext returned %s consumer %q: the change was not applied", got.State, got.Consumer)
	}
	var order []uint64
	for {
		m, err := lease([]queuecore.SharedStore{s1, s2}[len(order)%2])
		if errors.Is(err, queuecore.ErrEmpty) {
			break
		}
		if err != nil {
			t.Fatalf("LeaseNext: %v", err)
		}
		order = append(order, m.ID)
		if len(order) > 10 {
			t.Fatal("LeaseNext does not run out")
		}
	}
	if !slices.Equal(order, []uint64{4, 5, 1, 3}) {
		t.Errorf("LeaseNext order = %v, want [4 5 1 3]", order)
	}
	if n := len(list(t, s1, "a", leased)); n != 6 {
		t.Errorf("%d leased messages after leasing 5, want 6", n)
	}
	if _, err := s1.LeaseNext(ctx, "nonexistent", nil, leaseChange); !errors.Is(err, queuecore.ErrEmpty) {
		t.Errorf("LeaseNext of an unknown queue = %v, want ErrEmpty", err)
	}
	wantList(t, s1, "b", ready, withSize(msg(8, "b", "other", ready)))
}

// testLeaseNextOnce: 8 goroutines on two instances lease 200 messages at
// once; each is leased exactly once.
func testLeaseNextOnce(t *testing.T, open SharedOpener) {
	ctx := context.Background()
	s1, s2 := openPair(t, open)
	putQueues(t, s1, "a")
	const n = 200
	first, err := s1.ReserveIDs(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	var ops []queuecore.Op
	for i := range uint64(n) {
		ops = append(ops, ins(msg(first+i, "a", fmt.Sprintf("m%d", i), ready)))
	}
	mustApply(t, s1, ops...)
	var (
		mu     sync.Mutex
		leases = map[uint64]int{}
		wg     sync.WaitGroup
	)
	for g := range 8 {
		s := []queuecore.SharedStore{s1, s2}[g%2]
		wg.Go(func() {
			for range 2 * n {
				m, err := s.LeaseNext(ctx, "a", nil, leaseChange)
				if errors.Is(err, queuecore.ErrEmpty) {
					return
				}
				if err != nil {
					t.Errorf("worker %d: LeaseNext: %v", g, err)
					return
				}
				mu.Lock()
				leases[m.ID]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(leases) != n {
		t.Errorf("%d messages leased, want %d", len(leases), n)
	}
	for id, k := range leases {
		if k != 1 {
			t.Errorf("message %d leased %d times", id, k)
		}
	}
	wantList(t, s2, "a", ready)
	for _, m := range list(t, s2, "a", leased) {
		if m.Rev != 1 {
			t.Errorf("message %d at revision %d after one lease, want 1", m.ID, m.Rev)
		}
	}
}

// changeLog records the changes a store hears.
type changeLog struct {
	mu sync.Mutex
	cs []queuecore.Change
}

func (l *changeLog) add(c queuecore.Change) {
	l.mu.Lock()
	l.cs = append(l.cs, c)
	l.mu.Unlock()
}

func (l *changeLog) get() []queuecore.Change {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.cs)
}

// waitFor polls until l holds want (as its last changes) or 10s pass.
func (l *changeLog) waitFor(t *testing.T, who string, want ...queuecore.Change) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := l.get()
		for i := range got {
			if slices.Equal(got[i:], want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s heard %v, want it to end with %v", who, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testSubscribe: each instance hears the other's changes, with their
// states, and queue changes with no name; never its own.
func testSubscribe(t *testing.T, open SharedOpener) {
	ctx := context.Background()
	s1, s2 := openPair(t, open)
	var h1, h2 changeLog
	s1.Subscribe(h1.add)
	s2.Subscribe(h2.add)

	putQueues(t, s1, "a")
	h2.waitFor(t, "s2", queuecore.Change{Queue: "a"})
	m := msg(1, "a", "m1", ready)
	mustApply(t, s1, ins(m), ins(msg(2, "a", "m2", ready)))
	h2.waitFor(t, "s2", queuecore.Change{Queue: "a", Name: "m1", To: ready}, queuecore.Change{Queue: "a", Name: "m2", To: ready})
	m = withState(lookup(t, s1, "a", "m1", false), delayed, at(time.Hour))
	mustApply(t, s1, queuecore.Op{Kind: queuecore.OpUpdate, Msg: m, From: ready})
	h2.waitFor(t, "s2", queuecore.Change{Queue: "a", Name: "m1", From: ready, To: delayed})
	m = lookup(t, s1, "a", "m1", false)
	mustApply(t, s1, queuecore.Op{Kind: queuecore.OpDelete, Msg: m, From: delayed})
	h2.waitFor(t, "s2", queuecore.Change{Queue: "a", Name: "m1", From: delayed})

	// The other way: a lease by s2, a queue replaced and one deleted.
	if _, err := s2.LeaseNext(ctx, "a", nil, leaseChange); err != nil {
		t.Fatalf("LeaseNext: %v", err)
	}
	h1.waitFor(t, "s1", queuecore.Change{Queue: "a", Name: "m2", From: ready, To: leased})
	putQueues(t, s2, "b", "a")
	if err := s2.DeleteQueue(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	h1.waitFor(t, "s1", queuecore.Change{Queue: "b"}, queuecore.Change{Queue: "a"}, queuecore.Change{Queue: "b"})
	// Hints come in commit order, so s1 has heard by now whatever it
	// would of its own changes, made before s2's: it must have heard
	// s2's only.
	want1 := []queuecore.Change{{Queue: "a", Name: "m2", From: ready, To: leased}, {Queue: "b"}, {Queue: "a"}, {Queue: "b"}}
	if got := h1.get(); !slices.Equal(got, want1) {
		t.Errorf("s1 heard %v, want %v (s2's changes only)", got, want1)
	}
	// The same for s2, once it has heard a last change of s1.
	putQueues(t, s1, "c")
	h2.waitFor(t, "s2", queuecore.Change{Queue: "c"})
	want2 := []queuecore.Change{{Queue: "a"}, {Queue: "a", Name: "m1", To: ready}, {Queue: "a", Name: "m2", To: ready},
		{Queue: "a", Name: "m1", From: ready, To: delayed}, {Queue: "a", Name: "m1", From: delayed}, {Queue: "c"}}
	if got := h2.get(); !slices.Equal(got, want2) {
		t.Errorf("s2 heard %v, want %v (s1's changes only)", got, want2)
	}
}

// testDuty: one instance of two holds the duty, never both; when it
// closes, the other takes it over within seconds.
func testDuty(t *testing.T, open SharedOpener) {
	s1, s2 := openPair(t, open)
	var holder, other queuecore.SharedStore
	deadline := time.Now().Add(10 * time.Second)
	for holder == nil {
		d1, d2 := s1.Duty(), s2.Duty()
		switch {
		case d1 && d2:
			t.Fatal("both instances hold the duty")
		case d1:
			holder, other = s1, s2
		case d2:
			holder, other = s2, s1
		}
		if time.Now().After(deadline) {
			t.Fatal("no instance took the duty within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// It stays where it is.
	for range 100 {
		if !holder.Duty() || other.Duty() {
			t.Fatalf("duty moved without cause: holder %v, other %v", holder.Duty(), other.Duty())
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	if err := holder.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if holder.Duty() {
		t.Error("a closed store reports the duty")
	}
	for !other.Duty() {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the other instance did not take the duty within 10s of the holder's Close")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("duty taken over %v after Close", time.Since(start).Round(time.Millisecond))
}

// testDeleteEmptyQueue: a queue goes only when empty, and a publish of
// another instance racing the delete is either kept (the delete fails
// with ErrNotEmpty) or refused (ErrNotFound): never deleted with the queue.
func testDeleteEmptyQueue(t *testing.T, open SharedOpener) {
	ctx := context.Background()
	s1, s2 := openPair(t, open)
	putQueues(t, s1, "a")
	mustApply(t, s1, ins(msg(1, "a", "m1", ready)))
	if err := s2.DeleteEmptyQueue(ctx, "a"); !errors.Is(err, queuecore.ErrNotEmpty) {
		t.Fatalf("delete of a queue holding a message = %v, want ErrNotEmpty", err)
	}
	wantBody(t, s1, 1, body(1))
	if err := s2.DeleteEmptyQueue(ctx, "nope"); !errors.Is(err, queuecore.ErrNotFound) {
		t.Fatalf("delete of no queue = %v, want ErrNotFound", err)
	}
	cur := lookup(t, s1, "a", "m1", false)
	mustApply(t, s1, queuecore.Op{Kind: queuecore.OpDelete, Msg: cur, From: cur.State})
	if err := s2.DeleteEmptyQueue(ctx, "a"); err != nil {
		t.Fatalf("delete of an empty queue: %v", err)
	}

	// The race, many times: s1 publishes while s2 deletes.
	for round := 0; round < 20; round++ {
		q := fmt.Sprintf("r%d", round)
		putQueues(t, s1, q)
		id := uint64(100 + round)
		pub := make(chan error, 1)
		go func() { pub <- s1.Apply(ctx, []queuecore.Op{ins(msg(id, q, "x", ready))}) }()
		derr := s2.DeleteEmptyQueue(ctx, q)
		perr := <-pub
		switch {
		case perr == nil && derr == nil:
			t.Fatalf("round %d: the publish committed and the queue was deleted: a committed message lost", round)
		case perr == nil && !errors.Is(derr, queuecore.ErrNotEmpty):
			t.Fatalf("round %d: publish committed, delete = %v, want ErrNotEmpty", round, derr)
		case perr == nil:
			wantBody(t, s2, id, body(id))
		case !errors.Is(perr, queuecore.ErrNotFound):
			t.Fatalf("round %d: publish = %v, want nil or ErrNotFound", round, perr)
		case derr != nil:
			t.Fatalf("round %d: publish refused (%v) and delete failed (%v)", round, perr, derr)
		}
	}
}

// testCreateUpdateQueue: a queue is created once (a second daemon's mkdir
// of the same name gets ErrExists and changes nothing), updated only while
// it exists (never created again by an update after a delete).
func testCreateUpdateQueue(t *testing.T, open SharedOpener) {
	ctx := context.Background()
	s1, s2 := openPair(t, open)
	q := queueInfo("a")
	if err := s1.CreateQueue(ctx, q); err != nil {
		t.Fatalf("create: %v", err)
	}
	other := q
	other.Policy, other.Mode = []byte(`{"maxReady": 7}`), 0o700
	if err := s2.CreateQueue(ctx, other); !errors.Is(err, queuecore.ErrExists) {
		t.Fatalf("second create = %v, want ErrExists", err)
	}
	qs, err := s2.Queues(ctx)
	if err != nil || len(qs) != 1 || string(qs[0].Policy) != string(q.Policy) || qs[0].Mode != q.Mode {
		t.Fatalf("after a refused create: %+v, %v; want the first queue unchanged", qs, err)
	}
	if err := s2.UpdateQueue(ctx, other); err != nil {
		t.Fatalf("update: %v", err)
	}
	qs, err = s1.Queues(ctx)
	if err != nil || len(qs) != 1 || string(qs[0].Policy) != string(other.Policy) || qs[0].Mode != other.Mode {
		t.Fatalf("after an update: %+v, %v", qs, err)
	}
	if err := s1.DeleteEmptyQueue(ctx, "a"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := s2.UpdateQueue(ctx, other); !errors.Is(err, queuecore.ErrNotFound) {
		t.Fatalf("update of a deleted queue = %v, want ErrNotFound", err)
	}
	if qs, err := s1.Queues(ctx); err != nil || len(qs) != 0 {
		t.Fatalf("an update brought a deleted queue back: %+v, %v", qs, err)
	}
}
