package format1

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// checkpoint makes the snapshot hold everything committed so far and drops
// the journal it replaces. A failure fails the store: the journals are
// left for the next Open. A lack of space is no failure: a checkpoint that
// rotated is held, and Close tries to finish it.
func (s *Store) checkpoint() error {
	start := time.Now()
	old, img, err := s.rotate()
	if err == nil {
		return s.finishCheckpoint(start, old, img)
	}
	s.mu.Lock()
	s.ckptRunning = false
	s.mu.Unlock()
	return err
}

// rotate starts a checkpoint: see rotateLocked. On a full disk that left
// the journal where it was, it reports the error without failing the
// store.
func (s *Store) rotate() (*journal, *snapshotImage, error) {
	sync := s.opts.Sync != queuecore.SyncOff
	s.mu.Lock()
	defer s.mu.Unlock()
	old, img, err := s.rotateLocked(filepath.Join(s.dir, journalName), filepath.Join(s.dir, oldJournalName), sync)
	if err != nil {
		err = fmt.Errorf("checkpoint: %w", err)
		if _, serr := os.Lstat(filepath.Join(s.dir, oldJournalName)); isNoSpace(err) && errors.Is(serr, os.ErrNotExist) {
			s.log.Warn("disk full: checkpoint put off", logErr, err)
		} else {
			s.failLocked(err)
		}
	}
	return old, img, err
}

// finishCheckpoint writes the snapshot of a rotated journal and removes it.
// A failure for lack of space holds the checkpoint for Close; any other
// fails the store.
func (s *Store) finishCheckpoint(start time.Time, old *journal, img *snapshotImage) error {
	n, size, err := s.doCheckpoint(old, img)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil && isNoSpace(err) && s.failErr == nil {
		if s.held == nil {
			s.log.Warn("disk full: checkpoint held until there is room", logErr, err)
		}
		s.held = &heldCheckpoint{start: start, old: old, img: img}
		return fmt.Errorf("checkpoint: %w", err)
	}
	s.held = nil
	s.ckptRunning = false
	img.release()
	s.ix.trimAll() // the image's views may have put trims off
	if err != nil {
		err = fmt.Errorf("checkpoint: %w", err)
		s.failLocked(err)
		return err
	}
	s.ckptAt = s.checkpointAt(size)
	s.log.Debug("checkpoint", logCount, n, logBytes, size, logTook, time.Since(start))
	return nil
}

// heldCheckpoint is a checkpoint that rotated the journal but could not
// write its snapshot for lack of space.
type heldCheckpoint struct {
	start time.Time
	old   *journal
	img   *snapshotImage
}

func (s *Store) doCheckpoint(old *journal, img *snapshotImage) (count int, size int64, err error) {
	sync := s.opts.Sync != queuecore.SyncOff
	oldPath := filepath.Join(s.dir, oldJournalName)

	// The rotation left the old journal's tail and the directory to the
	// next sync (rotateLocked), which may not have come (no commit since,
	// or the old journal was synced to its end already): the file
	// operations of its records wait for them, and the old journal may
	// not be closed before.
	if s.opts.Sync.Durable() {
		if err := s.syncRotation(); err != nil {
			return 0, 0, err
		}
	}
	// Every body the old journal holds must be in its file, and durable,
	// before the snapshot replaces that journal.
	s.runFileOps(old.end())
	if err := s.failure(); err != nil {
		return 0, 0, err
	}
	if err := s.stalledBefore(old.end()); err != nil {
		return 0, 0, err
	}
	if sync {
		if err := s.syncTree(old); err != nil {
			return 0, 0, err
		}
	}
	size, err = writeSnapshot(s.dir, img, sync)
	if err != nil {
		return 0, 0, fmt.Errorf("write snapshot: %w", err)
	}
	// The group-commit leader may still be syncing the old journal.
	s.syncMu.Lock()
	cerr := old.f.Close()
	s.syncMu.Unlock()
	if cerr != nil {
		s.log.Warn("close old journal", logErr, cerr)
	}
	if err := os.Remove(oldPath); err != nil {
		return 0, 0, fmt.Errorf("remove old journal: %w", err)
	}
	if sync {
		if err := backends.SyncDir(s.dir); err != nil {
			return 0, 0, err
		}
	}
	s.unlinkPlaced(old.end())
	return img.count, size, nil
}

// rotateLocked renames the journal to journal.old and starts a fresh one.
//
// It holds mu, which every commit needs, so it makes no sync: in SyncFull
// and SyncStrict the old journal's tail and the directory (the two names)
// are synced by the next Store.waitDurable, before it reports any record
// after the last one synced durable, and before the checkpoint reads the
// old journal's file operations (doCheckpoint). Syncing them here stalled
// every commit of every queue for two flushes at each checkpoint (about
// 20 ms on a busy disk). A power cut before that sync leaves journal and
// journal.old as a crash in a checkpoint does, which Open replays; the
// records it can lose were not reported durable. In SyncNormal the
// directory is synced here, as before.
func (s *Store) rotateLocked(curPath, oldPath string, sync bool) (*journal, *snapshotImage, error) {
	old := s.cur.Load()
	durable := s.opts.Sync.Durable()
	if _, err := os.Lstat(oldPath); err == nil {
		return nil, nil, fmt.Errorf("%s exists: an earlier checkpoint did not finish", oldPath)
	}
	if err := os.Rename(curPath, oldPath); err != nil {
		return nil, nil, fmt.Errorf("rotate journal: %w", err)
	}
	f, err := os.OpenFile(curPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		// Commits go on in the old file: under its name again if it can
		// (a full disk), else from journal.old, which the next Open replays.
		if rerr := os.Rename(oldPath, curPath); rerr != nil {
			err = fmt.Errorf("%w (and %w)", err, rerr)
		}
		return nil, nil, fmt.Errorf("create journal: %w", err)
	}
	next := &journal{f: f, base: old.end()}
	if durable {
		next.prev = old // synced with the directory by waitDurable
	} else if sync {
		if err := backends.SyncDir(s.dir); err != nil {
			f.Close()
			return nil, nil, err
		}
	}
	s.cur.Store(next)
	s.sinceCkpt = 0
	return old, s.imageLocked(), nil
}

// checkpointAtOpen writes the snapshot of a store just recovered and
// empties its journals. Nothing runs concurrently yet.
func (s *Store) checkpointAtOpen() error {
	sync := s.opts.Sync != queuecore.SyncOff
	if sync {
		// Bodies the repair wrote are not synced on their own.
		if err := s.syncTree(nil); err != nil {
			return err
		}
	}
	s.mu.Lock()
	img := s.imageLocked()
	s.mu.Unlock()
	size, err := writeSnapshot(s.dir, img, sync)
	img.release()
	if err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	s.ckptAt = s.checkpointAt(size)
	if err := os.Remove(filepath.Join(s.dir, oldJournalName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove old journal: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(s.dir, journalName), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("empty journal: %w", err)
	}
	s.cur.Store(&journal{f: f})
	if sync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("fsync journal: %w", err)
		}
		if err := backends.SyncDir(s.dir); err != nil {
			return err
		}
	}
	return nil
}

// syncTree makes every body file and directory changed since the last
// checkpoint durable. syncfs(2) first, best effort: on a local file system
// it flushes them all in one call, so the exact pass below, which runs
// with file operations stopped (a rename between two directories must not
// be half synced), mostly meets clean files. Under FUSE syncfs does not
// reach the file system, and the exact pass does the work.
//
// In SyncNormal the file operations run as soon as their record is
// written, not synced: a delete's unlink made durable here while its
// record is lost at a power cut leaves a message without a body (the
// power-cut test's SyncNormal case with frequent checkpoints). So there
// the journals (old, the one being checkpointed, if any, and the current
// one, which holds every record whose file operation ran: they run under
// fileMu, held here) are synced first. In SyncFull and SyncStrict a file
// operation runs only after its record is durable.
func (s *Store) syncTree(old *journal) error {
	syncfsOK := false
	if fd, err := unix.Open(s.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		syncfsOK = unix.Syncfs(fd) == nil && !s.underFUSE()
		unix.Close(fd)
	}
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	if !s.opts.Sync.Durable() {
		for _, j := range []*journal{old, s.cur.Load()} {
			if j == nil {
				continue
			}
			if err := s.fdatasync(j.f); err != nil {
				return fmt.Errorf("fdatasync journal before the body files: %w", err)
			}
		}
	}
	return s.dirty.sync(syncfsOK)
}

// underFUSE says whether the store lives on a FUSE file system, where
// syncfs(2) does not reach the files.
func (s *Store) underFUSE() bool {
	var st unix.Statfs_t
	return unix.Statfs(s.dir, &st) != nil || st.Type == unix.FUSE_SUPER_MAGIC
}

// maxCheckpointBytes caps the journal size that triggers a checkpoint,
// however large the snapshot: replaying a journal at Open keeps a few
// dozen bytes per record in memory (the bodies it holds, the paths it
// touched), so the cap bounds the memory of a recovery. With a large
// backlog it costs snapshot writes: a snapshot of a million messages (about
// 300 MiB) is written for every 32 MiB of journal.
const maxCheckpointBytes = 32 << 20

// checkpointAt is the journal size that triggers the next checkpoint after
// a snapshot of size bytes.
func (s *Store) checkpointAt(size int64) int64 {
	return max(s.cfg.checkpointBytes, min(size, maxCheckpointBytes))
}
