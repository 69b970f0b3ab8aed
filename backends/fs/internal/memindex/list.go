package memindex

import (
	"bytes"
	"fmt"
	"sync"

	"yirangmq/queuecore"
)

// QueueInfos is every queue's info, by name, each with a copy of its
// policy of its own.
func (ix *Index[X]) QueueInfos() []queuecore.QueueInfo {
	qs := ix.SortedQueues()
	out := make([]queuecore.QueueInfo, len(qs))
	for i, q := range qs {
		out[i] = q.Info
		out[i].Policy = bytes.Clone(q.Info.Policy)
	}
	return out
}

// smallList is the size up to which List copies a tree's entries under the
// lock; larger trees are cloned (copy-on-write, O(1)) and walked after.
const smallList = 256

// List calls fn with the messages of a queue in one state, in (Key, Seq,
// ID) order: a store's List. mu is the lock that guards ix, not held by
// the caller; List takes it to copy the state's tree (or a small tree's
// entries) and calls fn without it.
func (ix *Index[X]) List(mu *sync.RWMutex, queue string, state queuecore.State, fn func(queuecore.Message) bool) error {
	if !state.Valid() {
		return fmt.Errorf("list: state %d: %w", state, ErrBadOp)
	}
	mu.RLock()
	q := ix.Queues[queue]
	if q == nil {
		mu.RUnlock()
		return fmt.Errorf("list queue %q: %w", queue, queuecore.ErrNotFound)
	}
	t := q.ByState[state]
	if t.Len() <= smallList {
		es := make([]*Entry[X], 0, t.Len())
		t.Ascend(func(e *Entry[X]) bool {
			es = append(es, e)
			return true
		})
		mu.RUnlock()
		for _, e := range es {
			if !fn(e.Message()) {
				break
			}
		}
		return nil
	}
	mu.RUnlock()
	mu.Lock() // Clone writes to the tree it clones
	q = ix.Queues[queue]
	if q == nil {
		mu.Unlock()
		return fmt.Errorf("list queue %q: %w", queue, queuecore.ErrNotFound)
	}
	t = q.ByState[state].Clone()
	mu.Unlock()
	t.Ascend(func(e *Entry[X]) bool { return fn(e.Message()) })
	return nil
}
