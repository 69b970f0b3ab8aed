package format1

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

var _ queuecore.BodyFiler = (*Store)(nil)

// BodyFile opens the body file of message id read-only, for a reader that
// reads it in place (queuecore.BodyFiler). A body whose record is durable
// but whose file is not written yet (the moment between a commit's sync
// and its file operations) is written first, by this call: a reader
// served from memory could not map the message MAP_SHARED. It is nil
// only while the record is not durable yet, the disk is too full for the
// file, or the store has failed (then the body is read from memory).
// The file is checked to be the message's: its size, and its ID xattr
// where it has one. Body files are written to a new file (a spare, or a temp file)
// and renamed into place, never changed in place, so the bytes behind the
// descriptor stay the message's whatever happens to the name afterwards
// (a lease renames it, an ack unlinks it, a new message may take the name).
func (s *Store) BodyFile(ctx context.Context, id uint64) (*os.File, error) {
	at, pb, err := s.bodyEntry(id)
	if err != nil {
		return nil, err
	}
	if pb != nil {
		s.fileMu.RUnlock()
		s.writeDurable()
		if at, pb, err = s.bodyEntry(id); err != nil {
			return nil, err
		}
		if pb != nil {
			s.fileMu.RUnlock()
			return nil, nil
		}
	}
	f, err := os.OpenFile(at.path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	s.fileMu.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("body of message %d: %w", id, err)
	}
	if err := s.checkBodyFile(f, id, at.size); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// writeDurable does the file operations of the durable pending records,
// for a reader that wants a body file rather than wait for its commit to
// write it. It does nothing when none is due, or when the store is
// closed, failed or held back by a full disk (the reader is then served
// from memory: retrying the stalled write at every open would take the
// last free bytes from the commits that free space, and the file lock
// from every reader).
func (s *Store) writeDurable() {
	s.mu.Lock()
	if s.closed || s.failErr != nil || s.stalled || len(s.pending) == 0 || s.pending[0].end > s.synced.Load() {
		s.mu.Unlock()
		return
	}
	s.inflight.Add(1) // Close waits for it
	defer s.inflight.Done()
	s.mu.Unlock()
	s.runFileOps(s.synced.Load())
}

// checkBodyFile makes sure f is a regular file of size bytes carrying id.
func (s *Store) checkBodyFile(f *os.File, id uint64, size int64) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("body of message %d: %w", id, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size {
		return fmt.Errorf("body of message %d: %s is not its body file (mode %o, %d bytes, want %d)", id, f.Name(), st.Mode, st.Size, size)
	}
	if s.noXattr.Load() {
		return nil
	}
	var buf [24]byte
	n, err := unix.Fgetxattr(int(f.Fd()), idXattr, buf[:])
	if err == unix.ENODATA || err == unix.ENOTSUP || err == unix.EOPNOTSUPP {
		return nil // no ID to check (a file system without user xattrs); the path and size were right
	}
	if err != nil || n <= 0 {
		return fmt.Errorf("body of message %d: read the ID of %s: %v", id, f.Name(), err)
	}
	if got, perr := strconv.ParseUint(string(buf[:n]), 10, 64); perr != nil || got != id {
		return fmt.Errorf("body of message %d: %s is the body of message %s", id, f.Name(), buf[:n])
	}
	return nil
}
