package fs

import (
	"fmt"

	"yirangmq/backends/fs/internal/memindex"
	"yirangmq/queuecore"
)

// The fs store's instances of the index's types (package memindex): it
// keeps nothing per queue besides the trees (queueExt).
type (
	queueExt = struct{}
	entry    = memindex.Entry[queueExt]
	queue    = memindex.Queue[queueExt]
	change   = memindex.Change[queueExt]
)

// index is the in-memory metadata of the store, built from the tree at
// Open. The Store's mutex guards it.
type index struct {
	memindex.Index[queueExt]
	n int // messages in all
}

func newIndex() *index {
	return &index{Index: memindex.NewIndex[queueExt]()}
}

// Add puts e in the index.
func (ix *index) Add(e *entry) {
	ix.Insert(e)
	ix.n++
	ix.MaxID = max(ix.MaxID, e.ID, e.Seq)
}

// Remove takes e out of the index.
func (ix *index) Remove(e *entry) {
	ix.Delete(e)
	ix.n--
}

// applyOps applies a batch, all of it or nothing (memindex.ApplyOps).
func (ix *index) applyOps(ops []queuecore.Op) ([]change, error) { return memindex.ApplyOps(ix, ops) }

// undo reverts applied changes, last first.
func (ix *index) undo(changes []change) { memindex.Undo(ix, changes) }

// ApplyOp checks op against the index and applies it. An insert's entry
// takes the size of its body, what its file will hold; an update keeps
// the size of the body it does not change.
func (ix *index) ApplyOp(op *queuecore.Op) (change, error) {
	m := &op.Msg
	switch op.Kind {
	case queuecore.OpInsert:
		q, err := ix.CheckPlace(m)
		if err != nil {
			return change{}, err
		}
		if ix.ByID[m.ID] != nil {
			return change{}, fmt.Errorf("insert message %d: ID %w", m.ID, queuecore.ErrExists)
		}
		if other := q.Named(m.Name, m.State == queuecore.StateArchived); other != nil {
			return change{}, fmt.Errorf("insert message %d: %s %q in queue %s %w (message %d)",
				m.ID, memindex.KindOfName(m.State), m.Name, m.Queue, queuecore.ErrExists, other.ID)
		}
		mm := *m
		mm.Size = int64(len(op.Body)) // what the file will hold
		e := memindex.NewEntry(&mm, q)
		ix.Add(e)
		return change{New: e}, nil
	case queuecore.OpUpdate:
		old := ix.ByID[m.ID]
		if old == nil {
			return change{}, fmt.Errorf("update message %d: %w", m.ID, queuecore.ErrNotFound)
		}
		q, err := ix.CheckPlace(m)
		if err != nil {
			return change{}, err
		}
		if other := q.Named(m.Name, m.State == queuecore.StateArchived); other != nil && other.ID != old.ID {
			return change{}, fmt.Errorf("update message %d: %s %q in queue %s %w (message %d)",
				m.ID, memindex.KindOfName(m.State), m.Name, m.Queue, queuecore.ErrExists, other.ID)
		}
		mm := *m
		mm.Size = old.Size // the body stays
		e := memindex.NewEntry(&mm, q)
		ix.Remove(old)
		ix.Add(e)
		return change{Old: old, New: e}, nil
	case queuecore.OpDelete:
		old := ix.ByID[m.ID]
		if old == nil {
			return change{}, fmt.Errorf("delete message %d: %w", m.ID, queuecore.ErrNotFound)
		}
		ix.Remove(old)
		return change{Old: old}, nil
	}
	return change{}, fmt.Errorf("op kind %d: %w", op.Kind, errBadOp)
}

// deleteQueue removes a queue and every message in it.
func (ix *index) deleteQueue(q *queue) { ix.n -= ix.DropQueue(q) }
