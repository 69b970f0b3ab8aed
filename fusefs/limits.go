package fusefs

import (
	"fmt"
	"sync"
)

// Limits that keep one user of a shared mount (allow_other) from starving
// the others: blocked .next readers and uncommitted bytes are counted in
// all and per uid (docs/multiuser.md).

// readerCount counts the .next reads blocked at once.
type readerCount struct {
	mu      sync.Mutex
	total   int
	byUID   map[uint32]int
	byQueue map[string]int
}

// enter takes a reader slot for uid on queue; it returns why not (for the
// log line) when a cap is reached.
func (r *readerCount) enter(o *Options, uid uint32, queue string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.total >= o.MaxNextReaders:
		return fmt.Sprintf("in all (max %d)", o.MaxNextReaders)
	case r.byUID[uid] >= o.MaxNextReadersPerUID:
		return fmt.Sprintf("for this uid (max %d)", o.MaxNextReadersPerUID)
	case r.byQueue[queue] >= o.MaxNextReadersPerQueue:
		return fmt.Sprintf("on this queue (max %d)", o.MaxNextReadersPerQueue)
	}
	if r.byUID == nil {
		r.byUID, r.byQueue = map[uint32]int{}, map[string]int{}
	}
	r.total++
	r.byUID[uid]++
	r.byQueue[queue]++
	return ""
}

func (r *readerCount) leave(uid uint32, queue string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total--
	if r.byUID[uid]--; r.byUID[uid] <= 0 {
		delete(r.byUID, uid)
	}
	if r.byQueue[queue]--; r.byQueue[queue] <= 0 {
		delete(r.byQueue, queue)
	}
}

// draftBytes counts the memory held by files not committed yet, per
// writer uid.
type draftBytes struct {
	mu    sync.Mutex
	total int64
	byUID map[uint32]int64
}

// grow accounts delta more bytes (delta may be negative) for uid. A growth
// past a bound is refused: nothing is accounted and it returns false.
func (d *draftBytes) grow(o *Options, uid uint32, delta int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if delta > 0 && (d.total+delta > o.MaxDraftBytes || d.byUID[uid]+delta > o.MaxDraftBytesPerUID) {
		return false
	}
	if d.byUID == nil {
		d.byUID = map[uint32]int64{}
	}
	d.total += delta
	if d.byUID[uid] += delta; d.byUID[uid] <= 0 {
		delete(d.byUID, uid)
	}
	return true
}
