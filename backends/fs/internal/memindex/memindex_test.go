package memindex

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"yirangmq/queuecore"
)

// TestSlotIsFree checks that format 1's Slot costs the fs store nothing:
// an Entry is as large as it would be without it (on a 64-bit machine,
// where it fills the padding after NLen and State).
func TestSlotIsFree(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("a 32-bit machine has no padding there")
	}
	type withoutSlot struct {
		ID    uint64
		Seq   uint64
		Key   int64
		Size  int64
		Q     *Queue[struct{}]
		Data  string
		NLen  uint8
		State queuecore.State
	}
	if got, want := unsafe.Sizeof(Entry[struct{}]{}), unsafe.Sizeof(withoutSlot{}); got != want {
		t.Errorf("Entry is %d bytes, %d without Slot", got, want)
	}
	if got := unsafe.Sizeof(Entry[struct{ a, b *int }]{}); got != unsafe.Sizeof(Entry[struct{}]{}) {
		t.Errorf("Entry's size depends on what its queue keeps: %d bytes", got)
	}
}

// TestPackedRoundTrip packs messages and unpacks them: every field comes
// back, times included (far apart, before 1970, zero, clamped past 2262).
func TestPackedRoundTrip(t *testing.T) {
	q := NewQueue[struct{}](queuecore.QueueInfo{Name: "q"})
	at := time.Date(2026, 3, 4, 5, 6, 7, 890123456, time.UTC)
	msgs := []queuecore.Message{
		{ID: 1, Queue: "q", Name: "a", State: queuecore.StateReady, Seq: 1},
		{
			ID: math.MaxUint64, Queue: "q", Name: strings.Repeat("n", queuecore.MaxMessageName), State: queuecore.StateLeased,
			Seq: 7, Priority: -3, Size: 1 << 40, MessageID: "mid", PublishedAt: at, FirstAt: at.Add(-time.Hour),
			StateAt: at.Add(time.Second), Deadline: at.Add(100 * 365 * 24 * time.Hour), Attempts: 2, Redrives: 1,
			Reason: "BAD_INPUT", ReasonMessage: "field x missing", FailedAt: time.Date(1900, 1, 1, 0, 0, 0, 1, time.UTC),
			Consumer: "uid 1000 pid 42 cmd sh", DedupKey: "dk", UID: math.MaxUint32, GID: 100,
		},
		{ID: 3, Queue: "q", Name: "c", State: queuecore.StateDelayed, Seq: 3, Priority: math.MaxInt32,
			Deadline: at, FailedAt: at}, // times without PublishedAt
	}
	for _, m := range msgs {
		t.Run(fmt.Sprint(m.ID), func(t *testing.T) {
			e := NewEntry(&m, q)
			if e.Name() != m.Name || e.Key != m.SortKey() {
				t.Errorf("entry: name %q key %d, want %q %d", e.Name(), e.Key, m.Name, m.SortKey())
			}
			got := e.Message()
			for _, tt := range [][2]*time.Time{{&got.PublishedAt, &m.PublishedAt}, {&got.FirstAt, &m.FirstAt},
				{&got.StateAt, &m.StateAt}, {&got.Deadline, &m.Deadline}, {&got.FailedAt, &m.FailedAt}} {
				if !tt[0].Equal(*tt[1]) {
					t.Errorf("time %v, want %v", *tt[0], *tt[1])
				}
				*tt[0] = *tt[1] // compared; the zone may differ
			}
			if !reflect.DeepEqual(got, m) {
				t.Errorf("unpacked\n%+v\nwant\n%+v", got, m)
			}
			if !e.Deadline().Equal(m.Deadline) {
				t.Errorf("Deadline %v, want %v", e.Deadline(), m.Deadline)
			}
		})
	}
	// A time past what an int64 of nanoseconds holds is clamped.
	far := queuecore.Message{ID: 4, Queue: "q", Name: "d", PublishedAt: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}
	if got := NewEntry(&far, q).Message().PublishedAt; got.Year() != 2262 {
		t.Errorf("a time in 3000 reads back as %v, want the last of 2262", got)
	}
}

// TestReaderStopsAtTheEnd checks that a read past the data is an error
// that sticks, not a panic.
func TestReaderStopsAtTheEnd(t *testing.T) {
	for _, data := range []string{"", "\x80", "\x05ab", "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f"} {
		r := NewReader(data)
		r.Str()
		r.Varint()
		if r.Byte() != 0 || !errors.Is(r.Err(), ErrCorruptEntry) || r.Rest() != "" {
			t.Errorf("%q: err %v, rest %q", data, r.Err(), r.Rest())
		}
	}
}

// TestApplyOpsAllOrNothing applies a batch whose last op fails: the index
// is as it was before, and the error names the op.
func TestApplyOpsAllOrNothing(t *testing.T) {
	ix := &plainIndex{Index: NewIndex[struct{}]()}
	ix.Queues["q"] = NewQueue[struct{}](queuecore.QueueInfo{Name: "q"})
	m := func(id uint64, name string, st queuecore.State) queuecore.Message {
		return queuecore.Message{ID: id, Queue: "q", Name: name, State: st, Seq: id}
	}
	if _, err := ApplyOps(ix, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: m(1, "a", queuecore.StateReady)}}); err != nil {
		t.Fatal(err)
	}
	_, err := ApplyOps(ix, []queuecore.Op{
		{Kind: queuecore.OpUpdate, Msg: m(1, "a", queuecore.StateLeased)},
		{Kind: queuecore.OpInsert, Msg: m(2, "b", queuecore.StateReady)},
		{Kind: queuecore.OpInsert, Msg: m(3, "b", queuecore.StateReady)}, // b is taken
	})
	if !errors.Is(err, queuecore.ErrExists) || !strings.Contains(err.Error(), "op 3 of 3") {
		t.Fatalf("err %v, want op 3 of 3 ... exists", err)
	}
	q := ix.Queues["q"]
	if len(ix.ByID) != 1 || ix.Due.Len() != 0 || q.Counts[queuecore.StateReady].N != 1 || q.Counts[queuecore.StateLeased].N != 0 {
		t.Errorf("after a failed batch: %d by ID, %d due, counts %+v", len(ix.ByID), ix.Due.Len(), q.Counts)
	}
	if e := q.Named("a", false); e == nil || e.State != queuecore.StateReady {
		t.Errorf("a: %+v, want ready", e)
	}
	if got := ix.SortedQueues(); len(got) != 1 || got[0] != q {
		t.Errorf("SortedQueues: %v", got)
	}
	if n := ix.DropQueue(q); n != 1 || len(ix.ByID) != 0 || len(ix.Queues) != 0 {
		t.Errorf("DropQueue: %d, left %d by ID, %d queues", n, len(ix.ByID), len(ix.Queues))
	}
}

// plainIndex is the least Applier: the trees alone.
type plainIndex struct{ Index[struct{}] }

func (ix *plainIndex) Add(e *Entry[struct{}])    { ix.Insert(e) }
func (ix *plainIndex) Remove(e *Entry[struct{}]) { ix.Delete(e) }

func (ix *plainIndex) ApplyOp(op *queuecore.Op) (Change[struct{}], error) {
	m := &op.Msg
	q, err := ix.CheckPlace(m)
	if err != nil {
		return Change[struct{}]{}, err
	}
	old := ix.ByID[m.ID]
	if other := q.Named(m.Name, m.State == queuecore.StateArchived); other != nil && other != old {
		return Change[struct{}]{}, fmt.Errorf("%s %q: %w", KindOfName(m.State), m.Name, queuecore.ErrExists)
	}
	e := NewEntry(m, q)
	if old != nil {
		ix.Remove(old)
	}
	ix.Add(e)
	return Change[struct{}]{Old: old, New: e}, nil
}
