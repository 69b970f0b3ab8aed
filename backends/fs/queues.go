package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"yirangmq/backends/fs/internal/memindex"
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
	exists := s.ix.Queues[q.Name] != nil
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
		if ix := s.ix.Queues[q.Name]; ix != nil {
			ix.Info = q
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
	if s.ix.Queues[q.Name] != nil {
		s.mu.Unlock()
		os.RemoveAll(tmp)
		return s.PutQueue(ctx, q) // made meanwhile: replace its policy
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, filepath.Join(s.qdir, q.Name), unix.RENAME_NOREPLACE); err != nil {
		s.mu.Unlock()
		os.RemoveAll(tmp)
		return fmt.Errorf("create queue %s: %w", q.Name, err)
	}
	s.ix.Queues[q.Name] = memindex.NewQueue[queueExt](q)
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
	q := s.ix.Queues[name]
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
		if s.ix.ByID[st.id] != nil {
			continue
		}
		if !strings.HasPrefix(p, gonePrefix) {
			unix.Unlink(p)
		}
		s.dropStaleLocked(p)
	}
	for id := range s.txns {
		if s.ix.ByID[id] == nil {
			delete(s.txns, id)
		}
	}
	for id := range s.rewrite {
		if s.ix.ByID[id] == nil {
			delete(s.rewrite, id)
		}
	}
}

// readQueue reads a queue's info from its policy.json and that file's
// attributes. A queue directory made by hand has none: its policy is the
// default, its owner and mode the directory's; policy.json is written
// then, so that the tree says what the daemon took.
func (s *Store) readQueue(name string, dirInfo fs.FileInfo) (queuecore.QueueInfo, error) {
	p := filepath.Join(s.qdir, name, policyName)
	info := queuecore.QueueInfo{Name: name, Mode: uint32(dirInfo.Mode().Perm()), CreatedAt: dirInfo.ModTime()}
	if st, ok := dirInfo.Sys().(*syscall.Stat_t); ok {
		info.UID, info.GID = st.Uid, st.Gid
	}
	data, err := readRegular(p)
	if errors.Is(err, fs.ErrNotExist) {
		def := queuecore.DefaultPolicy()
		info.Policy = def.StoredJSON()
		if err := s.writeQueueFile(info); err != nil {
			return info, err
		}
		s.log.Info("queue directory without policy.json: taken as a queue with the default policy", queuecore.LogQueue, name)
		return info, nil
	}
	if err != nil {
		return info, fmt.Errorf("queue %s: %w", name, err)
	}
	info.Policy = data
	attrs, err := readAttrs(p)
	if err != nil {
		return info, fmt.Errorf("queue %s: %w", name, err)
	}
	num := func(k string, base int) (uint32, bool) {
		v, ok := attrs[k]
		if !ok {
			return 0, false
		}
		n, err := strconv.ParseUint(string(v), base, 32)
		if err != nil {
			s.log.Warn("ignored an attribute that cannot be read", queuecore.LogPath, p, queuecore.LogReason, fmt.Sprintf("%s=%q: %v", k, v, err))
			return 0, false
		}
		return uint32(n), true
	}
	if v, ok := num(keyUID, 10); ok {
		info.UID = v
	}
	if v, ok := num(keyGID, 10); ok {
		info.GID = v
	}
	if v, ok := num(keyMode, 8); ok {
		info.Mode = v & 0o7777
	}
	if v, ok := attrs[keyCreatedAt]; ok {
		if t, err := parseTime(string(v)); err == nil {
			info.CreatedAt = t
		}
	}
	return info, nil
}

// readRegular reads a regular file, refusing a symlink.
func readRegular(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	var b bytes.Buffer
	_, err = b.ReadFrom(f)
	return b.Bytes(), err
}

// queueFields are the attributes of a queue's policy.json.
func queueFields(info queuecore.QueueInfo) []field {
	return []field{
		{keyUID, strconv.FormatUint(uint64(info.UID), 10)},
		{keyGID, strconv.FormatUint(uint64(info.GID), 10)},
		{keyMode, fmt.Sprintf("%04o", info.Mode&0o7777)},
		{keyCreatedAt, timeText(info.CreatedAt)},
	}
}

// writeQueueFile replaces a queue's policy.json (its policy and, in its
// attributes, owner, mode and creation time) in one rename.
func (s *Store) writeQueueFile(info queuecore.QueueInfo) error {
	return s.writeFileDurably(filepath.Join(s.qdir, info.Name, policyName), info.Policy, queueFields(info))
}
