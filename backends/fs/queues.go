package fs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// PutQueue creates a queue or replaces its policy and permissions. A new
// queue's directory is made whole under a temp name and renamed into
// place; a policy is replaced by renaming a new policy.json over the old.
// Either way one rename(2) is the change.
func (s *Store) PutQueue(ctx context.Context, q queuecore.QueueInfo) error {
	if err := queuecore.CheckQueueName(q.Name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	q.Policy = bytes.Clone(q.Policy) // the store keeps its own copy
	s.mu.RLock()
	err := s.writableLocked()
	exists := s.ix.queues[q.Name] != nil
	if err == nil {
		s.inflight.Add(1)
	}
	s.mu.RUnlock()
	if err != nil {
		return err
	}
	defer s.inflight.Done()
	if exists {
		if err := s.writeQueueFile(q); err != nil {
			return fmt.Errorf("put queue %s: %w", q.Name, err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if ix := s.ix.queues[q.Name]; ix != nil {
			ix.info = q
			return nil
		}
		return fmt.Errorf("put queue %s: deleted meanwhile: %w", q.Name, queuecore.ErrNotFound)
	}
	tmp := filepath.Join(s.qdir, tempPrefix+q.Name+"."+strconv.FormatUint(s.tempGen.Add(1), 10))
	if err := s.makeQueueDir(tmp, q); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("create queue %s: %w", q.Name, err)
	}
	s.mu.Lock()
	if s.ix.queues[q.Name] != nil {
		s.mu.Unlock()
		os.RemoveAll(tmp)
		return s.PutQueue(ctx, q) // made meanwhile: replace its policy
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, filepath.Join(s.qdir, q.Name), unix.RENAME_NOREPLACE); err != nil {
		s.mu.Unlock()
		os.RemoveAll(tmp)
		return fmt.Errorf("create queue %s: %w", q.Name, err)
	}
	s.ix.queues[q.Name] = newQueue(q)
	s.mu.Unlock()
	if s.durable {
		return s.fsyncPath(s.qdir)
	}
	return nil
}

// makeQueueDir makes a queue's directory at dir: its policy.json and its
// state directories, durable in SyncFull and SyncStrict.
func (s *Store) makeQueueDir(dir string, q queuecore.QueueInfo) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	for _, st := range queuecore.States {
		if err := os.Mkdir(filepath.Join(dir, st.Dir()), 0o700); err != nil {
			return err
		}
	}
	if err := s.writeBody(filepath.Join(dir, policyName), q.Policy, queueFields(q)); err != nil {
		return err
	}
	if s.durable {
		return s.fsyncPath(dir)
	}
	return nil
}

// DeleteQueue removes a queue and all its messages: its directory is
// renamed into DIR/trash (one rename: the change) and emptied in the
// background.
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
	dst := filepath.Join(s.dir, trashDir, name+"."+strconv.FormatUint(s.batchGen.Add(1), 10))
	src := filepath.Join(s.qdir, name)
	if err := os.Rename(src, dst); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("delete queue %q: %w", name, err)
	}
	s.ix.deleteQueue(q)
	s.forgetGoneLocked(src + "/")
	s.inflight.Add(1)
	s.mu.Unlock()
	defer s.inflight.Done()
	var err error
	if s.durable {
		// The queue's old name first: a power cut between the two syncs
		// leaves the queue gone, not under two names.
		if err = s.fsyncPath(s.qdir); err == nil {
			err = s.fsyncPath(filepath.Join(s.dir, trashDir))
		}
	}
	s.trashWG.Add(1)
	go func() {
		defer s.trashWG.Done()
		if err := os.RemoveAll(dst); err != nil {
			s.log.Warn("cannot empty the trash", queuecore.LogPath, dst, queuecore.LogErr, err)
		}
	}()
	return err
}

// forgetGoneLocked drops what the store remembers of messages no longer in
// the index (a deleted queue's): old names are removed now, except those
// under gonePrefix, which went with the queue's directory.
func (s *Store) forgetGoneLocked(gonePrefix string) {
	for p, st := range s.stale {
		if s.ix.byID[st.id] != nil {
			continue
		}
		if !strings.HasPrefix(p, gonePrefix) {
			unix.Unlink(p)
		}
		s.dropStaleLocked(p)
	}
	for id := range s.txns {
		if s.ix.byID[id] == nil {
			delete(s.txns, id)
		}
	}
	for id := range s.rewrite {
		if s.ix.byID[id] == nil {
			delete(s.rewrite, id)
		}
	}
}
