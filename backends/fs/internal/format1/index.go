package format1

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
// update replaces it with a new entry, which is what lets a checkpoint or a
// List walk a copy-on-write clone of the trees without a lock.
//
// It is kept small because a queue may hold a million messages: the name
// and every field that no tree orders by are packed in data (codec.go).
type entry struct {
	id    uint64
	seq   uint64
	key   int64 // Message.SortKey(); the deadline for leased and delayed
	size  int64
	q     *queue
	data  string // name, then the packed rest of the Message
	nlen  uint8  // len(name)
	state queuecore.State
	slot  int32 // record+1 in e.q's spill (a copy read from there), 0 in the trees
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
	spill    *spill // newer ready messages past the index's spillAt; nil: none
	tail     int    // ready messages in the tree that sort after the spill's last record
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

// named finds the message of q called name among the archived or the live
// (in the trees, then in the spill).
func (q *queue) named(name string, archived bool) (*entry, error) {
	t := q.live
	if archived {
		t = q.archived
	}
	if len(name) > 255 {
		return nil, nil
	}
	if e, ok := t.Get(&entry{data: name, nlen: uint8(len(name))}); ok {
		return e, nil
	}
	if archived || q.spill == nil {
		return nil, nil
	}
	_, e, err := q.spill.find(q, name)
	return e, err
}

// index is the in-memory metadata of the store. The Store's mutex guards it.
type index struct {
	queues map[string]*queue
	byID   map[uint64]*entry
	due    *btree.BTreeG[*entry] // leased and delayed messages by (deadline, id)
	maxID  uint64

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
		queues:   map[string]*queue{},
		byID:     map[uint64]*entry{},
		due:      btree.NewG(btreeDegree, lessDue),
		spilled:  map[*queue]struct{}{},
		spillLog: func(string, error) {},
	}
}

// get finds a message by ID, in the trees or in a spill.
func (ix *index) get(id uint64) (*entry, error) {
	if e := ix.byID[id]; e != nil {
		return e, nil
	}
	for q := range ix.spilled {
		_, e, err := q.spill.byID(q, id)
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
	t := q.byState[queuecore.StateReady]
	if q.spill != nil {
		if q.spill.after(e) {
			q.tail++
		}
		if q.tail < ix.spillKeep+ix.spillBatch {
			return
		}
		sp := q.spill
		pivot := &entry{key: sp.lastKey, seq: sp.lastSeq, id: sp.last}
		var es []*entry
		t.AscendGreaterOrEqual(pivot, func(x *entry) bool {
			if lessOrder(pivot, x) {
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
	sp, err := newSpill(ix.spillDir, ix.spillGen, q.name)
	if err != nil {
		ix.spillLog("cannot spill ready messages; they stay in memory", err)
		ix.spillAt = 0
		return
	}
	q.spill = sp
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
	sp := q.spill
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
		delete(ix.byID, e.id)
		q.byState[e.state].Delete(e)
		q.live.Delete(e)
	}
	q.tail = 0
	for i, e := range es {
		if (i >= n || !moved[i]) && sp.after(e) {
			q.tail++
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
	sp := q.spill
	if sp == nil || !sp.trimmable(ix.spillTrim) {
		return
	}
	if err := sp.trim(); err != nil {
		ix.spillLog("cannot give the spill's trimmed head back to the file system; its file keeps it", err)
	}
}

// dropSpill lets go of q's spill (its readers keep the file until done).
func (ix *index) dropSpill(q *queue) {
	if q.spill == nil {
		return
	}
	q.spill.dropped = true
	q.spill.release()
	q.spill = nil
	q.tail = 0
	delete(ix.spilled, q)
}

func timed(st queuecore.State) bool {
	return st == queuecore.StateLeased || st == queuecore.StateDelayed
}

func (ix *index) add(e *entry) {
	q := e.q
	e.slot = 0
	ix.byID[e.id] = e
	q.byState[e.state].ReplaceOrInsert(e)
	q.names(e.state).ReplaceOrInsert(e)
	if timed(e.state) {
		ix.due.ReplaceOrInsert(e)
	}
	c := &q.counts[e.state]
	c.N++
	c.Bytes += e.size
	if e.state == queuecore.StateReady && ix.spillAt > 0 {
		ix.spillNew(q, e)
	}
}

func (ix *index) remove(e *entry) {
	q := e.q
	if e.slot == 0 && ix.byID[e.id] != e && q.spill != nil {
		// Moved to the spill since (undo of a batch).
		if _, se, err := q.spill.byID(q, e.id); se != nil {
			e = se
		} else if err != nil {
			ix.spillLog("cannot read the spill", err)
		}
	}
	if e.slot > 0 {
		q.spill.del(int(e.slot - 1))
		if q.spill.live == 0 {
			ix.dropSpill(q)
		}
		c := &q.counts[e.state]
		c.N--
		c.Bytes -= e.size
		return
	}
	if e.state == queuecore.StateReady && q.spill != nil && q.spill.after(e) {
		q.tail--
	}
	delete(ix.byID, e.id)
	q.byState[e.state].Delete(e)
	q.names(e.state).Delete(e)
	if timed(e.state) {
		ix.due.Delete(e)
	}
	c := &q.counts[e.state]
	c.N--
	c.Bytes -= e.size
}

// load adds a message read from the snapshot. It checks what applyOp
// checks.
func (ix *index) load(m *queuecore.Message) error {
	q, err := ix.checkPlace(m)
	if err != nil {
		return err
	}
	if other, err := ix.get(m.ID); err != nil || other != nil {
		if err != nil {
			return err
		}
		return fmt.Errorf("message %d: ID %w", m.ID, queuecore.ErrExists)
	}
	e := newEntry(m, q)
	if other, err := q.named(m.Name, m.State == queuecore.StateArchived); err != nil || other != nil {
		if err != nil {
			return err
		}
		return fmt.Errorf("message %d: %s %q in queue %s %w (message %d)",
			m.ID, kindOfName(m.State), m.Name, m.Queue, queuecore.ErrExists, other.id)
	}
	ix.add(e)
	ix.maxID = max(ix.maxID, e.id, e.seq)
	return nil
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
		if other, err := ix.get(m.ID); err != nil || other != nil {
			if err != nil {
				return change{}, err
			}
			return change{}, fmt.Errorf("insert message %d: ID %w", m.ID, queuecore.ErrExists)
		}
		other, err := q.named(m.Name, m.State == queuecore.StateArchived)
		if err != nil {
			return change{}, err
		}
		if other != nil {
			return change{}, fmt.Errorf("insert message %d: %s %q in queue %s %w (message %d)",
				m.ID, kindOfName(m.State), m.Name, m.Queue, queuecore.ErrExists, other.id)
		}
		e := newEntry(m, q)
		ix.add(e)
		return change{new: e}, nil
	case queuecore.OpUpdate:
		old, err := ix.get(m.ID)
		if err != nil {
			return change{}, err
		}
		if old == nil {
			return change{}, fmt.Errorf("update message %d: %w", m.ID, queuecore.ErrNotFound)
		}
		q, err := ix.checkPlace(m)
		if err != nil {
			return change{}, err
		}
		other, err := q.named(m.Name, m.State == queuecore.StateArchived)
		if err != nil {
			return change{}, err
		}
		if other != nil && other.id != old.id {
			return change{}, fmt.Errorf("update message %d: %s %q in queue %s %w (message %d)",
				m.ID, kindOfName(m.State), m.Name, m.Queue, queuecore.ErrExists, other.id)
		}
		e := newEntry(m, q)
		ix.remove(old)
		ix.add(e)
		return change{old: old, new: e}, nil
	case queuecore.OpDelete:
		old, err := ix.get(m.ID)
		if err != nil {
			return change{}, err
		}
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

// noteIDs raises maxID to cover the IDs and Seqs of committed changes.
func (ix *index) noteIDs(changes []change) {
	for _, c := range changes {
		if c.new != nil {
			ix.maxID = max(ix.maxID, c.new.id, c.new.seq)
		}
	}
}

// putQueue creates a queue or replaces its info, keeping its messages.
func (ix *index) putQueue(info queuecore.QueueInfo) {
	if q := ix.queues[info.Name]; q != nil {
		q.info = info
		return
	}
	ix.queues[info.Name] = newQueue(info)
}

// deleteQueue removes a queue and every message in it.
func (ix *index) deleteQueue(q *queue) {
	for _, st := range queuecore.States {
		q.byState[st].Ascend(func(e *entry) bool {
			delete(ix.byID, e.id)
			if timed(e.state) {
				ix.due.Delete(e)
			}
			return true
		})
	}
	ix.dropSpill(q)
	delete(ix.queues, q.name)
}

// sortedQueues returns the queues by name.
func (ix *index) sortedQueues() []*queue {
	qs := make([]*queue, 0, len(ix.queues))
	for _, q := range ix.queues {
		qs = append(qs, q)
	}
	sortQueues(qs)
	return qs
}

func sortQueues(qs []*queue) {
	slices.SortFunc(qs, func(a, b *queue) int { return strings.Compare(a.name, b.name) })
}

// lacks says whether no message has ID id (a spill that cannot be read
// counts as having it).
func (ix *index) lacks(id uint64) bool {
	e, err := ix.get(id)
	return e == nil && err == nil
}
