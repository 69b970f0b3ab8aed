package backendtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// testApplyBasics: insert, update and delete, each seen by every read.
func testApplyBasics(t *testing.T, open Opener) {
	ctx := context.Background()
	s := newStore(t, open)
	putQueues(t, s, "q")

	if err := s.Apply(ctx, nil); err != nil {
		t.Errorf("Apply of an empty batch: %v", err)
	}

	m := withSize(msg(1, "q", "first", ready))
	mustApply(t, s, ins(m))
	wantLookup(t, s, m)
	wantBody(t, s, 1, body(1))
	wantList(t, s, "q", ready, m)
	wantCounts(t, s, map[string]map[queuecore.State]queuecore.Count{"q": {ready: {N: 1, Bytes: m.Size}}})

	u := withState(m, leased, at(time.Minute))
	u.Attempts, u.Consumer = 1, "uid 1000 pid 42 cat"
	mustApply(t, s, upd(u))
	wantLookup(t, s, u)
	wantList(t, s, "q", ready)
	wantList(t, s, "q", leased, u)
	wantBody(t, s, 1, body(1))
	wantCounts(t, s, map[string]map[queuecore.State]queuecore.Count{"q": {leased: {N: 1, Bytes: m.Size}}})

	mustApply(t, s, del(1))
	wantNoLookup(t, s, "q", "first", false)
	wantNoBody(t, s, 1)
	wantList(t, s, "q", leased)
	wantCounts(t, s, nil)
}

// applyBase is the store the error cases start from: two queues, a message
// in each state of a, and names reused where the contract allows it.
func applyBase() []queuecore.Op {
	return []queuecore.Op{
		ins(msg(1, "a", "r", ready)),
		ins(msg(2, "a", "l", leased)),
		ins(msg(3, "a", "old", archived)),
		ins(msg(4, "a", "d", delayed)),
		ins(msg(5, "b", "r", ready)),      // the name of 1, in another queue
		ins(msg(6, "a", "old", dead)),     // the name of 3, live
		ins(msg(7, "b", "old", archived)), // the name of 3, archived in another queue
	}
}

// testApplyErrors: every error of Apply, and a failed batch changes nothing,
// whichever of its ops is the bad one.
func testApplyErrors(t *testing.T, open Opener) {
	cases := []struct {
		name  string
		batch []queuecore.Op
		want  error
	}{
		{"insert reuses an ID", []queuecore.Op{ins(msg(1, "a", "new", ready))}, queuecore.ErrExists},
		{"insert reuses an archived message's ID", []queuecore.Op{ins(msg(3, "b", "new", ready))}, queuecore.ErrExists},
		{"two inserts with one ID", []queuecore.Op{ins(msg(10, "a", "x", ready)), ins(msg(10, "a", "y", ready))}, queuecore.ErrExists},
		{"insert takes a ready name", []queuecore.Op{ins(msg(10, "a", "r", ready))}, queuecore.ErrExists},
		{"insert dead takes a leased name", []queuecore.Op{ins(msg(10, "a", "l", dead))}, queuecore.ErrExists},
		{"insert delayed takes a ready name", []queuecore.Op{ins(msg(10, "a", "r", delayed))}, queuecore.ErrExists},
		{"insert ready takes a delayed name", []queuecore.Op{ins(msg(10, "a", "d", ready))}, queuecore.ErrExists},
		{"insert ready takes a dead name", []queuecore.Op{ins(msg(10, "a", "old", ready))}, queuecore.ErrExists},
		{"insert archived takes an archived name", []queuecore.Op{ins(msg(10, "a", "old", archived))}, queuecore.ErrExists},
		{"two inserts share a live name", []queuecore.Op{ins(msg(10, "a", "n", ready)), ins(msg(11, "a", "n", dead))}, queuecore.ErrExists},
		{"two inserts share an archived name", []queuecore.Op{ins(msg(10, "a", "n", archived)), ins(msg(11, "a", "n", archived))}, queuecore.ErrExists},
		{"update renames onto a live name", []queuecore.Op{upd(msg(2, "a", "r", leased))}, queuecore.ErrExists},
		{"update moves to a queue where the name is live", []queuecore.Op{upd(msg(1, "b", "r", ready))}, queuecore.ErrExists},
		{"update archives onto an archived name", []queuecore.Op{upd(msg(6, "a", "old", archived))}, queuecore.ErrExists},
		{"update moves an archived message onto an archived name", []queuecore.Op{upd(msg(7, "a", "old", archived))}, queuecore.ErrExists},
		{"update unarchives onto a live name", []queuecore.Op{upd(msg(3, "a", "old", ready))}, queuecore.ErrExists},
		{"insert into an unknown queue", []queuecore.Op{ins(msg(10, "nope", "x", ready))}, queuecore.ErrNotFound},
		{"update into an unknown queue", []queuecore.Op{upd(msg(1, "nope", "r", ready))}, queuecore.ErrNotFound},
		{"update of an unknown ID", []queuecore.Op{upd(msg(99, "a", "z", ready))}, queuecore.ErrNotFound},
		{"delete of an unknown ID", []queuecore.Op{del(99)}, queuecore.ErrNotFound},
		{"insert then update of an unknown ID", []queuecore.Op{ins(msg(10, "a", "fresh", ready)), upd(msg(99, "a", "z", ready))}, queuecore.ErrNotFound},
		{"update then delete of an unknown ID", []queuecore.Op{upd(withState(msg(1, "a", "r", ready), leased, at(time.Hour))), del(99)}, queuecore.ErrNotFound},
		{"delete then a duplicate insert", []queuecore.Op{del(2), ins(msg(1, "a", "other", ready))}, queuecore.ErrExists},
		{"insert then an insert into an unknown queue", []queuecore.Op{ins(msg(10, "a", "fresh", ready)), ins(msg(11, "nope", "x", ready))}, queuecore.ErrNotFound},
		{"delete then update of the deleted ID", []queuecore.Op{del(1), upd(msg(1, "a", "r", leased))}, queuecore.ErrNotFound},
		{"bad op first", []queuecore.Op{del(99), ins(msg(10, "a", "fresh", ready)), del(4)}, queuecore.ErrNotFound},
		{"delete, update and insert, then a taken name", []queuecore.Op{
			del(4), upd(withState(msg(2, "a", "l", leased), dead, at(time.Hour))),
			ins(msg(10, "b", "fresh", ready)), ins(msg(11, "b", "r", leased)),
		}, queuecore.ErrExists},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			ctx := context.Background()
			s := newStore(t, open)
			putQueues(t, s, "a", "b")
			mustApply(t, s, applyBase()...)
			before := takeSnapshot(t, s)

			err := s.Apply(ctx, c.batch)
			if !errors.Is(err, c.want) {
				t.Errorf("Apply(%s) = %v, want %v", describeOps(c.batch), err, c.want)
			}
			wantSnapshot(t, "after a failed batch", before, takeSnapshot(t, s), false)

			// The store still takes batches after a failed one.
			after := withSize(msg(50, "a", "after", ready))
			mustApply(t, s, ins(after))
			wantLookup(t, s, after)
		})
	}
}

// testApplyAllowed: what the name rules allow, including the multi-op
// batches queuecore builds (ack and forward, archive replacement).
func testApplyAllowed(t *testing.T, open Opener) {
	longName := strings.Repeat("n", 255)
	cases := []struct {
		name  string
		setup []queuecore.Op
		batch []queuecore.Op
		want  []queuecore.Message // present afterwards (Size as ins sets it)
		gone  []uint64
	}{
		{"a name live and archived", nil,
			[]queuecore.Op{ins(msg(1, "a", "n", archived)), ins(msg(2, "a", "n", ready))},
			[]queuecore.Message{msg(1, "a", "n", archived), msg(2, "a", "n", ready)}, nil},
		{"a live name in two queues", nil,
			[]queuecore.Op{ins(msg(1, "a", "n", leased)), ins(msg(2, "b", "n", leased))},
			[]queuecore.Message{msg(1, "a", "n", leased), msg(2, "b", "n", leased)}, nil},
		{"an archived name in two queues", nil,
			[]queuecore.Op{ins(msg(1, "a", "n", archived)), ins(msg(2, "b", "n", archived))},
			[]queuecore.Message{msg(1, "a", "n", archived), msg(2, "b", "n", archived)}, nil},
		{"names differ in case only", nil,
			[]queuecore.Op{ins(msg(1, "a", "N", ready)), ins(msg(2, "a", "n", ready))},
			[]queuecore.Message{msg(1, "a", "N", ready), msg(2, "a", "n", ready)}, nil},
		{"odd names", nil,
			[]queuecore.Op{
				ins(msg(1, "a", "hello world ünïcode 😀", ready)), ins(msg(2, "a", "new\nline\ttab", dead)),
				ins(msg(3, "a", longName, delayed)), ins(msg(4, "a", "inbox", ready)),
				ins(msg(5, "a", "a..b", archived)), ins(msg(6, "a", `quote"'\`, leased)),
			},
			[]queuecore.Message{
				msg(1, "a", "hello world ünïcode 😀", ready), msg(2, "a", "new\nline\ttab", dead),
				msg(3, "a", longName, delayed), msg(4, "a", "inbox", ready),
				msg(5, "a", "a..b", archived), msg(6, "a", `quote"'\`, leased),
			}, nil},
		{"a name freed by a delete in the same batch",
			[]queuecore.Op{ins(msg(1, "a", "n", leased))},
			[]queuecore.Op{del(1), ins(msg(2, "a", "n", ready))},
			[]queuecore.Message{msg(2, "a", "n", ready)}, []uint64{1}},
		{"a name freed by archiving in the same batch",
			[]queuecore.Op{ins(msg(1, "a", "n", leased))},
			[]queuecore.Op{upd(msg(1, "a", "n", archived)), ins(msg(2, "a", "n", ready))},
			[]queuecore.Message{msg(1, "a", "n", archived), msg(2, "a", "n", ready)}, nil},
		{"ack and forward",
			[]queuecore.Op{ins(msg(1, "a", "n", leased)), ins(msg(3, "b", "n", archived))},
			[]queuecore.Op{del(1), ins(msg(2, "b", "n", ready))},
			[]queuecore.Message{msg(2, "b", "n", ready), msg(3, "b", "n", archived)}, []uint64{1}},
		{"an archive replacing the old archived message",
			[]queuecore.Op{ins(msg(1, "a", "n", archived)), ins(msg(2, "a", "n", leased))},
			[]queuecore.Op{del(1), upd(msg(2, "a", "n", archived))},
			[]queuecore.Message{msg(2, "a", "n", archived)}, []uint64{1}},
		{"a name freed by a rename in the same batch",
			[]queuecore.Op{ins(msg(1, "a", "n", dead))},
			[]queuecore.Op{upd(msg(1, "a", "m", dead)), ins(msg(2, "a", "n", ready))},
			[]queuecore.Message{msg(1, "a", "m", dead), msg(2, "a", "n", ready)}, nil},
		{"a name freed in a later batch",
			[]queuecore.Op{ins(msg(1, "a", "n", ready)), del(1)},
			[]queuecore.Op{ins(msg(2, "a", "n", ready))},
			[]queuecore.Message{msg(2, "a", "n", ready)}, []uint64{1}},
		{"an update that changes nothing",
			[]queuecore.Op{ins(msg(1, "a", "n", ready))},
			[]queuecore.Op{upd(msg(1, "a", "n", ready))},
			[]queuecore.Message{msg(1, "a", "n", ready)}, nil},
		{"many ops in one batch", nil, manyInserts(1, 200),
			manyMessages(1, 200), nil},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			s := newStore(t, open)
			putQueues(t, s, "a", "b")
			for _, op := range c.setup {
				mustApply(t, s, op)
			}
			mustApply(t, s, c.batch...)
			for _, m := range c.want {
				wantLookup(t, s, withSize(m))
				wantBody(t, s, m.ID, body(m.ID))
			}
			for _, id := range c.gone {
				wantNoBody(t, s, id)
			}
		})
	}
}

func manyMessages(first uint64, n int) []queuecore.Message {
	var ms []queuecore.Message
	for i := range uint64(n) {
		id := first + i
		ms = append(ms, msg(id, []string{"a", "b"}[id%2], fmt.Sprintf("m%d", id), queuecore.States[id%5]))
	}
	return ms
}

func manyInserts(first uint64, n int) []queuecore.Op {
	var ops []queuecore.Op
	for _, m := range manyMessages(first, n) {
		ops = append(ops, ins(m))
	}
	return ops
}

// testUpdateMoves: one message walks through states, queues and names; at
// every step it is found where it is and nowhere else, with its body.
func testUpdateMoves(t *testing.T, open Opener) {
	s := newStore(t, open)
	putQueues(t, s, "a", "b")
	m := withSize(msg(1, "a", "n1", ready))
	mustApply(t, s, ins(m))
	other := withSize(msg(2, "a", "other", ready)) // a neighbour that must not move
	mustApply(t, s, ins(other))

	steps := []struct {
		name   string
		change func(m queuecore.Message) queuecore.Message
	}{
		{"lease", func(m queuecore.Message) queuecore.Message {
			m = withState(m, leased, at(time.Minute))
			m.Attempts, m.Consumer = 0, "uid 1 pid 2 cat"
			return m
		}},
		{"nack to delayed", func(m queuecore.Message) queuecore.Message {
			m = withState(m, delayed, at(2*time.Minute))
			m.Attempts, m.Reason, m.FailedAt = 1, queuecore.ReasonNacked, at(2*time.Minute)
			return m
		}},
		{"due to ready", func(m queuecore.Message) queuecore.Message {
			m = withState(m, ready, at(3*time.Minute))
			m.Seq = 100
			return m
		}},
		{"dead-letter", func(m queuecore.Message) queuecore.Message {
			m = withState(m, dead, at(4*time.Minute))
			m.Reason, m.ReasonMessage = queuecore.ReasonManual, "moved by hand"
			return m
		}},
		{"redrive to another queue and name", func(m queuecore.Message) queuecore.Message {
			m = withState(m, ready, at(5*time.Minute))
			m.Queue, m.Name, m.Seq, m.Redrives, m.Attempts = "b", "n2", 101, 1, 0
			return m
		}},
		{"rename in place", func(m queuecore.Message) queuecore.Message {
			m.Name = "n3"
			return m
		}},
		{"archive", func(m queuecore.Message) queuecore.Message {
			return withState(m, archived, at(6*time.Minute))
		}},
		{"move archived to another queue", func(m queuecore.Message) queuecore.Message {
			m.Queue = "a"
			return m
		}},
	}
	for _, st := range steps {
		prev := m
		m = st.change(m)
		mustApply(t, s, upd(m))
		t.Run(strings.ReplaceAll(st.name, " ", "_"), func(t *testing.T) {
			wantLookup(t, s, m)
			if prev.Queue != m.Queue || prev.Name != m.Name || prev.State.Live() != m.State.Live() {
				wantNoLookup(t, s, prev.Queue, prev.Name, prev.State == archived)
			}
			if prev.State != m.State || prev.Queue != m.Queue {
				for _, x := range list(t, s, prev.Queue, prev.State) {
					if x.ID == m.ID {
						t.Errorf("List(%s/%s) still has message %d", prev.Queue, prev.State, m.ID)
					}
				}
			}
			got := list(t, s, m.Queue, m.State)
			found := false
			for _, x := range got {
				if x.ID == m.ID {
					found = true
					checkMessage(t, "List", m, x)
				}
			}
			if !found {
				t.Errorf("List(%s/%s) = %v, lacks message %d", m.Queue, m.State, ids(got), m.ID)
			}
			wantBody(t, s, m.ID, body(m.ID))
			wantLookup(t, s, other)
			want := map[string]map[queuecore.State]queuecore.Count{"a": {ready: {N: 1, Bytes: other.Size}}, "b": {}}
			c := want[m.Queue][m.State]
			want[m.Queue][m.State] = queuecore.Count{N: c.N + 1, Bytes: c.Bytes + m.Size}
			wantCounts(t, s, want)
		})
	}
}
