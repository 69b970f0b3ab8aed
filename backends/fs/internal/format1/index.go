package format1

import (
	"fmt"

	"yirangmq/backends/fs/internal/memindex"
	"yirangmq/queuecore"
)

// queueSpill is what format 1 keeps per queue besides the trees of the
// index (package memindex, which the fs store keeps its messages in too):
// its spill.
type queueSpill struct {
	spill *spill // newer ready messages past the index's spillAt; nil: none
	tail  int    // ready messages in the tree that sort after the spill's last record
}

// format 1's instances of the index's types.
type (
	entry  = memindex.Entry[queueSpill]
	queue  = memindex.Queue[queueSpill]
	change = memindex.Change[queueSpill]
)

// named finds the message of q called name among the archived or the live
// (in the trees, then in the spill).
func named(q *queue, name string, archived bool) (*entry, error) {
	if len(name) > queuecore.MaxMessageName {
		return nil, nil
	}
	if e := q.Named(name, archived); e != nil {
		return e, nil
	}
	if archived || q.Ext.spill == nil {
		return nil, nil
	}
	_, e, err := q.Ext.spill.find(q, name)
	return e, err
}

// index is the in-memory metadata of the store. The Store's mutex guards it.
type index struct {
	memindex.Index[queueSpill]

	// Spilling (spill.go): off when spillAt is 0.
	spillAt    int
	spillKeep  int // spillKeepFor(spillAt)
	spillBatch int // spillBatchFor(spillKeep)
	spillDir   string
	spillGen   uint64
	spillTrim  int                 // trimmable's trimAt
	spilled    map[*queue]struct{} // queues with a spill
	spillLog   func(msg string, err error)
}

func newIndex() *index {
	return &index{
		Index:    memindex.NewIndex[queueSpill](),
		spilled:  map[*queue]struct{}{},
		spillLog: func(string, error) {},
	}
}

// get finds a message by ID, in the trees or in a spill.
func (ix *index) get(id uint64) (*entry, error) {
	if e := ix.ByID[id]; e != nil {
		return e, nil
	}
	for q := range ix.spilled {
		_, e, err := q.Ext.spill.byID(q, id)
		if e != nil || err != nil {
			return e, err
		}
	}
	return nil, nil
}

// spillKeepFor is the number of newest ready messages a queue with a
// spill keeps in its tree, for a threshold of spillAt: commits of
// concurrent publishes arrive a little out of (Seq, ID) order, and a
// message can go to the spill only after its last record. They move to
// the spill by batches of spillBatchFor(keep).
func spillKeepFor(spillAt int) int { return min(256, max(1, spillAt/16)) }

func spillBatchFor(keep int) int { return min(spillPerBlock, keep) }

// spillNew is called after a ready entry went into q's tree: it starts a
// spill once the tree holds spillAt messages and a batch more, and moves
// the oldest of the tail (the messages past the spill's end) to it once
// the tail holds a batch more than spillKeep.
func (ix *index) spillNew(q *queue, e *entry) {
	t := q.ByState[queuecore.StateReady]
	if q.Ext.spill != nil {
		if q.Ext.spill.after(e) {
			q.Ext.tail++
		}
		if q.Ext.tail < ix.spillKeep+ix.spillBatch {
			return
		}
		sp := q.Ext.spill
		pivot := &entry{Key: sp.lastKey, Seq: sp.lastSeq, ID: sp.last}
		var es []*entry
		t.AscendGreaterOrEqual(pivot, func(x *entry) bool {
			if memindex.LessOrder(pivot, x) {
				es = append(es, x)
			}
			return true
		})
		ix.moveToSpill(q, es)
		return
	}
	if t.Len() < ix.spillAt+ix.spillKeep+ix.spillBatch {
		return
	}
	ix.spillGen++
	sp, err := newSpill(ix.spillDir, ix.spillGen, q.Name)
	if err != nil {
		ix.spillLog("cannot spill ready messages; they stay in memory", err)
		ix.spillAt = 0
		return
	}
	q.Ext.spill = sp
	ix.spilled[q] = struct{}{}
	es := make([]*entry, 0, t.Len()-ix.spillAt)
	i := 0
	t.Ascend(func(x *entry) bool {
		if i >= ix.spillAt {
			es = append(es, x)
		}
		i++
		return true
	})
	ix.moveToSpill(q, es)
}

// moveToSpill appends the oldest of es (ready entries of q's tree, in
// order, all after the spill's end) to the spill, all but the newest
// spillKeep, and takes them out of the tree. One the spill cannot take
// (its ID is too far behind) stays. It recounts the tail.
func (ix *index) moveToSpill(q *queue, es []*entry) {
	sp := q.Ext.spill
	n := max(len(es)-ix.spillKeep, 0)
	moved := make([]bool, n)
	for i, e := range es[:n] {
		if !sp.canTake(e) {
			continue
		}
		if _, err := sp.append(e); err != nil {
			ix.spillLog("cannot write to the spill; ready messages stay in memory", err)
			ix.spillAt = 0
			break
		}
		moved[i] = true
		delete(ix.ByID, e.ID)
		q.ByState[e.State].Delete(e)
		q.Live.Delete(e)
	}
	q.Ext.tail = 0
	for i, e := range es {
		if (i >= n || !moved[i]) && sp.after(e) {
			q.Ext.tail++
		}
	}
}

// trimAll trims every spill where a trim is due: after a checkpoint let
// go of its views, which may have put off trims (spill.trimmable).
func (ix *index) trimAll() {
	for q := range ix.spilled {
		ix.trimSpill(q)
	}
}

func (ix *index) trimSpill(q *queue) {
	sp := q.Ext.spill
	if sp == nil || !sp.trimmable(ix.spillTrim) {
		return
	}
	if err := sp.trim(); err != nil {
		ix.spillLog("cannot give the spill's trimmed head back to the file system; its file keeps it", err)
	}
}

// dropSpill lets go of q's spill (its readers keep the file until done).
func (ix *index) dropSpill(q *queue) {
	if q.Ext.spill == nil {
		return
	}
	q.Ext.spill.dropped = true
	q.Ext.spill.release()
	q.Ext.spill = nil
	q.Ext.tail = 0
	delete(ix.spilled, q)
}

// Add puts e in the trees, and spills its queue's newest ready messages
// if it made them too many.
func (ix *index) Add(e *entry) {
	q := e.Q
	e.Slot = 0
	ix.Insert(e)
	if e.State == queuecore.StateReady && ix.spillAt > 0 {
		ix.spillNew(q, e)
	}
}

// Remove takes e out of the trees, or out of its queue's spill.
func (ix *index) Remove(e *entry) {
	q := e.Q
	if e.Slot == 0 && ix.ByID[e.ID] != e && q.Ext.spill != nil {
		// Moved to the spill since (undo of a batch).
		if _, se, err := q.Ext.spill.byID(q, e.ID); se != nil {
			e = se
		} else if err != nil {
			ix.spillLog("cannot read the spill", err)
		}
	}
	if e.Slot > 0 {
		q.Ext.spill.del(int(e.Slot - 1))
		if q.Ext.spill.live == 0 {
			ix.dropSpill(q)
		}
		c := &q.Counts[e.State]
		c.N--
		c.Bytes -= e.Size
		return
	}
	if e.State == queuecore.StateReady && q.Ext.spill != nil && q.Ext.spill.after(e) {
		q.Ext.tail--
	}
	ix.Delete(e)
}

// load adds a message read from the snapshot. It checks what ApplyOp
// checks.
func (ix *index) load(m *queuecore.Message) error {
	q, err := ix.CheckPlace(m)
	if err != nil {
		return err
	}
	if other, err := ix.get(m.ID); err != nil || other != nil {
		if err != nil {
			return err
		}
		return fmt.Errorf("message %d: ID %w", m.ID, queuecore.ErrExists)
	}
	e := memindex.NewEntry(m, q)
	if other, err := named(q, m.Name, m.State == queuecore.StateArchived); err != nil || other != nil {
		if err != nil {
			return err
		}
		return fmt.Errorf("message %d: %s %q in queue %s %w (message %d)",
			m.ID, memindex.KindOfName(m.State), m.Name, m.Queue, queuecore.ErrExists, other.ID)
	}
	ix.Add(e)
	ix.MaxID = max(ix.MaxID, e.ID, e.Seq)
	return nil
}

// applyOps applies a batch, all of it or nothing (memindex.ApplyOps).
func (ix *index) applyOps(ops []queuecore.Op) ([]change, error) { return memindex.ApplyOps(ix, ops) }

// ApplyOp checks op against the index, spills included, and applies it.
func (ix *index) ApplyOp(op *queuecore.Op) (change, error) {
	m := &op.Msg
	switch op.Kind {
	case queuecore.OpInsert:
		q, err := ix.CheckPlace(m)
		if err != nil {
			return change{}, err
		}
		if other, err := ix.get(m.ID); err != nil || other != nil {
			if err != nil {
				return change{}, err
			}
			return change{}, fmt.Errorf("insert message %d: ID %w", m.ID, queuecore.ErrExists)
		}
		other, err := named(q, m.Name, m.State == queuecore.StateArchived)
		if err != nil {
			return change{}, err
		}
		if other != nil {
			return change{}, fmt.Errorf("insert message %d: %s %q in queue %s %w (message %d)",
				m.ID, memindex.KindOfName(m.State), m.Name, m.Queue, queuecore.ErrExists, other.ID)
		}
		e := memindex.NewEntry(m, q)
		ix.Add(e)
		return change{New: e}, nil
	case queuecore.OpUpdate:
		old, err := ix.get(m.ID)
		if err != nil {
			return change{}, err
		}
		if old == nil {
			return change{}, fmt.Errorf("update message %d: %w", m.ID, queuecore.ErrNotFound)
		}
		q, err := ix.CheckPlace(m)
		if err != nil {
			return change{}, err
		}
		other, err := named(q, m.Name, m.State == queuecore.StateArchived)
		if err != nil {
			return change{}, err
		}
		if other != nil && other.ID != old.ID {
			return change{}, fmt.Errorf("update message %d: %s %q in queue %s %w (message %d)",
				m.ID, memindex.KindOfName(m.State), m.Name, m.Queue, queuecore.ErrExists, other.ID)
		}
		e := memindex.NewEntry(m, q)
		ix.Remove(old)
		ix.Add(e)
		return change{Old: old, New: e}, nil
	case queuecore.OpDelete:
		old, err := ix.get(m.ID)
		if err != nil {
			return change{}, err
		}
		if old == nil {
			return change{}, fmt.Errorf("delete message %d: %w", m.ID, queuecore.ErrNotFound)
		}
		ix.Remove(old)
		return change{Old: old}, nil
	}
	return change{}, fmt.Errorf("op kind %d: %w", op.Kind, errBadOp)
}

// noteIDs raises maxID to cover the IDs and Seqs of committed changes.
func (ix *index) noteIDs(changes []change) {
	for _, c := range changes {
		if c.New != nil {
			ix.MaxID = max(ix.MaxID, c.New.ID, c.New.Seq)
		}
	}
}

// putQueue creates a queue or replaces its info, keeping its messages.
func (ix *index) putQueue(info queuecore.QueueInfo) {
	if q := ix.Queues[info.Name]; q != nil {
		q.Info = info
		return
	}
	ix.Queues[info.Name] = memindex.NewQueue[queueSpill](info)
}

// deleteQueue removes a queue and every message in it.
func (ix *index) deleteQueue(q *queue) {
	ix.DropQueue(q)
	ix.dropSpill(q)
}

// lacks says whether no message has ID id (a spill that cannot be read
// counts as having it).
func (ix *index) lacks(id uint64) bool {
	e, err := ix.get(id)
	return e == nil && err == nil
}
