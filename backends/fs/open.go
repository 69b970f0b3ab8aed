package fs

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// formatVersion is the format of the store this build writes: 2, the tree
// with its attributes. Format 1 (metadata in a snapshot and a journal) is
// converted at Open (upgrade.go). A store of a later format is refused.
const formatVersion = 2

// formatText is DIR/format's content.
var formatText = fmt.Sprintf("yirangmq fs store, format %d\n", formatVersion)

// tripwire is what DIR/snapshot holds in format 2: a snapshot header of a
// version that builds of format 1, which read DIR/snapshot first, refuse
// ("bad snapshot: version 2, this program reads version 1") instead of
// taking a tree without a journal for an empty store.
const tripwire = `{"snapshot":2,"lsn":0,"max_id":0,"queues":0,"messages":0}` + "\n"

// load reads the store: its format (converting format 1), the intents of
// batches a crash cut short, then the tree, which is the truth.
func (s *Store) load(ctx context.Context) error {
	start := time.Now()
	if err := checkXattrs(s.dir); err != nil {
		return err
	}
	v, err := readFormat(s.dir)
	if err != nil {
		return err
	}
	if v == 1 {
		if err := s.upgrade(ctx); err != nil {
			return err
		}
	}
	for _, d := range []string{queuesDir, intentsDir, trashDir} {
		if err := os.Mkdir(filepath.Join(s.dir, d), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	if v == 0 {
		if err := s.writeFormat(); err != nil {
			return err
		}
	}
	s.emptyTrash()
	if err := s.readIDs(); err != nil {
		return err
	}
	// The tree first, with every change a txn attribute describes
	// finished; then the batches an intent describes, on that tree; then,
	// if there were any, the tree again, to finish what they did.
	sc, err := s.readTree()
	if err != nil {
		return err
	}
	intents, err := s.finishIntents(sc)
	if err != nil {
		return err
	}
	if len(intents) > 0 {
		s.ix = newIndex()
		if sc, err = s.readTree(); err != nil {
			return err
		}
	}
	// The temp files the intents did not rename are leftovers.
	for _, p := range sc.temps {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	sc.resolveIDs()
	sc.resolveNames()
	sc.index()
	if err := sc.readManifest(); err != nil {
		return err
	}
	sc.report(time.Since(start))
	// What Open repaired is made durable before anything else happens,
	// and only then are the intents it finished removed.
	if err := s.flushAll(); err != nil {
		return err
	}
	for _, p := range intents {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	if len(intents) > 0 && s.durable {
		return s.fsyncPath(filepath.Join(s.dir, intentsDir))
	}
	return nil
}

// checkXattrs makes sure the store's file system keeps user extended
// attributes: they hold every message's metadata.
func checkXattrs(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	p := filepath.Join(dir, tempPrefix+"xattr-probe")
	os.Remove(p)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(p)
	defer f.Close()
	err = unix.Fsetxattr(int(f.Fd()), xattrPrefix+"probe", []byte("1"), 0)
	if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("the fs store keeps each message's metadata in user extended attributes, which the file system of %s does not support (use ext4, xfs, btrfs, f2fs or tmpfs, or the sqlite store)", dir)
	}
	return err
}

// readFormat says which format the store in dir is: 2 (DIR/format), 1
// (a snapshot or journal and no DIR/format), or 0 for a new store.
func readFormat(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, formatName))
	if err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		i := strings.LastIndexByte(line, ' ')
		v, perr := strconv.Atoi(line[i+1:])
		if !strings.HasPrefix(line, "yirangmq fs store, format ") || perr != nil {
			return 0, fmt.Errorf("%s/%s: %q is not a format this build knows", dir, formatName, line)
		}
		if v > formatVersion {
			return 0, fmt.Errorf("the store is of format %d, newer than this build reads (%d): use the build that wrote it, or a newer one", v, formatVersion)
		}
		if v != formatVersion {
			return 0, fmt.Errorf("%s/%s: format %d is not one this build knows", dir, formatName, v)
		}
		return v, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	for _, n := range []string{snapshotName, "journal", "journal.old"} {
		if _, err := os.Lstat(filepath.Join(dir, n)); err == nil {
			return 1, nil
		}
	}
	return 0, nil
}

// writeFormat marks the store as format 2 (DIR/format) and makes builds
// of format 1 refuse it (DIR/snapshot).
func (s *Store) writeFormat() error {
	if err := s.writeFileDurably(filepath.Join(s.dir, formatName), []byte(formatText), nil); err != nil {
		return fmt.Errorf("write the format: %w", err)
	}
	if err := s.writeFileDurably(filepath.Join(s.dir, snapshotName), []byte(tripwire), nil); err != nil {
		return fmt.Errorf("write the format: %w", err)
	}
	return nil
}

// emptyTrash removes, in the background, the trees of deleted queues.
func (s *Store) emptyTrash() {
	d := filepath.Join(s.dir, trashDir)
	names, err := readNames(d)
	if err != nil || len(names) == 0 {
		return
	}
	s.trashWG.Add(1)
	go func() {
		defer s.trashWG.Done()
		for _, n := range names {
			if err := os.RemoveAll(filepath.Join(d, n)); err != nil {
				s.log.Warn("cannot empty the trash", queuecore.LogPath, filepath.Join(d, n), queuecore.LogErr, err)
			}
		}
	}()
}

// readNames lists a directory, sorted; a missing one is empty.
func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	slices.Sort(names)
	return names, err
}

// finishIntents finishes the batches of several messages that a crash
// cut short (see the package comment), on a tree whose txns are finished:
// each op is done where the tree still shows it undone, never against a
// change a person made since. (No change made after a batch is durable
// while its intent is: commit waits for that.)
// An update becomes a txn attribute on the message's file, which the scan
// then finishes like any other. An intent cut short itself was written
// before its batch touched anything. It returns the intent files, which
// the caller removes once what they did is durable.
func (s *Store) finishIntents(sc *scan) ([]string, error) {
	d := filepath.Join(s.dir, intentsDir)
	names, err := readNames(d)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(names, func(a, b string) int {
		na, _ := strconv.ParseUint(a, 10, 64)
		nb, _ := strconv.ParseUint(b, 10, 64)
		return cmp.Compare(na, nb)
	})
	var paths []string
	for _, n := range names {
		p := filepath.Join(d, n)
		paths = append(paths, p)
		if strings.HasPrefix(n, tempPrefix) {
			continue // a batch whose intent was not written: it had not begun
		}
		data, err := os.ReadFile(filepath.Join(p, intentName))
		var in intent
		if err != nil || json.Unmarshal(data, &in) != nil || !in.End {
			s.log.Info("dropped an intent cut short (its batch had not begun)", queuecore.LogPath, p)
			continue
		}
		s.log.Debug("finishing a batch", queuecore.LogPath, p, "intent", string(data))
		byID := sc.byID()
		for _, op := range in.Ops {
			s.finishIntentOp(p, op, byID[op.ID])
		}
		s.log.Info("finished a batch a crash had cut short", queuecore.LogPath, p, queuecore.LogCount, len(in.Ops))
		for cur := s.batchGen.Load(); in.Batch > cur && !s.batchGen.CompareAndSwap(cur, in.Batch); cur = s.batchGen.Load() {
		}
	}
	return paths, nil
}

// finishIntentOp does one op of the intent in the batch directory dir; f
// is the file of the op's message found in the tree (nil: none). The
// message may be elsewhere than the op's From: a lease or an ack before
// the batch, which did not wait for its sync, may be undone by a power
// cut. It is taken from where it is, if its attributes say it is there:
// otherwise a person moved it since, and that stands.
func (s *Store) finishIntentOp(dir string, op intentOp, f *file) {
	abs := func(r string) string { return filepath.Join(s.qdir, filepath.FromSlash(r)) }
	switch op.Op {
	case "insert":
		if _, _, _, ok := splitRel(op.To); !ok {
			return
		}
		tmp := filepath.Join(dir, strconv.FormatUint(op.ID, 10))
		var tst, fst unix.Stat_t
		if unix.Lstat(tmp, &tst) != nil {
			return // renamed into place before the crash (or removed by hand)
		}
		to := abs(op.To)
		switch err := unix.Lstat(to, &fst); {
		case err == nil && fst.Ino == tst.Ino:
			return // renamed, but its batch directory was not synced since
		case err == nil:
			s.toLostFound(tmp, op.To, "a batch cut short by a crash put a message here, but another file has its name")
		default:
			if err := renameTo(tmp, to, false); err == nil {
				s.fl.note(func(fd *dirt) { fd.dirs[filepath.Dir(to)] = struct{}{} })
			}
		}
	case "delete":
		if f == nil || !f.where() && f.rel != op.From {
			return
		}
		p := f.abs(s)
		if err := os.Remove(p); err == nil {
			s.fl.note(func(fd *dirt) { fd.dirs[filepath.Dir(p)] = struct{}{} })
		}
	case "update":
		if f == nil || !f.where() && f.rel != op.From && f.rel != op.To {
			return
		}
		fs := make([]field, 0, len(op.Fields))
		for _, k := range fieldKeys {
			if v, ok := op.Fields[k]; ok {
				fs = append(fs, field{k, v})
			}
		}
		t := encodeTxn(txn{from: f.rel, to: op.To, fields: fs})
		if err := unix.Lsetxattr(f.abs(s), xattrPrefix+keyTxn, t, 0); err != nil {
			s.log.Warn("cannot finish a batch's change of a message", queuecore.LogPath, f.abs(s), queuecore.LogErr, err)
		}
	}
}

// getAttr reads one of the store's attributes of the file at p.
func getAttr(p, key string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, xattrPrefix+key, buf)
		if errors.Is(err, unix.ERANGE) {
			sz, err := unix.Lgetxattr(p, xattrPrefix+key, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, sz+64)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// readAttrs reads every attribute of the store on the file at p, by key
// without the prefix.
func readAttrs(p string) (map[string][]byte, error) {
	buf := make([]byte, 1024)
	var n int
	for {
		var err error
		n, err = unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ERANGE) {
			sz, err := unix.Llistxattr(p, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, sz+256)
			continue
		}
		if err != nil {
			return nil, err
		}
		break
	}
	out := map[string][]byte{}
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		k, ok := strings.CutPrefix(string(name), xattrPrefix)
		if !ok || k == "" {
			continue
		}
		v, err := getAttr(p, k)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// toLostFound moves what cannot be a message out of the tree, to
// DIR/lost+found/REL (REL made unique), and says why.
func (s *Store) toLostFound(p, rel, why string) {
	dst := filepath.Join(s.dir, lostFoundDir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		s.log.Error("cannot move to lost+found", queuecore.LogPath, p, queuecore.LogReason, why, queuecore.LogErr, err)
		return
	}
	for i := 1; ; i++ {
		if _, err := os.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
			break
		}
		dst = filepath.Join(s.dir, lostFoundDir, filepath.FromSlash(rel)) + "." + strconv.Itoa(i)
	}
	if err := os.Rename(p, dst); err != nil {
		s.log.Error("cannot move to lost+found", queuecore.LogPath, p, queuecore.LogReason, why, queuecore.LogErr, err)
		return
	}
	s.log.Warn("moved to lost+found", queuecore.LogPath, p, "to", dst, queuecore.LogReason, why)
	s.fl.note(func(fd *dirt) {
		fd.dirs[filepath.Dir(p)] = struct{}{}
		fd.dirs[filepath.Dir(dst)] = struct{}{}
	})
}

// readIDs reads the IDs reserved in DIR/ids.
func (s *Store) readIDs() error {
	b, err := os.ReadFile(filepath.Join(s.dir, idsName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		s.log.Warn("ignored an unreadable ids file; IDs go on from the largest in the tree", queuecore.LogPath, filepath.Join(s.dir, idsName), queuecore.LogErr, err)
		return nil
	}
	s.idsMark = n
	return nil
}
