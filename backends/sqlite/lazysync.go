package sqlite

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// lazySync is infrastructure of the store's own beside SQLite, and stays
// for a guarantee SQLite cannot give: in SyncFull a publish (any batch
// but queuecore.Op.NoSync ops) is on stable storage before it returns,
// while leases and acks need not wait for an fsync. SQLite's
// synchronous setting is per connection, not per commit: FULL syncs
// every commit (a lease as dear as a publish), NORMAL none (a publish
// that returned could be lost with the power).
//
// In SyncFull the writer runs with PRAGMA synchronous = NORMAL: a commit's
// WAL frames reach the kernel before it returns, so a killed daemon loses
// nothing, and the store syncs the WAL itself, through a descriptor of its
// own (the kernel syncs the file, whichever descriptor asks), which needs
// neither the writer nor SQLite's locks:
//
//   - a group with a batch that must be durable (a publish, anything but
//     queuecore.Op.NoSync ops) is synced before its callers return, after
//     the writer went on to the next group (Store.syncGroup): the sync of
//     one group overlaps the writing of the next. An fdatasync of the WAL
//     covers every frame written before it, those of earlier leases and
//     acks too;
//   - a group of leases and acks alone returns unsynced, and a timer
//     syncs it within queuecore.SyncDelay unless a durable group does
//     first.
//
// Checkpoints sync the WAL and the database file as in FULL. SyncStrict
// keeps SQLite's FULL: every commit syncs inside COMMIT.
type lazySync struct {
	wal   string // path of the WAL file
	onErr func(error)
	// onSynced is told, outside syncMu, that every commit up to a count
	// is on stable storage.
	onSynced func(upTo uint64)
	// onFailed is told, outside syncMu, that a sync of the WAL failed.
	onFailed func()
	written  atomic.Uint64 // commits so far, counted by their leader

	mu     sync.Mutex // guards the timer:
	armed  bool
	timer  *time.Timer
	closed bool

	syncMu  sync.Mutex // held by a sync of the file, and guards:
	synced  uint64     // commits covered by the last sync
	f       *os.File   // the WAL, opened at the first sync
	dirDone bool       // the store directory was synced once (the WAL's name)
}

// groupWaits reports whether a commit of group must be on stable storage
// before it returns.
func groupWaits(mode queuecore.SyncMode, group []*batch) bool {
	for _, b := range group {
		if b.fn != nil || queuecore.WaitsFor(mode, b.ops) {
			return true
		}
	}
	return false
}

// committed counts a commit; its leader calls it before handing the
// writer on, so the count follows the order of the frames in the WAL.
// A commit that need not wait arms the timer.
func (l *lazySync) committed(wait bool) uint64 {
	seq := l.written.Add(1)
	if !wait {
		l.mu.Lock()
		if !l.armed && !l.closed {
			l.armed = true
			if l.timer == nil {
				l.timer = time.AfterFunc(queuecore.SyncDelay, l.fire)
			} else {
				l.timer.Reset(queuecore.SyncDelay)
			}
		}
		l.mu.Unlock()
	}
	return seq
}

// sync returns once commit seq is on stable storage. Group commit: a sync
// covers every commit counted before it starts, so the callers queued
// behind one find theirs covered and return without a sync of their own.
func (l *lazySync) sync(seq uint64) error {
	l.syncMu.Lock()
	if l.synced >= seq {
		l.syncMu.Unlock()
		return nil
	}
	target := l.written.Load()
	if err := l.syncFile(); err != nil {
		l.syncMu.Unlock()
		if l.onFailed != nil {
			l.onFailed()
		}
		return err
	}
	l.synced = target
	l.syncMu.Unlock()
	if l.onSynced != nil {
		l.onSynced(target)
	}
	return nil
}

// unsynced reports whether a counted commit is not covered by a sync.
func (l *lazySync) unsynced() bool {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	return l.synced < l.written.Load()
}

// fire is the timer's: it syncs what the leases and acks since it was
// armed wrote, unless a durable commit did already.
func (l *lazySync) fire() {
	l.mu.Lock()
	l.armed = false
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return
	}
	if err := l.sync(l.written.Load()); err != nil {
		l.committed(false) // try again later
		if l.onErr != nil {
			l.onErr(err)
		}
	}
}

// syncFile makes the WAL durable up to what is written now; syncMu is held.
func (l *lazySync) syncFile() error {
	if l.f == nil {
		f, err := os.Open(l.wal)
		if err != nil {
			return err
		}
		l.f = f
	}
	if err := unix.Fdatasync(int(l.f.Fd())); err != nil {
		return err
	}
	if !l.dirDone {
		// SQLite syncs the directory at the first FULL sync of a new WAL;
		// this store's syncs are its own.
		d, err := os.Open(filepath.Dir(l.wal))
		if err != nil {
			return err
		}
		err = d.Sync()
		d.Close()
		if err != nil {
			return err
		}
		l.dirDone = true
	}
	return nil
}

// close stops the timer and syncs what is not synced yet; Close calls it
// before its checkpoint, with no commit in flight.
func (l *lazySync) close() error {
	l.mu.Lock()
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	err := l.sync(l.written.Load())
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	return err
}
