package format1

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// Apply commits a batch: see "Commits" in the package comment. Once the
// record is written Apply does not look at ctx again: a commit is never
// reported as failed because its caller went away.
func (s *Store) Apply(ctx context.Context, ops []queuecore.Op) error {
	if len(ops) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Big bodies are written and synced before the lock (staged.go), so
	// that commits of other messages do not wait for them.
	var staged []*stagedBody
	if s.stages(ops) {
		s.mu.RLock()
		err := s.writableLocked()
		if err == nil {
			s.inflight.Add(1) // Close waits for this commit from here
		}
		s.mu.RUnlock()
		if err != nil {
			return err
		}
		defer s.inflight.Done()
		if staged, err = s.stageBodies(ops); err != nil {
			return err
		}
	}
	s.mu.Lock()
	if err := s.writableLocked(); err != nil {
		s.mu.Unlock()
		s.unstage(ops, staged)
		return err
	}
	changes, err := s.ix.applyOps(ops)
	if err != nil {
		s.mu.Unlock()
		s.unstage(ops, staged)
		return err
	}
	frame, bodyAt := encodeApplyRecord(s.lsn+1, ops, staged)
	if len(frame)-frameHeaderLen > maxPayload {
		s.ix.undo(changes)
		s.mu.Unlock()
		s.unstage(ops, staged)
		return fmt.Errorf("batch of %d bytes: %w", len(frame), queuecore.ErrTooLarge)
	}
	end, err := s.appendLocked(frame)
	if err != nil {
		s.ix.undo(changes)
		s.mu.Unlock()
		s.unstage(ops, staged)
		return err
	}
	s.lsn++
	s.ix.noteIDs(changes)
	// A staged body counts towards the next checkpoint as if it were in
	// the journal: its staged name stays until a snapshot holds this
	// record.
	s.sinceCkpt += stagedBytes(staged)
	fileOps := s.fileOpsFor(changes, ops, frame, bodyAt, staged)
	s.ix.trimSpills(changes)
	if !queuecore.WaitsFor(s.opts.Sync, ops) && s.opts.Sync == queuecore.SyncFull {
		return s.commitLazyLocked(end, fileOps)
	}
	return s.commitLocked(end, fileOps)
}

// PutQueue creates a queue or replaces its policy and permissions.
func (s *Store) PutQueue(ctx context.Context, q queuecore.QueueInfo) error {
	if err := queuecore.CheckQueueName(q.Name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	q.Policy = bytes.Clone(q.Policy) // the store keeps its own copy
	s.mu.Lock()
	if err := s.writableLocked(); err != nil {
		s.mu.Unlock()
		return err
	}
	end, err := s.appendLocked(encodePutQueueRecord(s.lsn+1, &q))
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.lsn++
	var fileOps []fileOp
	if s.ix.queues[q.Name] == nil {
		fileOps = []fileOp{{kind: opMkQueue, to: q.Name}}
	}
	s.ix.putQueue(q)
	return s.commitLocked(end, fileOps)
}

// DeleteQueue removes a queue and all its messages. Its directory is moved
// to the trash once the record is durable and emptied in the background.
func (s *Store) DeleteQueue(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if err := s.writableLocked(); err != nil {
		s.mu.Unlock()
		return err
	}
	q := s.ix.queues[name]
	if q == nil {
		s.mu.Unlock()
		return fmt.Errorf("delete queue %q: %w", name, queuecore.ErrNotFound)
	}
	end, err := s.appendLocked(encodeDeleteQueueRecord(s.lsn+1, name))
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.lsn++
	s.ix.deleteQueue(q)
	return s.commitLocked(end, []fileOp{{kind: opRmQueue, from: name, id: s.lsn}})
}

// commitLocked finishes a commit whose record ends at end: it queues the
// record's file operations, unlocks mu, waits until the record is durable
// and does the file operations.
func (s *Store) commitLocked(end int64, fileOps []fileOp) error {
	if len(fileOps) > 0 {
		s.pending = append(s.pending, pendingRecord{end: end, ops: fileOps})
	}
	s.inflight.Add(1)
	defer s.inflight.Done()
	s.maybeCheckpointLocked()
	s.mu.Unlock()

	if s.opts.Sync.Durable() {
		if err := s.waitDurable(end); err != nil {
			return err
		}
	}
	if len(fileOps) > 0 {
		if s.cfg.beforeFileOps != nil {
			s.cfg.beforeFileOps()
		}
		s.runFileOps(end)
	}
	return nil
}

// commitLazyLocked is commitLocked for a batch of queuecore.Op.NoSync ops
// (a lease, an ack) in SyncFull: the record is written to the kernel, so
// a killed process loses nothing, but Apply does not wait for its
// fdatasync. The next commit that waits covers it (the journal is synced
// up to its end); if none comes, a timer syncs it within
// queuecore.SyncDelay. The file operations wait for the record to be
// durable, as in commitLocked, and so run with that sync.
func (s *Store) commitLazyLocked(end int64, fileOps []fileOp) error {
	if len(fileOps) > 0 {
		s.pending = append(s.pending, pendingRecord{end: end, ops: fileOps})
	}
	s.maybeCheckpointLocked()
	s.armLazyLocked()
	s.mu.Unlock()
	return nil
}

// armLazyLocked starts the timer that syncs the journal, unless it runs.
// mu is held.
func (s *Store) armLazyLocked() {
	if s.lazyArmed {
		return
	}
	s.lazyArmed = true
	if s.lazyTimer == nil {
		s.lazyTimer = time.AfterFunc(queuecore.SyncDelay, s.syncLazy)
	} else {
		s.lazyTimer.Reset(queuecore.SyncDelay)
	}
}

// syncLazy is the timer's: it syncs what the leases and acks since it
// was armed wrote.
func (s *Store) syncLazy() {
	s.mu.Lock()
	s.lazyArmed = false
	s.mu.Unlock()
	s.flushLazy()
}

// flushLazy makes every record written so far durable and runs the file
// operations that waited for it: the timer's work, and Close's. (A read
// of a body whose file is still to be moved reads it where it is:
// pendingFrom.)
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

// appendLocked writes a framed record at the end of the journal with one
// write(2) and returns the logical position of its end.
func (s *Store) appendLocked(frame []byte) (int64, error) {
	j := s.cur.Load()
	if err := j.reserve(len(frame)); err != nil {
		return 0, err
	}
	n, err := j.f.WriteAt(frame, j.size)
	if err != nil {
		// A part of the record may be in the file: zero it, so that the
		// next record does not follow a torn one (replay would stop there).
		if n > 0 {
			if _, zerr := j.f.WriteAt(make([]byte, n), j.size); zerr != nil {
				s.failLocked(fmt.Errorf("erase a partly written journal record: %w (after %w)", zerr, err))
			}
		}
		return 0, fmt.Errorf("append to journal: %w", err)
	}
	j.size += int64(len(frame))
	s.sinceCkpt += int64(len(frame))
	end := j.end()
	s.written.Store(end)
	if !s.opts.Sync.Durable() {
		// In these modes a record is as durable as promised once written.
		s.synced.Store(end)
	}
	return end, nil
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
