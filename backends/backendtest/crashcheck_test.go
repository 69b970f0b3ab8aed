package backendtest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// crashMsg is a message as the child would make it, with its crash body's
// size.
func crashMsg(id uint64, q, name string, st queuecore.State) queuecore.Message {
	m := msg(id, q, name, st)
	m.Size = int64(len(crashBody(id)))
	return m
}

// checkQueues are the queues of the checker's tests.
func checkQueues() []queuecore.QueueInfo {
	return []queuecore.QueueInfo{queueInfo("qa"), queueInfo("qb")}
}

// snapshotOf is the snapshot of a correct store holding the queues qa and
// qb and the messages ms.
func snapshotOf(ms ...queuecore.Message) *snapshot {
	return snapshotWith(checkQueues(), ms...)
}

// snapshotWith is the snapshot of a correct store holding qs and ms.
func snapshotWith(qs []queuecore.QueueInfo, ms ...queuecore.Message) *snapshot {
	s := &snapshot{Queues: qs, Lists: map[listKey][]queuecore.Message{}, Bodies: map[uint64][]byte{}, Counts: map[string]map[queuecore.State]queuecore.Count{}}
	for _, m := range ms {
		k := listKey{m.Queue, m.State}
		s.Lists[k] = append(s.Lists[k], m)
		s.Bodies[m.ID] = crashBody(m.ID)
		if s.Counts[m.Queue] == nil {
			s.Counts[m.Queue] = map[queuecore.State]queuecore.Count{}
		}
		c := s.Counts[m.Queue][m.State]
		s.Counts[m.Queue][m.State] = queuecore.Count{N: c.N + 1, Bytes: c.Bytes + m.Size}
		s.MaxID = max(s.MaxID, m.ID, m.Seq)
	}
	for _, l := range s.Lists {
		sortMessages(l)
	}
	return s
}

func withMaxID(s *snapshot, n uint64) *snapshot {
	s.MaxID = n
	return s
}

// TestCrashCheck feeds the checker a history and recovered stores, right
// and wrong, and checks its verdicts: above all that a lost commit is
// reported.
func TestCrashCheck(t *testing.T) {
	a := crashMsg(4, "qa", "na", ready)
	aLeased := withState(a, leased, at(time.Hour))
	b := crashMsg(5, "qa", "nb", ready)
	c := crashMsg(9, "qb", "nb", ready) // b forwarded: same name, other queue
	d := crashMsg(6, "qa", "nd", dead)
	e := crashMsg(7, "qb", "ne", delayed)
	begin := func(w, n int, ops ...crashOp) string { return crashLine{Worker: w, Batch: n, Ops: ops}.encode() }
	commit := func(w, n int) string { return crashLine{Worker: w, Batch: n, OK: true}.encode() }
	history := []string{
		"=== RUN   TestSomething\n", // not a report: ignored
		begin(0, 1, crashOp{queuecore.OpInsert, a}), commit(0, 1),
		begin(1, 1, crashOp{queuecore.OpInsert, b}), commit(1, 1),
		begin(0, 2, crashOp{queuecore.OpUpdate, aLeased}), commit(0, 2),
		begin(2, 1, crashOp{queuecore.OpInsert, d}), commit(2, 1),
		begin(2, 2, crashOp{queuecore.OpDelete, queuecore.Message{ID: d.ID}}), commit(2, 2),
		begin(3, 1, crashOp{queuecore.OpInsert, e}), commit(3, 1),
		// In flight at the kill: ack b and forward it as c.
		begin(1, 2, crashOp{queuecore.OpDelete, queuecore.Message{ID: b.ID}}, crashOp{queuecore.OpInsert, c}),
	}
	h := newCrashHistory(crashModel{}, checkQueues(), 0)
	for _, l := range history {
		if err := h.feed(l); err != nil {
			t.Fatalf("feed %q: %v", l, err)
		}
	}
	if h.committed != 6 || len(h.inFlight) != 1 {
		t.Fatalf("history: %d committed, %d in flight; want 6, 1", h.committed, len(h.inFlight))
	}

	torn := snapshotOf(aLeased, b, e)
	torn.Bodies[a.ID] = torn.Bodies[a.ID][:len(torn.Bodies[a.ID])-1]
	swapped := snapshotOf(aLeased, b, e)
	swapped.Bodies[a.ID] = crashBody(b.ID)
	twice := snapshotOf(aLeased, b, e)
	twice.Lists[listKey{"qb", dead}] = []queuecore.Message{inQueue(withState(b, dead, at(0)), "qb")}
	miscounted := snapshotOf(aLeased, b, e)
	miscounted.Counts["qa"][ready] = queuecore.Count{N: 1, Bytes: b.Size + 1}
	lowMax := snapshotOf(aLeased, b, e)
	lowMax.MaxID = 6
	unordered := snapshotOf(aLeased, b, e, crashMsg(8, "qa", "nz", ready))
	l := unordered.Lists[listKey{"qa", ready}]
	l[0], l[1] = l[1], l[0]
	sameName := snapshotOf(aLeased, b, e, crashMsg(11, "qa", "na", dead))

	cases := []struct {
		name string
		snap *snapshot
		want string // a problem containing this; "" for none
	}{
		{"in-flight batch absent", snapshotOf(aLeased, b, e), ""},
		{"in-flight batch whole", snapshotOf(aLeased, c, e), ""},
		{"in-flight batch half: insert only", snapshotOf(aLeased, b, c, e), "neither absent nor whole"},
		{"in-flight batch half: delete only", snapshotOf(aLeased, e), "neither absent nor whole"},
		{"committed insert lost", snapshotOf(aLeased, b), "message 7 (qb/delayed/ne, last changed by worker 3 batch 1, reported committed) is lost"},
		{"committed update lost", snapshotOf(a, b, e), "message 4 is not as worker 0 batch 2"},
		{"committed delete lost", snapshotOf(aLeased, b, e, d), "message 6 (qa/dlq/nd) should not exist"},
		{"never reported message", snapshotOf(aLeased, b, e, crashMsg(99, "qa", "x", ready)), "message 99"},
		{"torn body", torn, "torn: "},
		{"another message's body", swapped, "the body of message 5"},
		{"message in two places", twice, "message 5 is in two places"},
		{"counts disagree with lists", miscounted, "Counts ="},
		{"MaxID below a committed ID", lowMax, "MaxID = 6"},
		{"list out of order", unordered, "out of (SortKey, Seq) order"},
		{"live name shared", sameName, "share the name"},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			problems := h.check(tc.snap)
			if tc.want == "" {
				if len(problems) > 0 {
					t.Errorf("a right recovery reported:\n%s", strings.Join(problems, "\n"))
				}
				return
			}
			for _, p := range problems {
				if strings.Contains(p, tc.want) {
					return
				}
			}
			t.Errorf("no problem contains %q; got:\n%s", tc.want, strings.Join(problems, "\n"))
		})
	}
}

// TestCrashCheckQueues: queues created and deleted, committed and in
// flight.
func TestCrashCheckQueues(t *testing.T) {
	tmp1, tmp2 := queueInfo("tmp1"), queueInfo("tmp2")
	qaNew := queueInfo("qa")
	qaNew.Policy = []byte(`{"generation":2}`)
	f := crashMsg(14, "tmp1", "nf", ready)
	g := crashMsg(19, "tmp2", "ng", leased)
	lines := []crashLine{
		{Worker: 4, Batch: 1, PutQueue: &tmp1}, {Worker: 4, Batch: 1, OK: true},
		{Worker: 4, Batch: 2, Ops: []crashOp{{queuecore.OpInsert, f}}}, {Worker: 4, Batch: 2, OK: true},
		{Worker: 4, Batch: 3, PutQueue: &tmp2}, {Worker: 4, Batch: 3, OK: true},
		{Worker: 4, Batch: 4, Ops: []crashOp{{queuecore.OpInsert, g}}}, {Worker: 4, Batch: 4, OK: true},
		{Worker: 4, Batch: 5, DeleteQueue: "tmp1"}, {Worker: 4, Batch: 5, OK: true},
		{Worker: 4, Batch: 6, DeleteQueue: "tmp2"}, // in flight
		{Worker: 3, Batch: 1, PutQueue: &qaNew},    // in flight
	}
	h := newCrashHistory(crashModel{}, checkQueues(), 0)
	for _, l := range lines {
		if err := h.feed(l.encode()); err != nil {
			t.Fatalf("feed %+v: %v", l, err)
		}
	}
	if gone := h.gone(); !slices.Equal(gone, []uint64{14}) {
		t.Errorf("gone = %v, want [14]", gone)
	}
	qa, qb := queueInfo("qa"), queueInfo("qb")
	qaOther := queueInfo("qa")
	qaOther.Policy = []byte(`{"generation":3}`)
	cases := []struct {
		name string
		snap *snapshot
		want string
	}{
		{"nothing in flight done", snapshotWith([]queuecore.QueueInfo{qa, qb, tmp2}, g), ""},
		{"everything in flight done", withMaxID(snapshotWith([]queuecore.QueueInfo{qaNew, qb}), 19), ""},
		{"queue deleted, its message left", snapshotWith([]queuecore.QueueInfo{qa, qb}, g), "messages [19] of it are left"},
		{"queue left, its message deleted", snapshotWith([]queuecore.QueueInfo{qa, qb, tmp2}), "the queue is there, its messages differ"},
		{"a policy neither old nor new", snapshotWith([]queuecore.QueueInfo{qaOther, qb}), "left queue qa neither as before"},
		{"committed queue lost", snapshotWith([]queuecore.QueueInfo{qa}), "queue qb, created by a change reported committed, is lost"},
		{"committed queue delete undone", snapshotWith([]queuecore.QueueInfo{qa, qb, tmp1}, f), "queue tmp1 should not exist"},
		{"committed queue delete undone: its message", snapshotWith([]queuecore.QueueInfo{qa, qb, tmp1}, f), "message 14 (tmp1/inbox/nf) should not exist"},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			problems := h.check(tc.snap)
			if tc.want == "" {
				if len(problems) > 0 {
					t.Errorf("a right recovery reported:\n%s", strings.Join(problems, "\n"))
				}
				return
			}
			for _, p := range problems {
				if strings.Contains(p, tc.want) {
					return
				}
			}
			t.Errorf("no problem contains %q; got:\n%s", tc.want, strings.Join(problems, "\n"))
		})
	}
}

// TestCrashHistoryProtocol: broken reports are errors of the test, not
// silently accepted.
func TestCrashHistoryProtocol(t *testing.T) {
	m := crashMsg(4, "qa", "na", ready)
	ins := crashOp{queuecore.OpInsert, m}
	cases := []struct {
		name  string
		lines []string
	}{
		{"commit without begin", []string{crashLine{Worker: 0, Batch: 1, OK: true}.encode()}},
		{"commit of another batch", []string{crashLine{Worker: 0, Batch: 1, Ops: []crashOp{ins}}.encode(), crashLine{Worker: 0, Batch: 2, OK: true}.encode()}},
		{"two batches in flight", []string{crashLine{Worker: 0, Batch: 1, Ops: []crashOp{ins}}.encode(), crashLine{Worker: 0, Batch: 2, Ops: []crashOp{ins}}.encode()}},
		{"impossible commit", []string{
			crashLine{Worker: 0, Batch: 1, Ops: []crashOp{{queuecore.OpDelete, queuecore.Message{ID: 1}}}}.encode(),
			crashLine{Worker: 0, Batch: 1, OK: true}.encode(),
		}},
		{"garbage", []string{crashLinePrefix + "{not json\n"}},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			h := newCrashHistory(crashModel{}, checkQueues(), 0)
			var err error
			for _, l := range tc.lines {
				if err = h.feed(l); err != nil {
					break
				}
			}
			if err == nil {
				t.Error("accepted")
			}
		})
	}
}

// TestCrashBody: bodies differ per ID and a damaged one is explained.
func TestCrashBody(t *testing.T) {
	seen := map[string]uint64{}
	sizes := map[bool]bool{}
	for id := uint64(1); id < 200; id++ {
		b := crashBody(id)
		if other, ok := seen[string(b)]; ok {
			t.Fatalf("messages %d and %d have the same body", other, id)
		}
		seen[string(b)] = id
		sizes[len(b) > 32<<10] = true
		if got := explainBody(id, b); got != "differs from the body its ID derives" {
			t.Errorf("explainBody of a right body: %s", got)
		}
	}
	if !sizes[true] || !sizes[false] {
		t.Errorf("bodies are all small or all large: %v", sizes)
	}
	id := uint64(42)
	for len(crashBody(id)) < 100 { // one with a payload to damage
		id++
	}
	b := crashBody(id)
	flipped := append([]byte(nil), b...)
	flipped[len(flipped)-1] ^= 1
	for _, tc := range []struct {
		got  []byte
		want string
	}{
		{nil, "no header"},
		{b[:len(b)-1], "torn"},
		{flipped, "checksum"},
		{crashBody(id + 1), fmt.Sprintf("the body of message %d", id+1)},
		{[]byte("junk\n"), "garbled"},
	} {
		if got := explainBody(id, tc.got); !strings.Contains(got, tc.want) {
			t.Errorf("explainBody(%s) = %q, want %q", abbrev(tc.got), got, tc.want)
		}
	}
}
