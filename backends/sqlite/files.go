package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// Big bodies live in files, not in the database.
//
// A body of fileBodies bytes or more (256 KiB by default, Tuning) is
// written to STORE/bodies/ID, a file of its own, and its row records that
// (messages.body NULL, the ID in the files table). In the database such a
// body would be 128 overflow pages per 256 KiB: written to the WAL a page
// at a time, copied into the database file by the next checkpoint, read
// back through SQLite's page cache and copied twice more at every read.
// In a file it is written once, and a reader through the mount reads it
// in place (queuecore.BodyFiler: FUSE passthrough, as the fs store's).
//
// The fs store keeps its bodies in files too, but not by these rules: its
// file is the message itself (named by its queue, state and name, its
// metadata in the file's attributes, moved at every transition), where
// this one is a side file named by the message's ID that only the row
// names and that never moves. What the two share, a file written whole
// and synced before the commit that names it, is a few lines each.
//
// Order of writes, so that no committed row ever names a missing file:
//
//   - Apply writes each such body to its file (O_EXCL: an ID is never
//     given twice) before the batch goes to the writer; in SyncFull and
//     SyncStrict it fdatasyncs the files and then fsyncs bodies/ once, so
//     the files are on disk before the commit that names them is.
//   - If the batch fails, Apply removes the files it wrote (unless it
//     failed after its commit, at the WAL's sync: the row may stay).
//   - A delete (an ack, a queue deleted) removes the file once the
//     commit that deleted the row is on stable storage (dropFiles): at
//     once for a commit that waited for its sync, after the lazy sync
//     that covers it (within queuecore.SyncDelay) for an ack in SyncFull.
//
// What a crash leaves, and what Open does with it (sweepFiles):
//
//   - a file whose row never committed (a crash between the two): an
//     orphan, removed;
//   - a file whose row was deleted before the crash but not removed:
//     an orphan, removed;
//   - a row whose file is gone or short: in SyncNormal and SyncOff the
//     files are not synced, so a power cut after a checkpoint can keep a
//     row and lose (part of) its file, or bring back an acked row whose
//     file was removed. Open deletes the row and logs it, rather than
//     keep a message that can never be read. (In SyncFull and SyncStrict
//     only a file removed or changed by hand makes it happen, and then
//     the body is lost anyway.)

// defaultFileBodies is the size from which a body is kept in a file: past
// it, a read through the mount is served from the file by the kernel and
// a body costs the database no pages; below it, a file would cost a
// publish two more syncs (the file, the directory) than the WAL's.
const defaultFileBodies = 256 << 10

// bodiesDir is the directory of body files inside the store directory.
const bodiesDir = "bodies"

// Tuning holds the sqlite store's settings beyond backends.Options.
type Tuning struct {
	// FileBodies is the size in bytes from which a body is kept in a
	// file of its own (0: 256 KiB; negative: never, every body stays in
	// the database file).
	FileBodies int64
}

// fileMin returns the least body size kept in a file, or 0 for none.
func (s *Store) fileMin() int64 {
	switch n := s.config.fileBodies; {
	case n < 0:
		return 0
	case n == 0:
		return defaultFileBodies
	default:
		return n
	}
}

// BodyFileMin tells queuecore that bodies smaller than this are never in
// files (queuecore.BodyFileMinner): a read of one needs no look for a file.
func (s *Store) BodyFileMin() int64 {
	if n := s.fileMin(); n > 0 {
		return n
	}
	return 1 << 62 // none are; files from an earlier run are read by Body
}

func (s *Store) bodyPath(id uint64) string {
	return filepath.Join(s.bodies, strconv.FormatUint(id, 10))
}

// apply is Apply: bodies past fileMin go to their files first.
func (s *Store) apply(ops []queuecore.Op) error {
	b := &batch{ops: ops}
	if min := s.fileMin(); min > 0 {
		for i := range ops {
			if ops[i].Kind == queuecore.OpInsert && int64(len(ops[i].Body)) >= min {
				if b.inFile == nil {
					b.inFile = make([]bool, len(ops))
				}
				b.inFile[i] = true
			}
		}
	}
	if b.inFile != nil {
		written, err := s.writeFiles(ops, b.inFile)
		defer s.forget(written)
		if err != nil {
			s.removeFiles(written)
			return withErrno(err)
		}
		if err := s.write(b); err != nil {
			if !b.committed {
				s.removeFiles(written)
			}
			// else the commit stands but its sync failed: the row may be
			// there after a restart, and needs its file (Open removes it
			// if not).
			return err
		}
	} else if err := s.write(b); err != nil {
		return err
	}
	s.dropFiles(b)
	return nil
}

// dropFiles removes the body files that b's deletes left unreferenced,
// once b's commit is on stable storage: at once, or, for a commit that
// returned before its sync (leases and acks in SyncFull), after the sync
// that covers it. A power cut can thus undo an ack, but never leave the
// message it brings back without its body. (In SyncNormal and SyncOff no
// commit is waited for; their files go at once.)
func (s *Store) dropFiles(b *batch) {
	if len(b.gone) == 0 {
		return
	}
	s.removals.mu.Lock()
	if s.removals.kept {
		s.removals.mu.Unlock()
		return
	}
	if b.seq == 0 || s.removals.synced >= b.seq {
		s.removals.mu.Unlock()
		s.removeFiles(b.gone)
		return
	}
	s.removals.due = append(s.removals.due, pendingRemoval{seq: b.seq, ids: b.gone})
	s.removals.mu.Unlock()
}

// pendingRemoval is body files to remove once commit seq is synced.
type pendingRemoval struct {
	seq uint64
	ids []uint64
}

// syncFailed is lazySync.onFailed. After a failed fdatasync, Linux
// reports the error once and may call the pages clean: a later sync that
// succeeds proves nothing about the frames written before it, nor, as a
// WAL's frames chain their checksums, about those after. So no body file
// is removed for the rest of the run; the next Open removes those that no
// row names, after a sync of the WAL.
func (s *Store) syncFailed() {
	s.removals.mu.Lock()
	first := !s.removals.kept
	s.removals.kept = true
	clear(s.removals.due)
	s.removals.due = nil
	s.removals.mu.Unlock()
	if first {
		s.log.Error("a sync of the WAL failed: the body files of acked messages are kept until the next start", queuecore.LogPath, s.path)
	}
}

// synced is lazySync.onSynced: it removes the files whose deletes are on
// stable storage now.
func (s *Store) synced(upTo uint64) {
	s.removals.mu.Lock()
	if s.removals.kept {
		s.removals.mu.Unlock()
		return
	}
	s.removals.synced = max(s.removals.synced, upTo)
	var ids []uint64
	keep := s.removals.due[:0]
	for _, p := range s.removals.due {
		if p.seq <= upTo {
			ids = append(ids, p.ids...)
		} else {
			keep = append(keep, p)
		}
	}
	clear(s.removals.due[len(keep):])
	s.removals.due = keep
	s.removals.mu.Unlock()
	s.removeFiles(ids)
}

// writeFiles writes the marked bodies to their files, durably in SyncFull
// and SyncStrict, and returns the IDs of the files it made (also on error,
// for the caller to remove). The IDs stay in s.writing until forget.
func (s *Store) writeFiles(ops []queuecore.Op, inFile []bool) (written []uint64, err error) {
	durable := s.sync.Durable()
	for i := range ops {
		if !inFile[i] {
			continue
		}
		// Before the commit: a delete must look for its file. A delete
		// is told the row's size, which queuecore makes len(Body); the
		// smaller of the two, should they ever differ.
		s.fileFloor.note(min(int64(len(ops[i].Body)), ops[i].Msg.Size))
		id := ops[i].Msg.ID
		if err := s.claim(id); err != nil {
			return written, err
		}
		f, err := s.createFile(id)
		if err != nil {
			s.forget([]uint64{id})
			return written, err
		}
		written = append(written, id)
		_, err = f.Write(ops[i].Body)
		if err == nil && durable {
			err = unix.Fdatasync(int(f.Fd()))
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return written, fmt.Errorf("write the body file of message %d: %w", id, err)
		}
	}
	if durable {
		if err := backends.SyncDir(s.bodies); err != nil {
			return written, err
		}
	}
	return written, nil
}

// claim marks id as having its body file written, so that no other Apply
// of the same ID takes the file for an orphan. ErrExists if one is.
func (s *Store) claim(id uint64) error {
	s.writingMu.Lock()
	defer s.writingMu.Unlock()
	if _, ok := s.writing[id]; ok {
		return fmt.Errorf("insert message %d: message id is taken: %w", id, queuecore.ErrExists)
	}
	s.writing[id] = struct{}{}
	return nil
}

func (s *Store) forget(ids []uint64) {
	s.writingMu.Lock()
	defer s.writingMu.Unlock()
	for _, id := range ids {
		delete(s.writing, id)
	}
}

// createFile creates the body file of a new message. A file of that name
// can only be left by a crash (an orphan, which sweepFiles would have
// removed) or belong to a message with that ID: the insert then fails
// with ErrExists, as it would in the database.
func (s *Store) createFile(id uint64) (*os.File, error) {
	path := s.bodyPath(id)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if !errors.Is(err, os.ErrExist) {
		if err != nil {
			return nil, fmt.Errorf("create the body file of message %d: %w", id, err)
		}
		return f, nil
	}
	if _, err := s.size(id); err == nil {
		// Its file is named in the database: a committed message's.
		return nil, fmt.Errorf("insert message %d: message id is taken: %w", id, queuecore.ErrExists)
	} else if !errors.Is(err, queuecore.ErrNotFound) {
		return nil, err
	}
	s.log.Warn("removing a body file that no message names", queuecore.LogPath, path)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove orphan body file: %w", err)
	}
	f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create the body file of message %d: %w", id, err)
	}
	return f, nil
}

// removeFiles removes body files that no row names any more. A failure
// leaves an orphan, which the next Open removes: logged, not returned, as
// the commit stands.
func (s *Store) removeFiles(ids []uint64) {
	for _, id := range ids {
		if err := os.Remove(s.bodyPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("could not remove a body file; the next start removes it", queuecore.LogPath, s.bodyPath(id), "err", err)
		}
	}
}

// size returns the size of message id's body file, or ErrNotFound when
// it has none (no such message, or its body is in the database).
func (s *Store) size(id uint64) (int64, error) {
	var n int64
	err := s.read(func(r *reader) error {
		r.args[0].Value = int64(id)
		dest := r.dest[:1]
		found, err := r.one(r.size, 1, dest)
		if err != nil {
			return err
		}
		if !found {
			return queuecore.ErrNotFound
		}
		var c scanner
		n = c.int(dest[0])
		return c.err
	})
	return n, err
}

// BodyFile opens the file of message id's body for reading in place
// (queuecore.BodyFiler). It returns nil when the body is in the database.
func (s *Store) BodyFile(_ context.Context, id uint64) (*os.File, error) {
	if !s.fileFloor.any() {
		return nil, nil
	}
	f, err := os.OpenFile(s.bodyPath(id), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		// In the database (or gone: Body tells).
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("body of message %d: %w", id, err)
	}
	size, err := s.size(id)
	if err == nil {
		err = checkFile(f, id, size)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("body of message %d: %w", id, err)
	}
	return f, nil
}

// checkFile makes sure f is a regular file of size bytes.
func checkFile(f *os.File, id uint64, size int64) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size {
		return fmt.Errorf("%s is not the body file of message %d (mode %o, %d bytes, want %d)", f.Name(), id, st.Mode, st.Size, size)
	}
	return nil
}

// readFile reads the body of message id from its file.
func (s *Store) readFile(id uint64, size int64) ([]byte, error) {
	f, err := os.OpenFile(s.bodyPath(id), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		if _, err := s.size(id); errors.Is(err, queuecore.ErrNotFound) {
			return nil, err // acked since the row was read
		}
		return nil, fmt.Errorf("its body file %s is missing", s.bodyPath(id))
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := checkFile(f, id, size); err != nil {
		return nil, err
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(f, body); err != nil {
		return nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	return body, nil
}

// openFiles creates bodies/ and reconciles it with the files table (see
// the top of this file). It runs in Open, on the writer's connection,
// before any other call.
func (s *Store) openFiles() error {
	if err := os.Mkdir(s.bodies, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create %s: %w", s.bodies, err)
	} else if err == nil {
		if err := backends.SyncDir(filepath.Dir(s.bodies)); err != nil {
			return err
		}
	}
	named := map[uint64]int64{} // ID → size; -1 once its file is found whole
	rows, err := s.w.conn.Query("SELECT id, size FROM files", nil)
	if err != nil {
		return fmt.Errorf("list body files: %w", err)
	}
	defer rows.Close()
	dest := make([]driver.Value, 2)
	err = eachRow(rows, dest, func() (bool, error) {
		var c scanner
		named[uint64(c.int(dest[0]))] = c.int(dest[1])
		return true, c.err
	})
	if err != nil {
		return fmt.Errorf("list body files: %w", err)
	}
	ents, err := os.ReadDir(s.bodies)
	if err != nil {
		return fmt.Errorf("read %s: %w", s.bodies, err)
	}
	// A file no row names may be an acked message's whose ack is in the
	// WAL but not on disk yet (the last run was killed within the lazy
	// sync's delay): the WAL is synced before any file is removed, or a
	// power cut could undo the ack after the file is gone.
	if err := syncWAL(s.path + "-wal"); err != nil {
		return fmt.Errorf("sync the WAL before removing body files: %w", err)
	}
	removed := 0
	for _, e := range ents {
		id, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil || strconv.FormatUint(id, 10) != e.Name() || !e.Type().IsRegular() {
			s.log.Warn("not a body file; left alone", queuecore.LogPath, filepath.Join(s.bodies, e.Name()))
			continue
		}
		if size, ok := named[id]; ok {
			if fi, err := e.Info(); err == nil && fi.Size() == size {
				named[id] = -1
				s.fileFloor.note(size)
			}
			continue
		}
		if err := removeOrphan(filepath.Join(s.bodies, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove orphan body file: %w", err)
		}
		removed++
	}
	if removed > 0 {
		s.log.Info("removed body files that no message names (left by a crash)", queuecore.LogPath, s.bodies, "files", removed)
	}
	var lost []uint64
	for id, size := range named {
		if size >= 0 {
			lost = append(lost, id)
		}
	}
	for _, id := range lost {
		// See the top of this file: an ack undone by a power cut after
		// its file was removed.
		if _, err := s.w.conn.Exec("DELETE FROM messages WHERE id = ?", []driver.Value{int64(id)}); err != nil {
			return fmt.Errorf("delete message %d whose body file is missing: %w", id, err)
		}
		s.log.Error("message deleted: its body file is missing or short (an ack that a power cut undid after the file was removed, a power cut in --sync normal, or a file changed by hand)", queuecore.LogPath, s.bodyPath(id), "id", id)
		if err := os.Remove(s.bodyPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove short body file: %w", err)
		}
	}
	return nil
}

// fileFloor is the least size of a body that a store holds or held in a
// file since it opened, or none. A delete looks for the body file of a
// message no smaller than it, and of one whose size it is not told; a
// store that never had a file looks for none.
type fileFloor struct{ least atomic.Int64 } // 0: no file yet

// note records a body of size bytes in a file (0 or less: of a size not
// known, so every delete looks).
func (f *fileFloor) note(size int64) {
	size = max(size, 1) // 0 means none
	for {
		cur := f.least.Load()
		if cur != 0 && cur <= size {
			return
		}
		if f.least.CompareAndSwap(cur, size) {
			return
		}
	}
}

// any reports whether the store holds or held a body file.
func (f *fileFloor) any() bool { return f.least.Load() != 0 }

// mayHold reports whether a body of size bytes (0: not known) may be in a
// file.
func (f *fileFloor) mayHold(size int64) bool {
	least := f.least.Load()
	return least != 0 && (size <= 0 || size >= least)
}

// syncWAL and removeOrphan are what openFiles does before and to an
// orphan; tests see their order through them.
var (
	syncWAL      = syncFile
	removeOrphan = os.Remove
)

// syncFile fdatasyncs a file if it exists.
func syncFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	err = unix.Fdatasync(int(f.Fd()))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
