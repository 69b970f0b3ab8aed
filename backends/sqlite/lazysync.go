package sqlite

import (
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

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
	mu     sync.Mutex
	wal    string // path of the WAL file
	dirty  bool   // a NORMAL commit since the last sync that covers it
	armed  bool   // timer runs
	timer  *time.Timer
	closed bool
	onErr  func(error)

	syncMu  sync.Mutex // held by a sync of the file, and guards:
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

// committed is told of a group that was not synced (synced false); it
// arms the timer. committed(true) forgets what an fdatasync covered.
func (l *lazySync) committed(synced bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if synced {
		l.dirty = false
		return
	}
	l.dirty = true
	if l.armed || l.closed {
		return
	}
	l.armed = true
	if l.timer == nil {
		l.timer = time.AfterFunc(queuecore.SyncDelay, l.fire)
	} else {
		l.timer.Reset(queuecore.SyncDelay)
	}
}

// syncNow syncs the WAL before a durable group returns.
func (l *lazySync) syncNow() error {
	l.mu.Lock()
	l.dirty = false
	l.mu.Unlock()
	l.syncMu.Lock()
	err := l.syncFile()
	l.syncMu.Unlock()
	if err != nil {
		l.committed(false) // what it did not cover is still to sync
	}
	return err
}

// fire syncs the WAL if a NORMAL commit is not covered yet. The sync runs
// outside mu, so that a commit ending meanwhile does not wait for it: it
// marks the WAL dirty again and re-arms the timer.
func (l *lazySync) fire() {
	l.mu.Lock()
	l.armed = false
	if !l.dirty || l.closed {
		l.mu.Unlock()
		return
	}
	l.dirty = false
	l.mu.Unlock()
	l.syncMu.Lock()
	err := l.syncFile()
	l.syncMu.Unlock()
	if err != nil {
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
		// a store that has only leased and acked since it opened has had
		// none.
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
	dirty := l.dirty
	l.dirty = false
	l.mu.Unlock()
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	var err error
	if dirty {
		err = l.syncFile()
	}
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	return err
}
