package format1

import (
	"fmt"
	"sync/atomic"

	"yirangmq/backends"
)

// flushLazy makes every record written so far durable and runs the file
// operations that waited for it: Close's first step.
func (s *Store) flushLazy() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return // Close syncs and checkpoints
	}
	s.inflight.Add(1)
	defer s.inflight.Done()
	end := s.written.Load()
	s.mu.Unlock()
	if err := s.waitDurable(end); err != nil {
		s.log.Error("sync of the journal after leases and acks failed", "dir", s.dir, logErr, err)
		return
	}
	s.runFileOps(end)
}

// waitDurable returns once an fdatasync of the journal covers position pos.
// Group commit: whoever takes syncMu first syncs everything written so far,
// so the commits that queued behind it find their record already covered
// and return without an fsync of their own.
func (s *Store) waitDurable(pos int64) error {
	if s.synced.Load() >= pos {
		return nil
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.synced.Load() >= pos {
		return nil
	}
	if err := s.failure(); err != nil {
		return fmt.Errorf("fs store %s failed earlier: %w", s.dir, err)
	}
	// Load written before cur: a rotation publishes the new journal before
	// a record is written to it, so if target reaches into the new journal
	// we see the new one here, and if we see the old one it holds all of
	// target.
	target := s.written.Load()
	j := s.cur.Load()
	if err := s.syncRotationLocked(j); err != nil { // and DIR/staged first
		return err
	}
	if err := s.syncedOrFail(s.fdatasync(j.f), "fdatasync journal"); err != nil {
		return err
	}
	storeMax(&s.synced, target)
	return nil
}

// syncRotation makes what the last rotation left unsynced durable: see
// syncRotationLocked. The checkpoint calls it before it closes the old
// journal.
func (s *Store) syncRotation() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if err := s.failure(); err != nil {
		return fmt.Errorf("fs store %s failed earlier: %w", s.dir, err)
	}
	return s.syncRotationLocked(s.cur.Load())
}

// syncRotationLocked is the first sync after a rotation (rotateLocked),
// if j is the journal it started: the old journal's tail, then the
// directory, which holds the names journal.old and journal. syncMu is
// held.
//
// Before any sync of a journal, DIR/staged is synced if a body was
// staged since it last was (syncStagedLocked): every record a journal
// sync makes durable must find its staged body's name durable too, and
// the checkpoint syncs the old journal here, not in waitDurable.
func (s *Store) syncRotationLocked(j *journal) error {
	if err := s.syncStagedLocked(); err != nil {
		return err
	}
	p := j.prev
	if p == nil {
		return nil
	}
	if err := s.syncedOrFail(s.fdatasync(p.f), "fdatasync old journal"); err != nil {
		return err
	}
	if err := s.syncedOrFail(backends.SyncDir(s.dir), "sync store directory after a journal rotation"); err != nil {
		return err
	}
	j.prev = nil
	storeMax(&s.synced, p.end())
	return nil
}

// syncedOrFail counts a sync and fails the store if it failed. syncMu is
// held.
func (s *Store) syncedOrFail(err error, what string) error {
	s.fsyncs.Add(1)
	if err == nil {
		return nil
	}
	err = fmt.Errorf("%s: %w", what, err)
	s.mu.Lock()
	s.failLocked(err)
	s.mu.Unlock()
	return err
}

// storeMax raises v to x.
func storeMax(v *atomic.Int64, x int64) {
	for {
		old := v.Load()
		if old >= x || v.CompareAndSwap(old, x) {
			return
		}
	}
}
