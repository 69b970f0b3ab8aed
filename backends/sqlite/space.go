package sqlite

import (
	"context"
	"fmt"

	"yirangmq/queuecore"
)

// On a low disk (queuecore/space.go) the WAL is what grows: every lease
// and ack appends pages to it, and an automatic checkpoint copies them
// back but leaves the file at its size. Reclaim checkpoints and truncates
// it, so that draining a backlog does not need more space than the
// database already holds. Deleted rows leave free pages inside the
// database file, which new commits reuse before the filesystem's: they
// count as free (ReusableBytes).
var (
	_ queuecore.SpaceReclaimer = (*Store)(nil)
	_ queuecore.SpaceReuser    = (*Store)(nil)
)

// Reclaim, when urgent, checkpoints the WAL into the database file and
// truncates it. It waits for the commit in flight, if any, and holds the
// next ones for the checkpoint's length. SQLite puts nothing off: a
// commit that does not fit is rolled back whole.
func (s *Store) Reclaim(ctx context.Context, urgent bool) error {
	if !urgent {
		return nil
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return errClosed
	}
	w := s.takeWriter()
	defer s.giveWriter()
	if _, err := w.conn.Exec("PRAGMA wal_checkpoint(TRUNCATE)", nil); err != nil {
		return fmt.Errorf("checkpoint the WAL of %s: %w", s.path, withErrno(err))
	}
	return nil
}

// ReusableBytes is the size of the database file's free pages.
func (s *Store) ReusableBytes(ctx context.Context) int64 {
	var n int64
	_ = s.read(func(*reader) error {
		free, err := s.pragma("PRAGMA freelist_count")
		if err != nil {
			return err
		}
		size, err := s.pragma("PRAGMA page_size")
		n = free * size
		return err
	})
	return n
}
