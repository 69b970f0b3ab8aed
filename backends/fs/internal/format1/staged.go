package format1

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// Staged bodies: in SyncFull and SyncStrict, a body of defaultStageAt
// bytes or more was not written into the journal. Apply wrote it to
// DIR/staged/ID first (with its ID xattr) and fsynced it; every sync of a
// journal is preceded by an fsync of DIR/staged if a body was staged
// since the last one (syncStagedLocked, from syncRotationLocked), so no
// commit returns before its staged file's name is durable. The record
// holds the body's size and CRC-32C instead of its bytes, and its file
// operation (opPlace) links the file where its message is. So a big body
// reaches the disk once, synced by the commit that waits for it, instead
// of twice (in the journal, then in its file at the checkpoint).
//
// A sync of the journal makes durable every byte written to it so far,
// so a record can be durable while the name of its staged body is not: a
// record written after the fsync of DIR/staged that preceded the sync
// began. Neither its commit nor any later one (but leases and acks not
// waited for) has returned then, since each waits for a sync of DIR/staged
// that comes after its staged bodies and after this record. So at Open a
// replayed record whose staged body is not there ends the replay, as a
// torn tail does (stagedMissing), with the newer journal if any.
//
// The staged name plays the part the journal plays for a small body: it
// stays until a checkpoint's snapshot holds its record (that checkpoint
// placed the body and synced its directory before writing the snapshot),
// and is removed at its end (unlinkPlaced). So whatever the message did
// in between (a lease, an ack) and whichever directory the file system
// wrote back first, Open finds the body of every record it replays: where
// the message is, or in DIR/staged (reconciler.placeStaged). Staged bytes
// count towards the next checkpoint as journal bytes would, which bounds
// them to about the two journals' worth. An ack's unlink frees the space
// of a staged body only at that checkpoint.
//
// Open links a staged body whose record was replayed where its message is
// and, once the open's checkpoint has made that durable (and the snapshot
// holds every record), empties DIR/staged.
const (
	stagedDir      = "staged"
	defaultStageAt = 256 << 10
)

// stagedBody is what a record says of a staged body: its size and CRC-32C.
type stagedBody struct {
	n   int
	crc uint32
}

func (s *Store) stagedPath(id uint64) string {
	return s.dir + "/" + stagedDir + "/" + strconv.FormatUint(id, 10)
}

// placedBody is a staged body linked where its message is: its staged
// name, and the journal position of the end of its record.
type placedBody struct {
	path string
	end  int64
}

// unlinkPlaced removes, at the end of a checkpoint whose snapshot holds
// the records up to upTo, the staged names of the bodies those records
// placed: their directories were synced before the snapshot was written
// (the checkpoint placed them, and synced the tree, before it). A name
// left by a failure is removed at the next Open.
func (s *Store) unlinkPlaced(upTo int64) {
	s.fileMu.Lock()
	var names []string
	keep := s.placed[:0]
	for _, pb := range s.placed {
		if pb.end <= upTo {
			names = append(names, pb.path)
		} else {
			keep = append(keep, pb)
		}
	}
	clear(s.placed[len(keep):])
	s.placed = keep
	s.fileMu.Unlock()
	for _, p := range names {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("remove a staged body placed and checkpointed (Open removes it)", logPath, p, logErr, err)
		}
	}
}

// stagedMissing says which staged body of a replayed record is neither in
// DIR/staged (by its size) nor where the record put its message (by its
// ID xattr and size, or its CRC), if one is: the record was written
// after the last sync of DIR/staged began, so neither its commit nor any
// after it returned (syncStagedLocked), and the replay ends there.
func (s *Store) stagedMissing(rec *record) (uint64, bool) {
	for i, sb := range rec.staged {
		if sb == nil {
			continue
		}
		m := &rec.ops[i].Msg
		st, err := os.Lstat(s.stagedPath(m.ID))
		if err == nil && st.Mode().IsRegular() && st.Size() == int64(sb.n) {
			continue
		}
		// Its staged name may be gone by a hand while the body is where
		// the record put it: a commit cut short never placed its body.
		p := s.bodyPath(m.Queue, m.State, m.Name)
		if owner, ok := readOwner(p); ok {
			if st, err := os.Lstat(p); err == nil && owner == m.ID && st.Mode().IsRegular() && st.Size() == int64(sb.n) {
				continue
			}
		} else if fileMatches(p, *sb) {
			continue
		}
		return m.ID, true
	}
	return 0, false
}

// syncStagedLocked fsyncs DIR/staged if a body was staged since it last
// did: a commit must not return before the name of its staged file is
// durable. syncMu is held, and the caller loads the journal position it
// will report durable before calling: a record written before that had
// its bodies staged, and the flag set, before it was written.
func (s *Store) syncStagedLocked() error {
	if !s.stagedDirty.Swap(false) {
		return nil
	}
	if err := backends.SyncDir(filepath.Join(s.dir, stagedDir)); err != nil {
		s.stagedDirty.Store(true)
		return s.syncedOrFail(err, "sync the staged bodies' directory")
	}
	return nil
}

// cleanStaged empties DIR/staged at Open, once every staged body that a
// committed record names is in its place and that is durable (after the
// open's checkpoint), and makes sure the directory exists durably.
func (s *Store) cleanStaged() error {
	p := filepath.Join(s.dir, stagedDir)
	names, err := readNames(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, n := range names {
		if err := os.Remove(p + "/" + n); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove a staged body no record names: %w", err)
		}
	}
	if len(names) > 0 {
		s.log.Info("emptied the staged bodies' directory (bodies placed, or of commits that did not end)", logCount, len(names))
	}
	if _, err := os.Lstat(p); err == nil {
		if len(names) > 0 && s.opts.Sync != queuecore.SyncOff {
			if err := backends.SyncDir(p); err != nil {
				return err
			}
		}
	} else {
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create the staged bodies' directory: %w", err)
		}
		if s.opts.Sync != queuecore.SyncOff {
			if err := backends.SyncDir(s.dir); err != nil {
				return err
			}
		}
	}
	if s.cfg.stageAt > 0 && s.opts.Sync.Durable() && !canLink(p) {
		s.cfg.stageAt = 0
		s.log.Warn("the file system has no hard links: big bodies go through the journal (--fs-stage-bodies has no effect)", logPath, p)
	}
	return nil
}

// canLink says whether the file system of dir makes hard links (vfat and
// exfat do not): a staged body is linked where its message is.
func canLink(dir string) bool {
	a, b := dir+"/"+tempPrefix+"probe", dir+"/"+tempPrefix+"probe-link"
	_ = os.Remove(a)
	_ = os.Remove(b)
	if err := os.WriteFile(a, nil, 0o600); err != nil {
		return false
	}
	ok := os.Link(a, b) == nil
	_ = os.Remove(b)
	_ = os.Remove(a)
	return ok
}

// placeStaged links the staged body of e, which a replayed record names,
// at p, if DIR/staged holds it whole (its size and CRC-32C as the record
// says). ok is false if it does not.
func (r *reconciler) placeStaged(e *entry, p string, sb stagedBody) (ok bool, err error) {
	s := r.s
	from := s.stagedPath(e.ID)
	if !fileMatches(from, sb) {
		return false, nil
	}
	// Linked, not moved: the staged name stays until the open's
	// checkpoint has synced p's directory (cleanStaged).
	s.dirty.dir(filepath.Dir(p))
	if err := linkMkdir(from, p); err != nil {
		return false, err
	}
	r.moved++
	r.logf(r.moved, "linked a staged body where its message is", logID, e.ID, logFrom, from, logTo, p)
	return true, nil
}

// fileMatches says whether the file at p holds sb.n bytes of CRC-32C sb.crc.
func fileMatches(p string, sb stagedBody) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	h := crc32.New(crcTable)
	n, err := io.Copy(h, f)
	return err == nil && n == int64(sb.n) && h.Sum32() == sb.crc
}
