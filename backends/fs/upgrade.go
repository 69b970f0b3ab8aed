package fs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"yirangmq/backends/fs/internal/format1"
	"yirangmq/queuecore"
)

// upgrade converts a store of format 1 (metadata in a snapshot and a
// journal) to format 2: format1.Export opens it as the build that wrote
// it would, recovering it after a crash, and leaves every body file where
// its message is; then each file gets its attributes, each queue its
// policy.json, and DIR/format is written, which is the moment the store
// is of format 2. A crash before that leaves a store of format 1 that the
// next start converts again; after it, the files of format 1 are removed.
func (s *Store) upgrade(ctx context.Context) error {
	start := time.Now()
	s.log.Info("converting the fs store from format 1 (a journal) to format 2 (the tree and its attributes)")
	qs, msgs, maxID, err := format1.Export(ctx, s.dir, s.log)
	if err != nil {
		return err
	}
	for _, q := range qs {
		if err := os.MkdirAll(filepath.Join(s.qdir, q.Name), 0o700); err != nil {
			return err
		}
		if err := s.writeQueueFile(q); err != nil {
			return fmt.Errorf("convert queue %s: %w", q.Name, err)
		}
	}
	for i := range msgs {
		m := &msgs[i]
		p := s.bodyPath(m.Queue, m.State, m.Name)
		if err := writeAllFields(p, fields(m)); err != nil {
			return fmt.Errorf("convert message %d: %w", m.ID, err)
		}
		maxID = max(maxID, m.ID, m.Seq)
	}
	if err := s.writeIDsLocked(maxID + idsChunk); err != nil {
		return err
	}
	if s.durable {
		// Every attribute written above, in one call: the store's file
		// system is a real one here (format 1 has no other).
		if err := syncfs(s.dir); err != nil {
			return err
		}
	}
	if err := s.writeFormat(); err != nil {
		return err
	}
	for _, n := range []string{"journal", "journal.old", "spill", "spare", "staged"} {
		if err := os.RemoveAll(filepath.Join(s.dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("cannot remove a file of format 1", queuecore.LogPath, filepath.Join(s.dir, n), queuecore.LogErr, err)
		}
	}
	s.log.Info("converted the fs store to format 2", "queues", len(qs), "messages", len(msgs), queuecore.LogTook, time.Since(start).Round(time.Millisecond))
	return nil
}
