package format1

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"yirangmq/queuecore"
)

// A full disk is not a failure of this store (queuecore/space.go). A
// commit whose journal record does not fit fails alone and changes
// nothing. Once a record is in the journal, what a lack of space stops is
// put off, never dropped: body files wait in the journal (runFileOps), a
// checkpoint waits with its rotated journal (finishCheckpoint), and
// Reclaim tries them again. When the disk is low, Reclaim also compacts
// the journal, which holds a copy of every body published since the last
// checkpoint: on a small disk that is most of the space the drain frees.

var _ queuecore.SpaceReclaimer = (*Store)(nil)

// reclaimMin is the journal size from which a low disk is worth a
// checkpoint.
const reclaimMin = 64 << 10

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

// Reclaim retries what a full disk put off (body files, a held
// checkpoint) and, when urgent (the disk is low), compacts the journal
// with a checkpoint.
func (s *Store) Reclaim(ctx context.Context, urgent bool) error {
	s.mu.Lock()
	if s.closed || s.failErr != nil {
		s.mu.Unlock()
		return nil
	}
	stalled, held := s.stalled, s.held
	start := !s.ckptRunning && urgent && s.sinceCkpt >= reclaimMin
	if start {
		s.ckptRunning = true
	}
	if held != nil || start {
		s.bg.Add(1) // Close waits for it
	}
	s.mu.Unlock()

	if stalled {
		s.runFileOps(s.written.Load())
	}
	var err error
	switch {
	case held != nil:
		err = s.finishCheckpoint(held.start, held.old, held.img)
		s.bg.Done()
	case start:
		err = s.checkpoint()
		s.bg.Done()
	}
	if err == nil {
		err = s.failure()
	}
	return err
}
