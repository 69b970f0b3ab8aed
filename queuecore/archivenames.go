package queuecore

import (
	"context"
	"hash/maphash"
	"sync"
)

// archiveNames tells which names the archive of one queue cannot hold.
// An ack with the archive on (the default policy) replaces the archived
// message of the same name, if there is one, so it had to read the store
// for it at every ack, and almost always found nothing: names are rarely
// used twice. That read was a quarter of an ack's work in the daemon
// (sqlite store, docs/performance.md).
//
// It counts the archived names by a hash of the name, in buckets of one
// byte: a name whose bucket is empty is in no archived message, and the
// store is not read; any other name is looked up as before. A bucket that
// reaches 255 stays there, so a count is never too low. It is exact for
// the same reason as the name cache (namecache.go): every change of the
// archive is a commit of this core, made under the archived claim of the
// name, and applied counts it before the claim is released.
//
// known is false until the queue's archive has been counted: at open,
// when the queue's archive is no larger than archiveCountMax, or when the
// core created the queue. A commit that failed (and may have happened all
// the same) makes the queue's count unknown until the next open.
type archiveNames struct {
	mu      sync.Mutex
	known   bool
	buckets []uint8 // made at the first archived name
}

const (
	// archiveBuckets is the size of a queue's count, once its archive held
	// a message: 32 KiB. With the default policy's 10,000 archived
	// messages, about a quarter of new names share a bucket with one.
	archiveBuckets = 1 << 15
	// archiveCountMax bounds the archive that an open lists to count it
	// (the default policy keeps at most 10,000, plus the slack of its
	// trim); a larger archive is left uncounted.
	archiveCountMax = 1 << 14
)

var archiveSeed = maphash.MakeSeed()

func archiveBucket(name string) uint64 {
	return maphash.String(archiveSeed, name) & (archiveBuckets - 1)
}

// mayHold reports whether an archived message of the queue may be called
// name.
func (a *archiveNames) mayHold(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return !a.known || a.buckets != nil && a.buckets[archiveBucket(name)] != 0
}

// add counts a name that entered the archive, drop one that left it.
func (a *archiveNames) add(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.known {
		return
	}
	if a.buckets == nil {
		a.buckets = make([]uint8, archiveBuckets)
	}
	if b := &a.buckets[archiveBucket(name)]; *b < 255 {
		*b++
	}
}

func (a *archiveNames) drop(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.buckets == nil {
		return
	}
	if b := &a.buckets[archiveBucket(name)]; *b > 0 && *b < 255 {
		*b--
	}
}

// count starts counting: the archive holds names, all of them.
func (a *archiveNames) count(names []string) {
	a.mu.Lock()
	a.buckets, a.known = nil, true
	a.mu.Unlock()
	for _, n := range names {
		a.add(n)
	}
}

// lose stops counting: the store may hold archived names not counted.
func (a *archiveNames) lose() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.known, a.buckets = false, nil
}

// archiveTouch is a name entering (in) or leaving the archive of q in a
// batch.
type archiveTouch struct {
	q    *queue
	name string
	in   bool
}

// countArchive counts, at open, the archive of q if it holds no more than
// archiveCountMax messages.
func (c *Core) countArchive(ctx context.Context, q *queue) error {
	if q.gauges[StateArchived].N > archiveCountMax {
		return nil
	}
	var names []string
	if err := c.store.List(ctx, q.name, StateArchived, func(m Message) bool {
		names = append(names, m.Name)
		return true
	}); err != nil {
		return err
	}
	q.archive.count(names)
	return nil
}

// lookupArchived returns the archived message of q called name
// (ErrNotFound if none), reading the store only if the archive may hold
// one.
func (c *Core) lookupArchived(ctx context.Context, q *queue, name string) (Message, error) {
	if !q.archive.mayHold(name) {
		return Message{}, ErrNotFound
	}
	return c.store.Lookup(ctx, q.name, name, true)
}
