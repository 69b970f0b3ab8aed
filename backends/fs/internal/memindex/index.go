// Package memindex is the in-memory index of an fs store's messages:
// every message a packed entry of 64 bytes, in B-trees by state, by name
// and by deadline. The fs store (backends/fs) keeps its whole metadata
// in it; the format-1 reader (backends/fs/internal/format1), which the fs
// store converts old stores with, keeps the same index and adds its spill
// to it (the X of Queue). One index, so that a message means the same in
// both and the entry stays as small as the fs store measures it
// (BenchmarkMessageMemory).
//
// An index is not safe for concurrent use: its store's mutex guards it.
package memindex

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/btree"

	"yirangmq/queuecore"
)

// btreeDegree: nodes of up to 63 items keep the per-item overhead near one
// pointer without making inserts shift much.
const btreeDegree = 32

// ErrBadOp is an op or a message no store can take: an unknown op kind or
// state.
var ErrBadOp = errors.New("invalid op")

// Entry is one message in the index. It is immutable once in the index:
// an update replaces it with a new entry, which is what lets a List (and
// format 1's checkpoint) walk a copy-on-write clone of the trees without
// a lock.
//
// It is kept small: the name and every field that no tree orders by are
// packed in Data (codec.go). X is what the store keeps per queue besides
// (see Queue).
type Entry[X any] struct {
	ID    uint64
	Seq   uint64
	Key   int64 // Message.SortKey(); the deadline for leased and delayed
	Size  int64
	Q     *Queue[X]
	Data  string // name, then the packed rest of the Message
	NLen  uint8  // len(name)
	State queuecore.State
	// Slot is format 1's: record+1 in Q's spill for a copy read from
	// there, 0 in the trees (the fs store leaves it 0). On a 64-bit
	// machine it takes what would be padding: an Entry is 64 bytes with
	// it or without (TestSlotIsFree).
	Slot int32
}

// Name is the message's name.
func (e *Entry[X]) Name() string { return e.Data[:e.NLen] }

// Queue is one queue: its info and its messages, by state and by name.
// Ext is what the store keeps per queue besides: nothing in the fs store,
// the spill in format 1.
type Queue[X any] struct {
	Ext      X
	Name     string
	Info     queuecore.QueueInfo
	ByState  [len(queuecore.States) + 1]*btree.BTreeG[*Entry[X]] // by (key, seq, id); index 0 unused
	Live     *btree.BTreeG[*Entry[X]]                            // live messages by name
	Archived *btree.BTreeG[*Entry[X]]                            // archived messages by name
	Counts   [len(queuecore.States) + 1]queuecore.Count
}

// LessOrder orders a state's messages: by (Key, Seq, ID), which is List's
// order.
func LessOrder[X any](a, b *Entry[X]) bool {
	if a.Key != b.Key {
		return a.Key < b.Key
	}
	if a.Seq != b.Seq {
		return a.Seq < b.Seq
	}
	return a.ID < b.ID
}

func lessName[X any](a, b *Entry[X]) bool { return a.Name() < b.Name() }

func lessDue[X any](a, b *Entry[X]) bool {
	if a.Key != b.Key {
		return a.Key < b.Key
	}
	return a.ID < b.ID
}

// NewQueue is an empty queue.
func NewQueue[X any](info queuecore.QueueInfo) *Queue[X] {
	q := &Queue[X]{Name: info.Name, Info: info}
	for _, st := range queuecore.States {
		q.ByState[st] = btree.NewG(btreeDegree, LessOrder[X])
	}
	q.Live = btree.NewG(btreeDegree, lessName[X])
	q.Archived = btree.NewG(btreeDegree, lessName[X])
	return q
}

// Names is the tree by name that holds the messages of state st: the
// archived ones, or the live ones.
func (q *Queue[X]) Names(st queuecore.State) *btree.BTreeG[*Entry[X]] {
	if st == queuecore.StateArchived {
		return q.Archived
	}
	return q.Live
}

// Named finds the message of q called name among the archived or the live
// in its trees.
func (q *Queue[X]) Named(name string, archived bool) *Entry[X] {
	if len(name) > queuecore.MaxMessageName {
		return nil
	}
	t := q.Live
	if archived {
		t = q.Archived
	}
	e, _ := t.Get(&Entry[X]{Data: name, NLen: uint8(len(name))})
	return e
}

// Index is the queues and the messages in their trees, by ID and, for the
// leased and delayed, by deadline. A store's own index embeds it.
type Index[X any] struct {
	Queues map[string]*Queue[X]
	ByID   map[uint64]*Entry[X]
	Due    *btree.BTreeG[*Entry[X]] // leased and delayed messages by (deadline, id)
	MaxID  uint64                   // the largest ID or Seq of any message it held
}

// NewIndex is an empty index.
func NewIndex[X any]() Index[X] {
	return Index[X]{
		Queues: map[string]*Queue[X]{},
		ByID:   map[uint64]*Entry[X]{},
		Due:    btree.NewG(btreeDegree, lessDue[X]),
	}
}

// Timed says whether messages of state st are in the tree by deadline.
func Timed(st queuecore.State) bool {
	return st == queuecore.StateLeased || st == queuecore.StateDelayed
}

// Insert puts e in the trees: by ID, in its queue's, by deadline if it
// has one, and in its queue's counts.
func (ix *Index[X]) Insert(e *Entry[X]) {
	q := e.Q
	ix.ByID[e.ID] = e
	q.ByState[e.State].ReplaceOrInsert(e)
	q.Names(e.State).ReplaceOrInsert(e)
	if Timed(e.State) {
		ix.Due.ReplaceOrInsert(e)
	}
	c := &q.Counts[e.State]
	c.N++
	c.Bytes += e.Size
}

// Delete takes e out of what Insert put it in.
func (ix *Index[X]) Delete(e *Entry[X]) {
	q := e.Q
	delete(ix.ByID, e.ID)
	q.ByState[e.State].Delete(e)
	q.Names(e.State).Delete(e)
	if Timed(e.State) {
		ix.Due.Delete(e)
	}
	c := &q.Counts[e.State]
	c.N--
	c.Bytes -= e.Size
}

// DropQueue removes q and the messages of its trees from the index, and
// returns how many they were.
func (ix *Index[X]) DropQueue(q *Queue[X]) int {
	n := 0
	for _, st := range queuecore.States {
		q.ByState[st].Ascend(func(e *Entry[X]) bool {
			delete(ix.ByID, e.ID)
			if Timed(e.State) {
				ix.Due.Delete(e)
			}
			n++
			return true
		})
	}
	delete(ix.Queues, q.Name)
	return n
}

// CheckPlace checks that m can be kept: a known queue, a valid state and a
// name that is a safe file name.
func (ix *Index[X]) CheckPlace(m *queuecore.Message) (*Queue[X], error) {
	if !m.State.Valid() {
		return nil, fmt.Errorf("message %d: state %d: %w", m.ID, m.State, ErrBadOp)
	}
	if err := queuecore.CheckMessageName(m.Name); err != nil {
		return nil, fmt.Errorf("message %d: %w", m.ID, err)
	}
	q := ix.Queues[m.Queue]
	if q == nil {
		return nil, fmt.Errorf("message %d: queue %q: %w", m.ID, m.Queue, queuecore.ErrNotFound)
	}
	return q, nil
}

// SortedQueues returns the queues by name.
func (ix *Index[X]) SortedQueues() []*Queue[X] {
	qs := make([]*Queue[X], 0, len(ix.Queues))
	for _, q := range ix.Queues {
		qs = append(qs, q)
	}
	slices.SortFunc(qs, func(a, b *Queue[X]) int { return strings.Compare(a.Name, b.Name) })
	return qs
}

// Change is one applied op: Old is the entry before (nil for an insert),
// New the entry after (nil for a delete).
type Change[X any] struct {
	Old, New *Entry[X]
}

// Applier is a store's index as ApplyOps and Undo use it: ApplyOp checks
// one op against it and applies it, Add and Remove put an entry in and
// take it out (with whatever the store keeps besides the trees).
type Applier[X any] interface {
	ApplyOp(op *queuecore.Op) (Change[X], error)
	Add(e *Entry[X])
	Remove(e *Entry[X])
}

// ApplyOps validates ops one by one against ix and applies each, so that
// later ops see earlier ones. If one fails, the ones before are undone and
// the index is as it was: a failing batch changes nothing.
func ApplyOps[X any, A Applier[X]](ix A, ops []queuecore.Op) ([]Change[X], error) {
	changes := make([]Change[X], 0, len(ops))
	for i := range ops {
		c, err := ix.ApplyOp(&ops[i])
		if err != nil {
			Undo(ix, changes)
			if len(ops) > 1 {
				err = fmt.Errorf("op %d of %d: %w", i+1, len(ops), err)
			}
			return nil, err
		}
		changes = append(changes, c)
	}
	return changes, nil
}

// Undo reverts applied changes, last first.
func Undo[X any, A Applier[X]](ix A, changes []Change[X]) {
	for i := len(changes) - 1; i >= 0; i-- {
		c := changes[i]
		if c.New != nil {
			ix.Remove(c.New)
		}
		if c.Old != nil {
			ix.Add(c.Old)
		}
	}
}

// KindOfName names the set of names st's messages are unique in, for
// errors.
func KindOfName(st queuecore.State) string {
	if st == queuecore.StateArchived {
		return "archived name"
	}
	return "live name"
}
