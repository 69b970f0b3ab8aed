package format1

import (
	"errors"
	"fmt"
	"syscall"
)

// A full disk is not a failure of this store (queuecore/space.go). What a
// lack of space stops is put off, never dropped: body files wait in the
// journal (runFileOps) and a checkpoint waits with its rotated journal
// (finishCheckpoint); Export then fails, and the next start tries again.

// errStalled is a checkpoint stopped by file operations waiting for space.
var errStalled = fmt.Errorf("body files wait for space: %w", syscall.ENOSPC)

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// stalledBefore reports errStalled when file operations of records up to
// pos wait for space.
func (s *Store) stalledBefore(pos int64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.pending) > 0 && s.pending[0].end <= pos && s.stalled {
		return errStalled
	}
	return nil
}
