package backendtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// testEmpty: a new store has nothing, and says so with the right errors.
func testEmpty(t *testing.T, open Opener) {
	ctx := context.Background()
	s := newStore(t, open)
	qs, err := s.Queues(ctx)
	if err != nil || len(qs) != 0 {
		t.Errorf("Queues = %v, %v; want none", queueNames(qs), err)
	}
	wantCounts(t, s, nil)
	if n := maxID(t, s); n != 0 {
		t.Errorf("MaxID of a new store = %d, want 0", n)
	}
	if d, ok, err := s.NextDue(ctx); err != nil || ok {
		t.Errorf("NextDue = %v, %v, %v; want ok=false", d, ok, err)
	}
	if ms, err := s.Due(ctx, at(1000*time.Hour), 10); err != nil || len(ms) != 0 {
		t.Errorf("Due = %v, %v; want none", ids(ms), err)
	}
	wantNoLookup(t, s, "q", "m", false)
	wantNoLookup(t, s, "q", "m", true)
	wantNoBody(t, s, 1)
	if err := s.DeleteQueue(ctx, "q"); !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("DeleteQueue of an unknown queue = %v, want ErrNotFound", err)
	}
	// List of an unknown queue: the contract does not say whether that is
	// an error, only that there is nothing to list.
	calls := 0
	_ = s.List(ctx, "q", ready, func(queuecore.Message) bool { calls++; return true })
	if calls != 0 {
		t.Errorf("List of an unknown queue called fn %d times", calls)
	}
}

// testQueues: PutQueue creates and replaces; Queues lists by name.
func testQueues(t *testing.T, open Opener) {
	ctx := context.Background()
	s := newStore(t, open)
	// Byte order of names: uppercase before lowercase, '-' < '.' < digits < '_'.
	names := []string{"zeta", "alpha", "a_b", "a.b", "a-b", "Z9", "a0", "alpha.dlq"}
	var want []queuecore.QueueInfo
	for i, n := range names {
		q := queueInfo(n)
		q.UID, q.GID, q.Mode = uint32(1000+i), uint32(2000+i), 0o700|uint32(i)
		q.CreatedAt = at(time.Duration(i) * time.Millisecond)
		if err := s.PutQueue(ctx, q); err != nil {
			t.Fatalf("PutQueue(%q): %v", n, err)
		}
		want = append(want, q)
	}
	slices.SortFunc(want, func(a, b queuecore.QueueInfo) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	wantQueues(t, s, want)

	// Replacing a queue changes its policy and permissions and keeps its
	// messages.
	mustApply(t, s, ins(msg(1, "alpha", "m1", ready)), ins(msg(2, "alpha", "m2", dead)))
	repl := want[queueIndex(want, "alpha")]
	repl.Policy = []byte(`{"paused":true}`)
	repl.UID, repl.GID, repl.Mode = 0, 0, 0o777
	if err := s.PutQueue(ctx, repl); err != nil {
		t.Fatalf("PutQueue(replace alpha): %v", err)
	}
	qs, err := s.Queues(ctx)
	if err != nil {
		t.Fatalf("Queues: %v", err)
	}
	if !slices.Equal(queueNames(qs), queueNames(want)) {
		t.Fatalf("after replacing alpha, Queues = %v, want %v", queueNames(qs), queueNames(want))
	}
	got := qs[queueIndex(qs, "alpha")]
	// CreatedAt on replace: the contract names only policy and
	// permissions, so either the old or the new time is fine.
	got.CreatedAt = repl.CreatedAt
	if d := diffQueue(repl, got); d != "" {
		t.Errorf("after replace: %s", d)
	}
	wantList(t, s, "alpha", ready, withSize(msg(1, "alpha", "m1", ready)))
	wantList(t, s, "alpha", dead, withSize(msg(2, "alpha", "m2", dead)))
	wantBody(t, s, 1, body(1))

	// An empty policy round-trips as empty, not as an error.
	q := queueInfo("empty-policy")
	q.Policy = nil
	if err := s.PutQueue(ctx, q); err != nil {
		t.Fatalf("PutQueue with no policy: %v", err)
	}
	qs, _ = s.Queues(ctx)
	if i := queueIndex(qs, "empty-policy"); i < 0 || len(qs[i].Policy) != 0 {
		t.Errorf("queue with an empty policy: got %v", qs)
	}
}

func queueIndex(qs []queuecore.QueueInfo, name string) int {
	return slices.IndexFunc(qs, func(q queuecore.QueueInfo) bool { return q.Name == name })
}

// wantQueues checks Queues against want, in order, every field.
func wantQueues(t *testing.T, s queuecore.Store, want []queuecore.QueueInfo) {
	t.Helper()
	got, err := s.Queues(context.Background())
	if err != nil {
		t.Fatalf("Queues: %v", err)
	}
	if !slices.Equal(queueNames(got), queueNames(want)) {
		t.Fatalf("Queues = %v, want %v (sorted by name)", queueNames(got), queueNames(want))
	}
	for i := range want {
		if d := diffQueue(want[i], got[i]); d != "" {
			t.Error(d)
		}
	}
}

// testDeleteQueue: a queue goes with all its messages, in every state, and
// nothing of another queue goes with it.
func testDeleteQueue(t *testing.T, open Opener) {
	ctx := context.Background()
	s := newStore(t, open)
	putQueues(t, s, "doomed", "kept")
	var doomed, kept []queuecore.Message
	id := uint64(0)
	for _, st := range queuecore.States {
		for k := range 2 {
			name := fmt.Sprintf("%s-%d", st, k) // the same name in both queues
			id++
			doomed = append(doomed, msg(id, "doomed", name, st))
			id++
			kept = append(kept, msg(id, "kept", name, st))
		}
	}
	var ops []queuecore.Op
	for i := range doomed {
		ops = append(ops, ins(doomed[i]), ins(kept[i]))
	}
	mustApply(t, s, ops...)
	maxBefore := maxID(t, s)

	if err := s.DeleteQueue(ctx, "doomed"); err != nil {
		t.Fatalf("DeleteQueue: %v", err)
	}
	wantQueues(t, s, []queuecore.QueueInfo{queueInfo("kept")})
	for _, m := range doomed {
		wantNoBody(t, s, m.ID)
		wantNoLookup(t, s, "doomed", m.Name, m.State == archived)
	}
	for _, st := range queuecore.States {
		calls := 0
		_ = s.List(ctx, "doomed", st, func(queuecore.Message) bool { calls++; return true })
		if calls != 0 {
			t.Errorf("List(doomed, %s) after DeleteQueue called fn %d times", st, calls)
		}
	}
	for _, m := range kept {
		wantLookup(t, s, withSize(m))
		wantBody(t, s, m.ID, body(m.ID))
	}
	want := map[string]map[queuecore.State]queuecore.Count{"kept": {}}
	for _, m := range kept {
		c := want["kept"][m.State]
		c.N++
		c.Bytes += int64(len(body(m.ID)))
		want["kept"][m.State] = c
	}
	wantCounts(t, s, want)
	// Due and NextDue forget the deleted queue's leased and delayed messages.
	due, err := s.Due(ctx, at(1000*time.Hour), 100)
	if err != nil {
		t.Fatalf("Due: %v", err)
	}
	for _, m := range due {
		if m.Queue == "doomed" {
			t.Errorf("Due after DeleteQueue returned message %d of the deleted queue", m.ID)
		}
	}
	if len(due) != 4 {
		t.Errorf("Due after DeleteQueue = %v, want the 4 leased and delayed messages of kept", ids(due))
	}
	// IDs are never reused, so MaxID remembers the deleted messages.
	if n := maxID(t, s); n < maxBefore {
		t.Errorf("MaxID after DeleteQueue = %d, was %d", n, maxBefore)
	}
	if err := s.DeleteQueue(ctx, "doomed"); !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("second DeleteQueue = %v, want ErrNotFound", err)
	}
	if err := s.DeleteQueue(ctx, "never"); !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("DeleteQueue(never) = %v, want ErrNotFound", err)
	}
	// Inserting into the deleted queue fails; re-created, it starts empty
	// and the old names are free.
	if err := s.Apply(ctx, []queuecore.Op{ins(msg(100, "doomed", "x", ready))}); !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("insert into a deleted queue = %v, want ErrNotFound", err)
	}
	putQueues(t, s, "doomed")
	wantList(t, s, "doomed", ready)
	re := msg(101, "doomed", doomed[0].Name, doomed[0].State)
	mustApply(t, s, ins(re))
	wantLookup(t, s, withSize(re))
	// An empty queue can be deleted too.
	putQueues(t, s, "empty")
	if err := s.DeleteQueue(ctx, "empty"); err != nil {
		t.Errorf("DeleteQueue of an empty queue: %v", err)
	}
}

// withSize is m with the Size that ins gives it.
func withSize(m queuecore.Message) queuecore.Message {
	m.Size = int64(len(body(m.ID)))
	return m
}
