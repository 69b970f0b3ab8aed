package backendtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// Short names for the states, so that tables stay readable.
const (
	ready    = queuecore.StateReady
	leased   = queuecore.StateLeased
	delayed  = queuecore.StateDelayed
	dead     = queuecore.StateDead
	archived = queuecore.StateArchived
)

// epoch is the base of every time the suite writes: nanoseconds and a
// non-UTC zone, so that a store that rounds or loses the instant is caught
// (times are compared with time.Equal, so the zone itself may change).
var epoch = time.Date(2026, 1, 13, 10, 21, 0, 123456789, time.FixedZone("KST", 9*60*60))

// at is epoch plus d.
func at(d time.Duration) time.Time { return epoch.Add(d) }

// openStore opens a store in dir and closes it at the end of the test,
// unless the test closed it itself (closeStore).
func openStore(t *testing.T, open Opener, dir string, sync queuecore.SyncMode) queuecore.Store {
	t.Helper()
	s, err := open(context.Background(), dir, sync)
	if err != nil {
		t.Fatalf("open store in %s (sync %s): %v", dir, sync, err)
	}
	if s == nil {
		t.Fatalf("open store in %s: nil store and nil error", dir)
	}
	cs := &closeOnce{Store: s}
	t.Cleanup(func() {
		if err := cs.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return cs
}

// closeOnce lets a test close a store early while the cleanup still closes
// every store a failed test left open.
type closeOnce struct {
	queuecore.Store
	closed bool
}

func (c *closeOnce) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	return c.Store.Close()
}

// newStore opens a fresh store in its own directory with SyncFull.
func newStore(t *testing.T, open Opener) queuecore.Store {
	t.Helper()
	return openStore(t, open, t.TempDir(), queuecore.SyncFull)
}

// queueInfo is a queue with every field set.
func queueInfo(name string) queuecore.QueueInfo {
	return queuecore.QueueInfo{
		Name:      name,
		Policy:    []byte(`{"visibilityTimeoutSec":30,"queue":"` + name + `"}`),
		UID:       1000,
		GID:       1001,
		Mode:      0o750,
		CreatedAt: at(-time.Hour),
	}
}

// putQueues creates queues with queueInfo.
func putQueues(t *testing.T, s queuecore.Store, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := s.PutQueue(context.Background(), queueInfo(n)); err != nil {
			t.Fatalf("PutQueue(%q): %v", n, err)
		}
	}
}

// msg is a message in queue q named name, in state st, with the fields
// queuecore would set for that state. Seq is the ID; Deadline is set for
// leased and delayed messages, zero otherwise.
func msg(id uint64, q, name string, st queuecore.State) queuecore.Message {
	m := queuecore.Message{
		ID:          id,
		Queue:       q,
		Name:        name,
		State:       st,
		Seq:         id,
		MessageID:   fmt.Sprintf("mid-%d", id),
		PublishedAt: at(time.Duration(id) * time.Second),
		FirstAt:     at(time.Duration(id) * time.Second),
		StateAt:     at(time.Duration(id) * time.Second),
		UID:         1000,
		GID:         1000,
	}
	if st == leased || st == delayed {
		m.Deadline = at(time.Duration(id) * time.Minute)
	}
	return m
}

// body is a message body derived from id: distinct for every message, so a
// body served for the wrong ID is caught.
func body(id uint64) []byte { return fmt.Appendf(nil, "body of message %d\n", id) }

// insertOp inserts m with b, setting m.Size to len(b).
func insertOp(m queuecore.Message, b []byte) queuecore.Op {
	m.Size = int64(len(b))
	return queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: b}
}

// ins inserts m with body(m.ID).
func ins(m queuecore.Message) queuecore.Op { return insertOp(m, body(m.ID)) }

// upd replaces the metadata of m.ID with m, keeping the size of body(m.ID).
func upd(m queuecore.Message) queuecore.Op {
	m.Size = int64(len(body(m.ID)))
	return queuecore.Op{Kind: queuecore.OpUpdate, Msg: m}
}

// del deletes message id. Only the ID is given: it is all the contract
// promises a store.
func del(id uint64) queuecore.Op {
	return queuecore.Op{Kind: queuecore.OpDelete, Msg: queuecore.Message{ID: id}}
}

// withState returns m moved to st with the fields queuecore would change.
func withState(m queuecore.Message, st queuecore.State, stateAt time.Time) queuecore.Message {
	m.State = st
	m.StateAt = stateAt
	m.Deadline = time.Time{}
	if st == leased || st == delayed {
		m.Deadline = stateAt.Add(30 * time.Second)
	}
	return m
}

func mustApply(t *testing.T, s queuecore.Store, ops ...queuecore.Op) {
	t.Helper()
	if err := s.Apply(context.Background(), ops); err != nil {
		t.Fatalf("Apply(%s): %v", describeOps(ops), err)
	}
}

// describeOps is a short description of a batch for failure messages.
func describeOps(ops []queuecore.Op) string {
	var parts []string
	for _, op := range ops {
		switch op.Kind {
		case queuecore.OpInsert:
			parts = append(parts, fmt.Sprintf("insert %d %s/%s/%s", op.Msg.ID, op.Msg.Queue, op.Msg.State, op.Msg.Name))
		case queuecore.OpUpdate:
			parts = append(parts, fmt.Sprintf("update %d to %s/%s/%s", op.Msg.ID, op.Msg.Queue, op.Msg.State, op.Msg.Name))
		case queuecore.OpDelete:
			parts = append(parts, fmt.Sprintf("delete %d", op.Msg.ID))
		default:
			parts = append(parts, fmt.Sprintf("op kind %d", op.Kind))
		}
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// normalize strips what time.Equal ignores (zone, monotonic reading) so
// that two messages that mean the same compare equal with ==.
func normalize(m queuecore.Message) queuecore.Message {
	for _, p := range []*time.Time{&m.PublishedAt, &m.FirstAt, &m.StateAt, &m.Deadline, &m.FailedAt} {
		if !p.IsZero() {
			*p = p.Round(0).UTC()
		}
	}
	return m
}

// diffMessage lists the fields in which got differs from want, "" if none.
func diffMessage(want, got queuecore.Message) string {
	w, g := reflect.ValueOf(normalize(want)), reflect.ValueOf(normalize(got))
	var diffs []string
	for i := range w.NumField() {
		wf, gf := w.Field(i).Interface(), g.Field(i).Interface()
		if wt, ok := wf.(time.Time); ok {
			gt := gf.(time.Time)
			if !wt.Equal(gt) || wt.IsZero() != gt.IsZero() {
				diffs = append(diffs, fmt.Sprintf("%s: got %v, want %v", w.Type().Field(i).Name, gt, wt))
			}
			continue
		}
		if wf != gf {
			diffs = append(diffs, fmt.Sprintf("%s: got %v, want %v", w.Type().Field(i).Name, gf, wf))
		}
	}
	return strings.Join(diffs, "; ")
}

// checkMessage fails the test if got differs from want.
func checkMessage(t *testing.T, what string, want, got queuecore.Message) {
	t.Helper()
	if d := diffMessage(want, got); d != "" {
		t.Errorf("%s: message %d differs: %s", what, want.ID, d)
	}
}

// lookup is Lookup that fails the test on error.
func lookup(t *testing.T, s queuecore.Store, q, name string, arch bool) queuecore.Message {
	t.Helper()
	m, err := s.Lookup(context.Background(), q, name, arch)
	if err != nil {
		t.Fatalf("Lookup(%q, %q, archived=%v): %v", q, name, arch, err)
	}
	return m
}

// wantLookup checks that Lookup finds want (with its queue and name).
func wantLookup(t *testing.T, s queuecore.Store, want queuecore.Message) {
	t.Helper()
	arch := want.State == archived
	got, err := s.Lookup(context.Background(), want.Queue, want.Name, arch)
	if err != nil {
		t.Errorf("Lookup(%q, %q, archived=%v): %v, want message %d", want.Queue, want.Name, arch, err, want.ID)
		return
	}
	checkMessage(t, fmt.Sprintf("Lookup(%q, %q, archived=%v)", want.Queue, want.Name, arch), want, got)
}

// wantNoLookup checks that Lookup fails with ErrNotFound.
func wantNoLookup(t *testing.T, s queuecore.Store, q, name string, arch bool) {
	t.Helper()
	m, err := s.Lookup(context.Background(), q, name, arch)
	if !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("Lookup(%q, %q, archived=%v) = message %d, %v; want ErrNotFound", q, name, arch, m.ID, err)
	}
}

// wantBody checks Body(id).
func wantBody(t *testing.T, s queuecore.Store, id uint64, want []byte) {
	t.Helper()
	got, err := s.Body(context.Background(), id)
	if err != nil {
		t.Errorf("Body(%d): %v", id, err)
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("Body(%d) = %s, want %s", id, abbrev(got), abbrev(want))
	}
}

// wantNoBody checks that Body fails with ErrNotFound.
func wantNoBody(t *testing.T, s queuecore.Store, id uint64) {
	t.Helper()
	b, err := s.Body(context.Background(), id)
	if !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("Body(%d) = %s, %v; want ErrNotFound", id, abbrev(b), err)
	}
}

// abbrev shows a body in a failure message without flooding the log.
func abbrev(b []byte) string {
	if len(b) <= 64 {
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%q... (%d bytes)", b[:64], len(b))
}

// list returns List(q, st) in the order the store gave.
func list(t *testing.T, s queuecore.Store, q string, st queuecore.State) []queuecore.Message {
	t.Helper()
	var ms []queuecore.Message
	err := s.List(context.Background(), q, st, func(m queuecore.Message) bool {
		ms = append(ms, m)
		return true
	})
	if err != nil {
		t.Fatalf("List(%q, %s): %v", q, st, err)
	}
	return ms
}

// ids are the IDs of ms, in order.
func ids(ms []queuecore.Message) []uint64 {
	out := make([]uint64, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// wantList checks that List(q, st) returns exactly want, in that order.
func wantList(t *testing.T, s queuecore.Store, q string, st queuecore.State, want ...queuecore.Message) {
	t.Helper()
	got := list(t, s, q, st)
	if !slices.Equal(ids(got), ids(want)) {
		t.Errorf("List(%q, %s) = IDs %v, want %v", q, st, ids(got), ids(want))
		return
	}
	for i := range want {
		checkMessage(t, fmt.Sprintf("List(%q, %s)[%d]", q, st, i), want[i], got[i])
	}
}

// counts is Counts without the empty entries, which a store may or may not
// report.
func counts(t *testing.T, s queuecore.Store) map[string]map[queuecore.State]queuecore.Count {
	t.Helper()
	c, err := s.Counts(context.Background())
	if err != nil {
		t.Fatalf("Counts: %v", err)
	}
	return pruneCounts(c)
}

func pruneCounts(c map[string]map[queuecore.State]queuecore.Count) map[string]map[queuecore.State]queuecore.Count {
	out := map[string]map[queuecore.State]queuecore.Count{}
	for q, byState := range c {
		for st, n := range byState {
			if n == (queuecore.Count{}) {
				continue
			}
			if out[q] == nil {
				out[q] = map[queuecore.State]queuecore.Count{}
			}
			out[q][st] = n
		}
	}
	return out
}

// wantCounts checks Counts against want (empty entries ignored).
func wantCounts(t *testing.T, s queuecore.Store, want map[string]map[queuecore.State]queuecore.Count) {
	t.Helper()
	got := counts(t, s)
	want = pruneCounts(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Counts = %v, want %v", got, want)
	}
}

// maxID is MaxID that fails the test on error.
func maxID(t *testing.T, s queuecore.Store) uint64 {
	t.Helper()
	n, err := s.MaxID(context.Background())
	if err != nil {
		t.Fatalf("MaxID: %v", err)
	}
	return n
}

// randomBytes is n bytes of seeded noise, zeros and newlines included.
func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}
