package backendtest

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// testLookup: live names and archived names are looked up apart.
func testLookup(t *testing.T, open Opener) {
	s := newStore(t, open)
	putQueues(t, s, "a", "b")
	var all []queuecore.Message
	for i, st := range queuecore.States {
		all = append(all, withSize(msg(uint64(i+1), "a", "in-"+st.String(), st)))
	}
	twinLive := withSize(msg(10, "a", "twin", dead))
	twinArch := withSize(msg(11, "a", "twin", archived))
	elsewhere := withSize(msg(12, "b", "only-in-b", ready))
	all = append(all, twinLive, twinArch, elsewhere)
	var ops []queuecore.Op
	for _, m := range all {
		ops = append(ops, ins(m))
	}
	mustApply(t, s, ops...)

	for _, m := range all {
		wantLookup(t, s, m)
		if m.Name != "twin" {
			// Only its own side finds it.
			wantNoLookup(t, s, m.Queue, m.Name, m.State != archived)
		}
	}
	wantNoLookup(t, s, "a", "only-in-b", false)
	wantNoLookup(t, s, "nope", "in-inbox", false)
	wantNoLookup(t, s, "a", "In-inbox", false)
	wantNoLookup(t, s, "a", "in-inbo", false)
	wantNoLookup(t, s, "a", "", false)
}

// testBody: bodies come back byte for byte, whatever their size, and stay
// with their message through updates and other messages' deletes.
func testBody(t *testing.T, open Opener) {
	s := newStore(t, open)
	putQueues(t, s, "a", "b")
	bodies := map[uint64][]byte{
		1: nil,
		2: {},
		3: {0},
		4: []byte("\n"),
		5: randomBytes(5, 4096),
		6: randomBytes(6, 1<<20), // 1 MiB
		7: []byte("not\x00a\x00string\r\n\xff\xfe"),
		8: randomBytes(8, 64<<10+1),
	}
	wantBodies := func(t *testing.T) {
		t.Helper()
		for id, b := range bodies {
			wantBody(t, s, id, b)
		}
	}
	for id, b := range bodies {
		mustApply(t, s, insertOp(msg(id, "a", fmt.Sprintf("m%d", id), ready), b))
	}
	wantBodies(t)
	var total int64
	for _, b := range bodies {
		total += int64(len(b))
	}
	wantCounts(t, s, map[string]map[queuecore.State]queuecore.Count{"a": {ready: {N: int64(len(bodies)), Bytes: total}}})
	for id, b := range bodies {
		m := lookup(t, s, "a", fmt.Sprintf("m%d", id), false)
		if m.Size != int64(len(b)) {
			t.Errorf("message %d: Size = %d, want %d", id, m.Size, len(b))
		}
	}

	// Updates keep the body: state, queue and name all change.
	for id := range bodies {
		m := lookup(t, s, "a", fmt.Sprintf("m%d", id), false)
		m = withState(m, leased, at(time.Hour))
		mustApply(t, s, queuecore.Op{Kind: queuecore.OpUpdate, Msg: m})
		m = withState(m, archived, at(2*time.Hour))
		m.Queue, m.Name = "b", fmt.Sprintf("renamed%d", id)
		mustApply(t, s, queuecore.Op{Kind: queuecore.OpUpdate, Msg: m})
	}
	wantBodies(t)

	// Deleting one message leaves the others' bodies alone.
	mustApply(t, s, del(6))
	delete(bodies, 6)
	wantNoBody(t, s, 6)
	wantBodies(t)

	// An insert after a delete gets its own body, not a stale one.
	mustApply(t, s, insertOp(msg(9, "a", "m6", ready), []byte("fresh")))
	wantBody(t, s, 9, []byte("fresh"))
}

// fullMessage has every field set, with values that trip common encodings:
// nanoseconds, a large ID and Seq, a negative priority, the largest uid.
func fullMessage() queuecore.Message {
	return queuecore.Message{
		ID:            1<<40 + 7,
		Queue:         "q",
		Name:          "full",
		State:         leased,
		Seq:           1<<41 + 3,
		Priority:      -7,
		Size:          int64(len(body(1<<40 + 7))),
		MessageID:     "0b6f1c1e-6f2a-4f43-9c1d-2b7a1c9e8d01",
		PublishedAt:   at(time.Nanosecond),
		FirstAt:       at(-48 * time.Hour).In(time.UTC),
		StateAt:       at(2*time.Second + 999*time.Nanosecond),
		Deadline:      at(30*time.Second + 1).In(time.FixedZone("", -7*60*60)),
		Attempts:      3,
		Redrives:      2,
		Reason:        queuecore.ReasonNacked,
		ReasonMessage: "handler said: ünïcode\nsecond line",
		FailedAt:      at(time.Second + time.Nanosecond),
		Consumer:      "uid 1000 pid 4242 worker --flag",
		DedupKey:      "device-001:1705112460",
		UID:           math.MaxUint32,
		GID:           65534,
	}
}

// testFields: every Message field round-trips through Lookup, List and Due,
// on insert and on update; zero times stay zero.
func testFields(t *testing.T, open Opener) {
	ctx := context.Background()
	s := newStore(t, open)
	putQueues(t, s, "q", "r")
	full := fullMessage()
	mustApply(t, s, insertOp(full, body(full.ID)))

	check := func(t *testing.T, want queuecore.Message) {
		t.Helper()
		wantLookup(t, s, want)
		wantList(t, s, want.Queue, want.State, want)
		if want.State == leased || want.State == delayed {
			due, err := s.Due(ctx, want.Deadline, 10)
			if err != nil || len(due) != 1 {
				t.Fatalf("Due = %v, %v; want message %d", ids(due), err, want.ID)
			}
			checkMessage(t, "Due", want, due[0])
		}
	}
	t.Run("insert", func(t *testing.T) { check(t, full) })

	// An update that changes every field, zeroing the times and strings
	// that may be zero.
	changed := queuecore.Message{
		ID:          full.ID,
		Queue:       "r",
		Name:        "changed",
		State:       archived,
		Seq:         full.Seq + 1,
		Priority:    1 << 30,
		Size:        full.Size,
		MessageID:   "other",
		PublishedAt: at(time.Minute),
		FirstAt:     at(time.Minute),
		StateAt:     at(time.Hour),
		Attempts:    0,
		Redrives:    0,
		UID:         0,
		GID:         0,
	}
	mustApply(t, s, queuecore.Op{Kind: queuecore.OpUpdate, Msg: changed})
	t.Run("update", func(t *testing.T) {
		check(t, changed)
		for _, m := range list(t, s, "r", archived) {
			for name, tm := range map[string]time.Time{"Deadline": m.Deadline, "FailedAt": m.FailedAt} {
				if !tm.IsZero() {
					t.Errorf("%s = %v after an update that zeroed it", name, tm)
				}
			}
		}
	})

	// A message with nothing but the required fields.
	bare := queuecore.Message{ID: 5, Queue: "q", Name: "bare", State: dead}
	mustApply(t, s, insertOp(bare, nil))
	t.Run("zero", func(t *testing.T) {
		got := lookup(t, s, "q", "bare", false)
		checkMessage(t, "Lookup(bare)", bare, got)
		for name, tm := range map[string]time.Time{"PublishedAt": got.PublishedAt, "FirstAt": got.FirstAt,
			"StateAt": got.StateAt, "Deadline": got.Deadline, "FailedAt": got.FailedAt} {
			if !tm.IsZero() {
				t.Errorf("zero %s came back as %v", name, tm)
			}
		}
	})

	// Every state and a priority at both ends of int32.
	for i, st := range queuecore.States {
		m := fullMessage()
		m.ID, m.Seq, m.Name, m.State = uint64(100+i), uint64(200+i), "state-"+st.String(), st
		m.Priority = []int{math.MaxInt32, math.MinInt32, 0, 1, -1}[i]
		if st != leased && st != delayed {
			m.Deadline = time.Time{}
		}
		mustApply(t, s, insertOp(m, body(m.ID)))
		t.Run(st.String(), func(t *testing.T) {
			m.Size = int64(len(body(m.ID)))
			wantLookup(t, s, m)
		})
	}
}

// sortMessages sorts ms the way List must: by (SortKey, Seq).
func sortMessages(ms []queuecore.Message) {
	slices.SortStableFunc(ms, func(a, b queuecore.Message) int {
		return cmp.Or(cmp.Compare(a.SortKey(), b.SortKey()), cmp.Compare(a.Seq, b.Seq))
	})
}

// testList: List orders every state by (SortKey, Seq). Every message has a
// random priority, state time and Seq, so that a store sorting by the wrong
// key is caught; keys collide often, so that the Seq tie-break is tested.
func testList(t *testing.T, open Opener) {
	s := newStore(t, open)
	putQueues(t, s, "a", "b")
	r := rand.New(rand.NewPCG(1, 2))
	seqs := r.Perm(1000)
	var all []queuecore.Message
	id := uint64(0)
	for _, q := range []string{"a", "b"} {
		for _, st := range queuecore.States {
			for range 15 {
				id++
				m := msg(id, q, fmt.Sprintf("m%d", id), st)
				m.Seq = uint64(seqs[id] + 1)
				m.Priority = r.IntN(4) - 1
				m.StateAt = at(time.Duration(r.IntN(4)) * time.Second)
				if st == leased || st == delayed {
					m.Deadline = at(time.Duration(r.IntN(4)) * time.Second)
				}
				all = append(all, withSize(m))
			}
		}
	}
	// Inserted in random order, in batches of various sizes.
	r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	for i := 0; i < len(all); {
		n := min(1+r.IntN(7), len(all)-i)
		var ops []queuecore.Op
		for _, m := range all[i : i+n] {
			ops = append(ops, ins(m))
		}
		mustApply(t, s, ops...)
		i += n
	}
	wantSorted := func(t *testing.T, q string, st queuecore.State) {
		t.Helper()
		var want []queuecore.Message
		for _, m := range all {
			if m.Queue == q && m.State == st {
				want = append(want, m)
			}
		}
		sortMessages(want)
		wantList(t, s, q, st, want...)
	}
	for _, st := range queuecore.States {
		t.Run(st.String(), func(t *testing.T) {
			for _, q := range []string{"a", "b"} {
				wantSorted(t, q, st)
			}
		})
	}

	// A ready message that re-enters inbox/ gets a new, larger Seq and goes
	// to the end of its priority; a delayed one whose deadline moves moves.
	t.Run("after update", func(t *testing.T) {
		for i := range all {
			m := &all[i]
			switch {
			case m.Queue == "a" && m.State == ready && m.Priority == 0:
				m.Seq += 2000
				mustApply(t, s, upd(*m))
			case m.Queue == "a" && m.State == delayed:
				m.Deadline = m.Deadline.Add(-time.Duration(m.ID) * time.Millisecond)
				mustApply(t, s, upd(*m))
			}
		}
		wantSorted(t, "a", ready)
		wantSorted(t, "a", delayed)
	})
}

// testListStop: List stops when fn returns false.
func testListStop(t *testing.T, open Opener) {
	ctx := context.Background()
	s := newStore(t, open)
	putQueues(t, s, "a")
	var ops []queuecore.Op
	for id := uint64(1); id <= 10; id++ {
		ops = append(ops, ins(msg(id, "a", fmt.Sprintf("m%d", id), ready)))
	}
	mustApply(t, s, ops...)
	for _, stopAfter := range []int{1, 3, 10} {
		var got []uint64
		err := s.List(ctx, "a", ready, func(m queuecore.Message) bool {
			got = append(got, m.ID)
			return len(got) < stopAfter
		})
		if err != nil {
			t.Errorf("List stopped after %d: %v", stopAfter, err)
		}
		want := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}[:stopAfter]
		if !slices.Equal(got, want) {
			t.Errorf("List stopping after %d called fn with %v, want %v", stopAfter, got, want)
		}
	}
	// The store is usable after a stopped List (no cursor left open).
	mustApply(t, s, ins(msg(11, "a", "m11", ready)))
	if n := len(list(t, s, "a", ready)); n != 11 {
		t.Errorf("List after a stopped List has %d messages, want 11", n)
	}
}

// testDue: Due and NextDue see leased and delayed messages of every queue,
// earliest first, and nothing else.
func testDue(t *testing.T, open Opener) {
	ctx := context.Background()
	s := newStore(t, open)
	putQueues(t, s, "a", "b")
	var timed []queuecore.Message // leased and delayed, by deadline
	var ops []queuecore.Op
	deadlines := []int{7, 3, 9, 1, 5, 8, 2, 6, 4, 10} // seconds, distinct
	for i, d := range deadlines {
		id := uint64(i + 1)
		m := msg(id, []string{"a", "b"}[i%2], fmt.Sprintf("t%d", id), []queuecore.State{leased, delayed}[i/2%2])
		m.Deadline = at(time.Duration(d) * time.Second)
		timed = append(timed, withSize(m))
		ops = append(ops, ins(m))
	}
	for i, st := range []queuecore.State{ready, dead, archived} {
		// Zero deadlines: a store that forgot the state filter returns them first.
		ops = append(ops, ins(msg(uint64(100+i), "a", "untimed"+st.String(), st)))
	}
	mustApply(t, s, ops...)
	slices.SortFunc(timed, func(a, b queuecore.Message) int { return a.Deadline.Compare(b.Deadline) })

	due := func(t *testing.T, tm time.Time, limit int, want []queuecore.Message) {
		t.Helper()
		got, err := s.Due(ctx, tm, limit)
		if err != nil {
			t.Fatalf("Due(%v, %d): %v", tm, limit, err)
		}
		if !slices.Equal(ids(got), ids(want)) {
			t.Errorf("Due(epoch+%v, %d) = %v, want %v", tm.Sub(epoch), limit, ids(got), ids(want))
			return
		}
		for i := range want {
			checkMessage(t, "Due", want[i], got[i])
		}
	}
	due(t, at(0), 100, nil)
	due(t, at(time.Second-1), 100, nil)
	due(t, at(time.Second), 100, timed[:1]) // at the deadline is due
	due(t, at(5*time.Second+500*time.Millisecond), 100, timed[:5])
	due(t, at(time.Hour), 100, timed)
	due(t, at(time.Hour), 3, timed[:3])
	due(t, at(4*time.Second), 10, timed[:4])
	due(t, at(4*time.Second), 1, timed[:1])

	nextDue := func(t *testing.T, want time.Time, wantOK bool) {
		t.Helper()
		got, ok, err := s.NextDue(ctx)
		if err != nil || ok != wantOK || (ok && !got.Equal(want)) {
			t.Errorf("NextDue = %v, %v, %v; want %v, %v", got, ok, err, want, wantOK)
		}
	}
	nextDue(t, timed[0].Deadline, true)
	// The earliest leaves: deleted, and moved to a state without deadline.
	mustApply(t, s, del(timed[0].ID))
	nextDue(t, timed[1].Deadline, true)
	mustApply(t, s, upd(withState(timed[1], ready, at(0))))
	nextDue(t, timed[2].Deadline, true)
	due(t, at(time.Hour), 100, timed[2:])
	// A later one gets an earlier deadline (a touch -d on a lease).
	last := timed[len(timed)-1]
	last.Deadline = at(-time.Hour)
	mustApply(t, s, upd(last))
	nextDue(t, last.Deadline, true)
	due(t, at(time.Hour), 2, []queuecore.Message{last, timed[2]})
	// Nothing timed is left.
	ops = nil
	for _, m := range timed[2:] {
		ops = append(ops, del(m.ID))
	}
	mustApply(t, s, ops...)
	nextDue(t, time.Time{}, false)
	due(t, at(time.Hour), 100, nil)
}

// testCounts: Counts per queue and state, with bytes, as messages come, move
// and go.
func testCounts(t *testing.T, open Opener) {
	s := newStore(t, open)
	putQueues(t, s, "a", "b", "empty")
	type countMap = map[string]map[queuecore.State]queuecore.Count
	model := map[uint64]queuecore.Message{}
	want := func() countMap {
		c := countMap{}
		for _, m := range model {
			if c[m.Queue] == nil {
				c[m.Queue] = map[queuecore.State]queuecore.Count{}
			}
			n := c[m.Queue][m.State]
			c[m.Queue][m.State] = queuecore.Count{N: n.N + 1, Bytes: n.Bytes + m.Size}
		}
		return c
	}
	r := rand.New(rand.NewPCG(3, 4))
	for id := uint64(1); id <= 40; id++ {
		m := msg(id, []string{"a", "b"}[r.IntN(2)], fmt.Sprintf("m%d", id), queuecore.States[r.IntN(5)])
		b := randomBytes(id, r.IntN(3)*r.IntN(5000)) // a third of them empty
		mustApply(t, s, insertOp(m, b))
		m.Size = int64(len(b))
		model[id] = m
	}
	wantCounts(t, s, want())
	for id := uint64(1); id <= 40; id += 3 {
		m := model[id]
		m.Queue, m.Name = "b", fmt.Sprintf("moved%d", id)
		m = withState(m, queuecore.States[(int(m.State)+1)%5], at(time.Hour))
		mustApply(t, s, queuecore.Op{Kind: queuecore.OpUpdate, Msg: m})
		model[id] = m
	}
	wantCounts(t, s, want())
	for id := uint64(2); id <= 40; id += 4 {
		mustApply(t, s, del(id))
		delete(model, id)
	}
	wantCounts(t, s, want())
	if err := s.DeleteQueue(context.Background(), "a"); err != nil {
		t.Fatalf("DeleteQueue: %v", err)
	}
	for id, m := range model {
		if m.Queue == "a" {
			delete(model, id)
		}
	}
	wantCounts(t, s, want())
}

// testMaxID: MaxID covers every ID and Seq ever given, also after the
// messages are gone and after a reopen.
func testMaxID(t *testing.T, open Opener) {
	dir := t.TempDir()
	s := openStore(t, open, dir, queuecore.SyncFull)
	putQueues(t, s, "a", "b")
	atLeast := func(t *testing.T, s queuecore.Store, want uint64) {
		t.Helper()
		if n := maxID(t, s); n < want {
			t.Errorf("MaxID = %d, want at least %d", n, want)
		}
	}
	m := msg(5, "a", "five", ready)
	m.Seq = 50
	mustApply(t, s, ins(m))
	atLeast(t, s, 50)
	mustApply(t, s, ins(msg(1000, "b", "thousand", ready))) // Seq 1000
	n := msg(7, "a", "seven", ready)
	n.Seq = 3
	mustApply(t, s, ins(n))
	atLeast(t, s, 1000)
	m.Seq = 5000 // a new Seq on re-entering inbox/
	mustApply(t, s, upd(m))
	atLeast(t, s, 5000)
	mustApply(t, s, del(5), del(7))
	atLeast(t, s, 5000)
	if err := s.DeleteQueue(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	atLeast(t, s, 5000)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s = openStore(t, open, dir, queuecore.SyncFull)
	atLeast(t, s, 5000)
}
