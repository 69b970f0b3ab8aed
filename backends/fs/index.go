package fs

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/btree"

	"yirangmq/queuecore"
)

// btreeDegree: nodes of up to 63 items keep the per-item overhead near one
// pointer without making inserts shift much.
const btreeDegree = 32

// entry is one message in the index. It is immutable once in the index: an
// update replaces it with a new entry, which is what lets a List walk a
// copy-on-write clone of the trees without a lock.
//
// It is kept small: the name and every field that no tree orders by are
// packed in data (codec.go).
type entry struct {
	id    uint64
	seq   uint64
	key   int64 // Message.SortKey(); the deadline for leased and delayed
	size  int64
	q     *queue
	data  string // name, then the packed rest of the Message
	nlen  uint8  // len(name)
	state queuecore.State
}

func (e *entry) name() string { return e.data[:e.nlen] }

// queue is one queue: its info and its messages, by state and by name.
type queue struct {
	name     string
	info     queuecore.QueueInfo
	byState  [len(queuecore.States) + 1]*btree.BTreeG[*entry] // by (key, seq, id); index 0 unused
	live     *btree.BTreeG[*entry]                            // live messages by name
	archived *btree.BTreeG[*entry]                            // archived messages by name
	counts   [len(queuecore.States) + 1]queuecore.Count
}

func lessOrder(a, b *entry) bool {
	if a.key != b.key {
		return a.key < b.key
	}
	if a.seq != b.seq {
		return a.seq < b.seq
	}
	return a.id < b.id
}

func lessName(a, b *entry) bool { return a.name() < b.name() }

func lessDue(a, b *entry) bool {
	if a.key != b.key {
		return a.key < b.key
	}
	return a.id < b.id
}

func newQueue(info queuecore.QueueInfo) *queue {
	q := &queue{name: info.Name, info: info}
	for _, st := range queuecore.States {
		q.byState[st] = btree.NewG(btreeDegree, lessOrder)
	}
	q.live = btree.NewG(btreeDegree, lessName)
	q.archived = btree.NewG(btreeDegree, lessName)
	return q
}

func (q *queue) names(st queuecore.State) *btree.BTreeG[*entry] {
	if st == queuecore.StateArchived {
		return q.archived
	}
	return q.live
}

// named finds the message of q called name among the archived or the live.
func (q *queue) named(name string, archived bool) *entry {
	if len(name) > queuecore.MaxMessageName {
		return nil
	}
	t := q.live
	if archived {
		t = q.archived
	}
	e, _ := t.Get(&entry{data: name, nlen: uint8(len(name))})
	return e
}

// index is the in-memory metadata of the store, built from the tree at
// Open. The Store's mutex guards it.
type index struct {
	queues map[string]*queue
	byID   map[uint64]*entry
	due    *btree.BTreeG[*entry] // leased and delayed messages by (deadline, id)
	maxID  uint64                // the largest ID or Seq of any message it held
	n      int                   // messages in all
}

func newIndex() *index {
	return &index{
		queues: map[string]*queue{},
		byID:   map[uint64]*entry{},
		due:    btree.NewG(btreeDegree, lessDue),
	}
}

func timed(st queuecore.State) bool {
	return st == queuecore.StateLeased || st == queuecore.StateDelayed
}

func (ix *index) add(e *entry) {
	q := e.q
	ix.byID[e.id] = e
	q.byState[e.state].ReplaceOrInsert(e)
	q.names(e.state).ReplaceOrInsert(e)
	if timed(e.state) {
		ix.due.ReplaceOrInsert(e)
	}
	c := &q.counts[e.state]
	c.N++
	c.Bytes += e.size
	ix.n++
	ix.maxID = max(ix.maxID, e.id, e.seq)
}

func (ix *index) remove(e *entry) {
	q := e.q
	delete(ix.byID, e.id)
	q.byState[e.state].Delete(e)
	q.names(e.state).Delete(e)
	if timed(e.state) {
		ix.due.Delete(e)
	}
	c := &q.counts[e.state]
	c.N--
	c.Bytes -= e.size
	ix.n--
}

// change is one applied op: old is the entry before (nil for an insert),
// new the entry after (nil for a delete).
type change struct {
	old, new *entry
}

// applyOps validates ops one by one against the index and applies each, so
// that later ops see earlier ones. If one fails, the ones before are undone
// and the index is as it was: a failing batch changes nothing.
func (ix *index) applyOps(ops []queuecore.Op) ([]change, error) {
	changes := make([]change, 0, len(ops))
	for i := range ops {
		c, err := ix.applyOp(&ops[i])
		if err != nil {
			ix.undo(changes)
			if len(ops) > 1 {
				err = fmt.Errorf("op %d of %d: %w", i+1, len(ops), err)
			}
			return nil, err
		}
		changes = append(changes, c)
	}
	return changes, nil
}

func (ix *index) applyOp(op *queuecore.Op) (change, error) {
	m := &op.Msg
	switch op.Kind {
	case queuecore.OpInsert:
		q, err := ix.checkPlace(m)
		if err != nil {
			return change{}, err
		}
		if ix.byID[m.ID] != nil {
			return change{}, fmt.Errorf("insert message %d: ID %w", m.ID, queuecore.ErrExists)
		}
		if other := q.named(m.Name, m.State == queuecore.StateArchived); other != nil {
			return change{}, fmt.Errorf("insert message %d: %s %q in queue %s %w (message %d)",
				m.ID, kindOfName(m.State), m.Name, m.Queue, queuecore.ErrExists, other.id)
		}
		mm := *m
		mm.Size = int64(len(op.Body)) // what the file will hold
		e := newEntry(&mm, q)
		ix.add(e)
		return change{new: e}, nil
	case queuecore.OpUpdate:
		old := ix.byID[m.ID]
		if old == nil {
			return change{}, fmt.Errorf("update message %d: %w", m.ID, queuecore.ErrNotFound)
		}
		q, err := ix.checkPlace(m)
		if err != nil {
			return change{}, err
		}
		if other := q.named(m.Name, m.State == queuecore.StateArchived); other != nil && other.id != old.id {
			return change{}, fmt.Errorf("update message %d: %s %q in queue %s %w (message %d)",
				m.ID, kindOfName(m.State), m.Name, m.Queue, queuecore.ErrExists, other.id)
		}
		mm := *m
		mm.Size = old.size // the body stays
		e := newEntry(&mm, q)
		ix.remove(old)
		ix.add(e)
		return change{old: old, new: e}, nil
	case queuecore.OpDelete:
		old := ix.byID[m.ID]
		if old == nil {
			return change{}, fmt.Errorf("delete message %d: %w", m.ID, queuecore.ErrNotFound)
		}
		ix.remove(old)
		return change{old: old}, nil
	}
	return change{}, fmt.Errorf("op kind %d: %w", op.Kind, errBadOp)
}

func kindOfName(st queuecore.State) string {
	if st == queuecore.StateArchived {
		return "archived name"
	}
	return "live name"
}

// checkPlace checks that m can be kept: a known queue, a valid state and a
// name that is a safe file name.
func (ix *index) checkPlace(m *queuecore.Message) (*queue, error) {
	if !m.State.Valid() {
		return nil, fmt.Errorf("message %d: state %d: %w", m.ID, m.State, errBadOp)
	}
	if err := queuecore.CheckMessageName(m.Name); err != nil {
		return nil, fmt.Errorf("message %d: %w", m.ID, err)
	}
	q := ix.queues[m.Queue]
	if q == nil {
		return nil, fmt.Errorf("message %d: queue %q: %w", m.ID, m.Queue, queuecore.ErrNotFound)
	}
	return q, nil
}

// undo reverts applied changes, last first.
func (ix *index) undo(changes []change) {
	for i := len(changes) - 1; i >= 0; i-- {
		c := changes[i]
		if c.new != nil {
			ix.remove(c.new)
		}
		if c.old != nil {
			ix.add(c.old)
		}
	}
}

// deleteQueue removes a queue and every message in it.
func (ix *index) deleteQueue(q *queue) {
	for _, st := range queuecore.States {
		q.byState[st].Ascend(func(e *entry) bool {
			delete(ix.byID, e.id)
			if timed(e.state) {
				ix.due.Delete(e)
			}
			ix.n--
			return true
		})
	}
	delete(ix.queues, q.name)
}

// sortedQueues returns the queues by name.
func (ix *index) sortedQueues() []*queue {
	qs := make([]*queue, 0, len(ix.queues))
	for _, q := range ix.queues {
		qs = append(qs, q)
	}
	slices.SortFunc(qs, func(a, b *queue) int { return strings.Compare(a.name, b.name) })
	return qs
}
