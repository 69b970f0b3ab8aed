package format1

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"path/filepath"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// replayState is what replaying the journals learns for the repair.
type replayState struct {
	records       int
	skipped       int
	tornTails     int
	files         []*os.File          // the journals, for reading bodies
	bodies        map[uint64]bodyRef  // bodies of live messages inserted by replayed records
	touched       map[uint64]bool     // hashes (pathHash) of body paths replayed records wrote, moved or removed
	history       map[uint64][]string // earlier paths of messages that replayed records moved
	deletedQueues map[string]bool     // queues a replayed record deleted
	stagedCut     bool                // a record whose staged body is missing ended the replay
}

// bodyRef is where a body lies in a journal file, or, if staged is set,
// what the record says of a body staged in DIR/staged.
type bodyRef struct {
	file   int
	off    int64
	n      int
	staged *stagedBody
}

func (rs *replayState) close() {
	for _, f := range rs.files {
		f.Close()
	}
}

// read returns the body ref points to.
func (rs *replayState) read(ref bodyRef) ([]byte, error) {
	b := make([]byte, ref.n)
	if _, err := rs.files[ref.file].ReadAt(b, ref.off); err != nil {
		return nil, fmt.Errorf("read body from journal: %w", err)
	}
	return b, nil
}

// isTouched says whether the replayed records could have changed path.
func (rs *replayState) isTouched(queue, path string) bool {
	return rs.touched[pathHash(path)] || rs.deletedQueues[queue]
}

// recover loads the store at Open: snapshot, journals, reconciliation, and
// a checkpoint if anything was replayed or repaired.
func (s *Store) recover(ctx context.Context) error {
	if err := os.MkdirAll(s.qdir, 0o700); err != nil {
		return err
	}
	// Spill files are a cache of what the snapshot and journal hold: the
	// load below writes them again.
	if err := os.RemoveAll(filepath.Join(s.dir, spillDir)); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.dir, tempPrefix+snapshotName)); err == nil {
		s.log.Info("removed an unfinished snapshot")
	}
	snap, err := readSnapshot(s.dir, s.ix)
	if err != nil {
		return err
	}
	s.lsn = snap.lsn
	s.ckptAt = s.checkpointAt(snap.size)

	rs := &replayState{
		bodies:        map[uint64]bodyRef{},
		touched:       map[uint64]bool{},
		history:       map[uint64][]string{},
		deletedQueues: map[string]bool{},
	}
	defer rs.close()
	dirty := false
	for _, name := range []string{oldJournalName, journalName} {
		if rs.stagedCut {
			// The records of the newer journal came after the cut: they
			// go with it. Emptied now, and durably, not only by the
			// open's checkpoint below: a crash between its removal of
			// journal.old and its truncation of this file would let the
			// next open replay them after a gap.
			if err := emptyJournal(filepath.Join(s.dir, name)); err != nil {
				return err
			}
			s.log.Warn("emptied the journal after a commit cut short", logJournal, name)
			dirty = true
			break
		}
		nonEmpty, err := s.replayJournal(name, rs)
		if err != nil {
			return err
		}
		dirty = dirty || nonEmpty
	}
	repairs, err := s.reconcile(ctx, rs)
	if err != nil {
		return fmt.Errorf("repair: %w", err)
	}
	if rs.records > 0 || rs.skipped > 0 || rs.tornTails > 0 {
		s.log.Info("replayed the journal", logCount, rs.records, logSkipped, rs.skipped, logTorn, rs.tornTails, logLSN, s.lsn)
	}
	if dirty || repairs > 0 {
		if err := s.checkpointAtOpen(); err != nil {
			return err
		}
		return s.cleanStaged()
	}
	path := filepath.Join(s.dir, journalName)
	_, statErr := os.Lstat(path)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open journal: %w", err)
	}
	s.cur.Store(&journal{f: f})
	if statErr != nil && s.opts.Sync != queuecore.SyncOff {
		// A new store: its journal's name must be durable before a commit is.
		if err := backends.SyncDir(s.dir); err != nil {
			return err
		}
		if err := backends.SyncDir(filepath.Dir(filepath.Clean(s.dir))); err != nil {
			return err
		}
	}
	return s.cleanStaged()
}

// replayJournal applies the records of one journal file that the snapshot
// does not hold. A torn tail is cut off. nonEmpty says whether the file
// held anything.
func (s *Store) replayJournal(name string, rs *replayState) (nonEmpty bool, err error) {
	path := filepath.Join(s.dir, name)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open %s: %w", name, err)
	}
	file := len(rs.files)
	rs.files = append(rs.files, f)
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	var last uint64 // lsn of the record before, in this file
	good, torn, err := scanJournal(f, func(off int64, payload []byte) error {
		rec, err := decodeRecord(payload)
		if err != nil {
			return fmt.Errorf("%s at byte %d: %w", name, off-frameHeaderLen, err)
		}
		if last != 0 && rec.lsn <= last {
			return errStaleRecord
		}
		last = rec.lsn
		if rec.lsn <= s.lsn {
			return nil // the snapshot holds it: a crash came between snapshot and truncation
		}
		if id, missing := s.stagedMissing(rec); missing {
			// A power cut came before the name of a body staged for this
			// record was durable: the record never counted as durable,
			// nor did any after it, so it and they are a torn tail.
			s.log.Warn("a journal record names a staged body that is not there: it and what follows are a commit cut short",
				logJournal, name, logLSN, rec.lsn, logID, id)
			rs.stagedCut = true
			return errStaleRecord
		}
		if rec.lsn != s.lsn+1 {
			s.log.Warn("the journal skips records", logAfterLSN, s.lsn, logLSN, rec.lsn, logJournal, name)
		}
		s.replayRecord(rec, rs, file, off)
		s.lsn = rec.lsn
		rs.records++
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("replay %s: %w", name, err)
	}
	if torn {
		rs.tornTails++
		s.log.Warn("ignored the torn tail of the journal (a crash cut a write short)",
			logJournal, name, logOffset, good)
		if err := f.Truncate(good); err != nil {
			return false, fmt.Errorf("cut torn tail of %s: %w", name, err)
		}
	}
	return fi.Size() > 0 || name == oldJournalName, nil
}

// replayRecord applies one record to the index. A record that does not
// apply (which only a damaged journal can hold) is logged and skipped.
func (s *Store) replayRecord(rec *record, rs *replayState, file int, off int64) {
	switch {
	case rec.putQueue != nil:
		if err := queuecore.CheckQueueName(rec.putQueue.Name); err != nil {
			s.log.Error("journal record does not apply; skipped", logLSN, rec.lsn, logErr, err)
			rs.skipped++
			return
		}
		s.ix.putQueue(*rec.putQueue)
	case rec.deleteQueue != "":
		q := s.ix.Queues[rec.deleteQueue]
		if q == nil {
			s.log.Error("journal record deletes an unknown queue; skipped", logLSN, rec.lsn, logQueue, rec.deleteQueue)
			rs.skipped++
			return
		}
		for _, st := range queuecore.States {
			q.ByState[st].Ascend(func(e *entry) bool {
				delete(rs.bodies, e.ID)
				return true
			})
		}
		if err := q.Ext.spill.each(q, func(e *entry) { delete(rs.bodies, e.ID) }); err != nil {
			s.log.Error("read spill of a deleted queue", logErr, err)
		}
		s.ix.deleteQueue(q)
		rs.deletedQueues[q.Name] = true
	default:
		changes, err := s.ix.applyOps(rec.ops)
		if err != nil {
			s.log.Error("journal record does not apply; skipped", logLSN, rec.lsn, logErr, err)
			rs.skipped++
			return
		}
		s.ix.noteIDs(changes)
		for i, c := range changes {
			var oldPath, newPath string
			if c.Old != nil {
				oldPath = s.entryPath(c.Old)
				rs.touched[pathHash(oldPath)] = true
			}
			if c.New != nil {
				newPath = s.entryPath(c.New)
				rs.touched[pathHash(newPath)] = true
			}
			switch {
			case c.Old == nil && rec.staged != nil && rec.staged[i] != nil:
				rs.bodies[c.New.ID] = bodyRef{staged: rec.staged[i]}
			case c.Old == nil:
				rs.bodies[c.New.ID] = bodyRef{file: file, off: off + int64(rec.bodyAt[i]), n: len(rec.ops[i].Body)}
			case c.New == nil:
				delete(rs.bodies, c.Old.ID)
				delete(rs.history, c.Old.ID)
			case oldPath != newPath:
				rs.history[c.New.ID] = append(rs.history[c.New.ID], oldPath)
			}
		}
	}
}

// pathSeed keys pathHash for the life of the process.
var pathSeed = maphash.MakeSeed()

// pathHash keys the replay's set of touched paths by a 64-bit hash rather
// than the path (8 bytes, not a string, per record replayed). A collision
// (odds about n²/2⁶⁵) only makes the repair look closely at a path that
// needed no look, or remove an unexplained file instead of keeping it.
func pathHash(p string) uint64 { return maphash.String(pathSeed, p) }

// emptyJournal truncates the journal at path, if there is one, and syncs
// it.
func emptyJournal(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("empty %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	return nil
}
