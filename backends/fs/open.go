package fs

import (
	"bufio"
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
	"syscall"
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

// writeManifest records every message's ID and place at a clean stop,
// once everything else is durable, so that the next start can tell a
// message removed by hand from one that never was. It is a hint, never
// the truth: the next start reads it once and removes it.
func (s *Store) writeManifest() error {
	s.mu.RLock()
	var b bytes.Buffer
	for _, q := range s.ix.sortedQueues() {
		for _, st := range queuecore.States {
			q.byState[st].Ascend(func(e *entry) bool {
				fmt.Fprintf(&b, "%d %s %s %s\n", e.id, q.name, st.Dir(), strconv.Quote(e.name()))
				return true
			})
		}
	}
	s.mu.RUnlock()
	if !s.durable {
		// Whatever the commits left to the kernel goes to the disk first:
		// a manifest that outlived the messages it names would call a
		// power cut's losses removals by hand.
		if err := syncfs(s.dir); err != nil {
			return err
		}
	}
	if err := s.writeFileDurably(filepath.Join(s.dir, manifestName), b.Bytes(), nil); err != nil {
		return fmt.Errorf("write the manifest: %w", err)
	}
	if !s.durable {
		return syncfs(s.dir)
	}
	return nil
}

func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// manifestEntry is one line of DIR/manifest.
type manifestEntry struct {
	id    uint64
	queue string
	state queuecore.State
	name  string
}

func parseManifestLine(line string) (manifestEntry, bool) {
	f := strings.SplitN(line, " ", 4)
	if len(f) != 4 {
		return manifestEntry{}, false
	}
	id, err := strconv.ParseUint(f[0], 10, 64)
	st, ok := queuecore.StateFromDir(f[2])
	name, qerr := strconv.Unquote(f[3])
	if err != nil || !ok || qerr != nil {
		return manifestEntry{}, false
	}
	return manifestEntry{id: id, queue: f[1], state: st, name: name}, true
}

// file is one regular file found in a state directory.
type file struct {
	rel   string // QUEUE/STATE/NAME, relative to DIR/queues
	queue string
	state queuecore.State
	name  string
	ino   uint64
	size  int64
	mtime time.Time
	uid   uint32
	gid   uint32
	fd    found // its metadata (from its txn when it has one)
	txn   *txn
	copy  bool // another file has its ID: it gets a new one
	gone  bool // removed from the tree (an extra link, lost+found)
}

func (f *file) abs(s *Store) string { return filepath.Join(s.qdir, filepath.FromSlash(f.rel)) }

// where reports whether the file is where its metadata says.
func (f *file) where() bool {
	return f.fd.hasState && f.fd.hasQueue && f.fd.msg.State == f.state && f.fd.msg.Queue == f.queue
}

// scan reads the tree into the index (see "Open" in the package comment).
type scan struct {
	s      *Store
	files  []*file
	byPath map[string]*file
	queues []string
	counts map[string]int // what it took from the tree, by kind, for the log
	fixed  int            // txns finished, extra names removed
	temps  []string       // temp files and directories a crash left
	lost   int            // entries moved to lost+found
	ids    map[uint64]bool
}

func (sc *scan) note(kind string) {
	if sc.counts == nil {
		sc.counts = map[string]int{}
	}
	sc.counts[kind]++
}

// readTree reads the queues and their files, and gives every file one
// name (resolveLinks).
func (s *Store) readTree() (*scan, error) {
	sc := &scan{s: s, byPath: map[string]*file{}}
	if err := sc.read(); err != nil {
		return nil, err
	}
	sc.resolveLinks()
	return sc, nil
}

func (sc *scan) read() error {
	s := sc.s
	names, err := readNames(s.qdir)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := filepath.Join(s.qdir, n)
		if strings.HasPrefix(n, tempPrefix) {
			sc.temps = append(sc.temps, p) // a queue not made whole
			continue
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case !fi.IsDir():
			s.toLostFound(p, n, "a queue is a directory; this is not one")
			sc.lost++
			continue
		case queuecore.CheckQueueName(n) != nil:
			s.toLostFound(p, n, fmt.Sprintf("not a queue name: %v", queuecore.CheckQueueName(n)))
			sc.lost++
			continue
		}
		if err := sc.queue(n, fi); err != nil {
			return err
		}
	}
	return nil
}

// queue reads one queue directory: its policy file and state directories.
func (sc *scan) queue(name string, dirInfo fs.FileInfo) error {
	s := sc.s
	info, err := s.readQueue(name, dirInfo)
	if err != nil {
		return err
	}
	s.ix.queues[name] = newQueue(info)
	sc.queues = append(sc.queues, name)
	d := filepath.Join(s.qdir, name)
	names, err := readNames(d)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := filepath.Join(d, n)
		if n == policyName {
			continue
		}
		if strings.HasPrefix(n, tempPrefix) {
			sc.temps = append(sc.temps, p)
			continue
		}
		st, ok := queuecore.StateFromDir(n)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if !ok || !fi.IsDir() {
			s.toLostFound(p, name+"/"+n, "a queue directory holds only policy.json and the state directories")
			sc.lost++
			continue
		}
		if err := sc.stateDir(name, st); err != nil {
			return err
		}
	}
	for _, st := range queuecore.States {
		if err := os.Mkdir(filepath.Join(d, st.Dir()), 0o700); err == nil {
			s.fl.note(func(fd *dirt) { fd.dirs[d] = struct{}{} })
		} else if !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

// stateDir reads the files of one state directory.
func (sc *scan) stateDir(queue string, st queuecore.State) error {
	s := sc.s
	d := filepath.Join(s.qdir, queue, st.Dir())
	names, err := readNames(d)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := filepath.Join(d, n)
		rel := queue + "/" + st.Dir() + "/" + n
		if strings.HasPrefix(n, tempPrefix) {
			sc.temps = append(sc.temps, p) // a body not committed, or a link not renamed
			continue
		}
		var sys unix.Stat_t
		if err := unix.Lstat(p, &sys); err != nil {
			return err
		}
		if sys.Mode&unix.S_IFMT != unix.S_IFREG {
			s.toLostFound(p, rel, "not a regular file: a message is a plain file")
			sc.lost++
			continue
		}
		if err := queuecore.CheckMessageName(n); err != nil {
			s.toLostFound(p, rel, fmt.Sprintf("not a message name: %v", err))
			sc.lost++
			continue
		}
		attrs, err := readAttrs(p)
		if err != nil {
			return fmt.Errorf("read the attributes of %s: %w", p, err)
		}
		f := &file{
			rel: rel, queue: queue, state: st, name: n, ino: sys.Ino, size: sys.Size,
			mtime: time.Unix(sys.Mtim.Sec, sys.Mtim.Nsec), uid: sys.Uid, gid: sys.Gid,
		}
		get := func(k string) (string, error) {
			if v, ok := attrs[k]; ok {
				return string(v), nil
			}
			return "", errNoField
		}
		if raw, ok := attrs[keyTxn]; ok {
			if t, err := decodeTxn(raw); err == nil {
				f.txn = &t
				get = t.get
			} else {
				s.log.Warn("ignored an unreadable txn attribute", queuecore.LogPath, p)
			}
		}
		f.fd = parseFields(get)
		for _, pr := range f.fd.problems {
			s.log.Warn("ignored an attribute that cannot be read", queuecore.LogPath, p, queuecore.LogReason, pr)
		}
		sc.files = append(sc.files, f)
		sc.byPath[rel] = f
	}
	return nil
}

// resolveLinks gives every file one name: the one its txn goes to, or the
// one its metadata names. Several names of one file are a move a crash
// cut short (a move links the new name before it removes the old one).
func (sc *scan) resolveLinks() {
	s := sc.s
	byIno := map[uint64][]*file{}
	var inos []uint64
	for _, f := range sc.files {
		if _, ok := byIno[f.ino]; !ok {
			inos = append(inos, f.ino)
		}
		byIno[f.ino] = append(byIno[f.ino], f)
	}
	for _, ino := range inos {
		group := byIno[ino]
		keep := group[0]
		if t := group[0].txn; t != nil {
			keep = sc.finishTxn(group, t)
		} else if len(group) > 1 {
			for _, f := range group {
				if f.where() {
					keep = f
					break
				}
			}
		}
		for _, f := range group {
			if f != keep && !f.gone {
				if err := os.Remove(f.abs(s)); err != nil {
					s.log.Warn("cannot remove an extra name of a message", queuecore.LogPath, f.abs(s), queuecore.LogErr, err)
				}
				f.gone = true
				delete(sc.byPath, f.rel)
				sc.fixed++
				s.fl.note(func(fd *dirt) { fd.dirs[filepath.Dir(f.abs(s))] = struct{}{} })
			}
		}
	}
}

// finishTxn finishes the change a txn attribute describes: the file goes
// to the txn's path (unless a person moved it elsewhere, or another file
// holds that path), gets the txn's fields, and loses the txn. It returns
// the file that stays.
func (sc *scan) finishTxn(group []*file, t *txn) *file {
	s := sc.s
	keep := group[0]
	for _, f := range group {
		if f.rel == t.from {
			keep = f
		}
	}
	target := -1
	for i, f := range group {
		if f.rel == t.to {
			target = i
		}
	}
	if target >= 0 {
		keep = group[target]
	} else if q, st, name, ok := splitRel(t.to); ok && keep.rel == t.from && s.ix.queues[q] != nil {
		// Cut short before the file reached its new name.
		occupant := sc.byPath[t.to]
		replace := occupant != nil && st == queuecore.StateArchived && occupant.ino != keep.ino
		if occupant == nil || replace {
			from := keep.abs(s)
			if err := renameTo(from, filepath.Join(s.qdir, filepath.FromSlash(t.to)), replace); err == nil {
				if replace {
					occupant.gone = true // the archive keeps the latest ack of a name
				}
				delete(sc.byPath, keep.rel)
				keep.rel, keep.queue, keep.state, keep.name = t.to, q, st, name
				sc.byPath[keep.rel] = keep
				// The new name durable, then the old one gone, before the
				// txn goes: a power cut in between finds the txn again.
				sc.syncDirs(filepath.Dir(keep.abs(s)), filepath.Dir(from))
			}
		}
	}
	p := keep.abs(s)
	if err := writeAllFields(p, t.fields); err != nil {
		s.log.Warn("cannot finish a change's attributes; its txn attribute stays", queuecore.LogPath, p, queuecore.LogErr, err)
		return keep
	}
	if err := unix.Lremovexattr(p, xattrPrefix+keyTxn); err != nil {
		s.log.Warn("cannot remove a finished txn attribute", queuecore.LogPath, p, queuecore.LogErr, err)
	}
	if s.durable {
		if err := s.fsyncPath(p); err != nil {
			s.log.Warn("cannot sync a finished change", queuecore.LogPath, p, queuecore.LogErr, err)
		}
	}
	for _, f := range group {
		f.txn = nil
	}
	sc.fixed++
	return keep
}

// byID is the files of the tree by the ID their attributes give.
func (sc *scan) byID() map[uint64]*file {
	m := make(map[uint64]*file, len(sc.files))
	for _, f := range sc.files {
		if !f.gone && f.fd.hasID {
			m[f.fd.msg.ID] = f
		}
	}
	return m
}

// syncDirs fsyncs directories in order (SyncFull, SyncStrict), saying
// in the log what fails: the flush at the end of Open tries them again.
func (sc *scan) syncDirs(dirs ...string) {
	s := sc.s
	for _, d := range dirs {
		if !s.durable {
			s.fl.note(func(fd *dirt) { fd.dirs[d] = struct{}{} })
			continue
		}
		if err := s.fsyncPath(d); err != nil {
			s.log.Warn("cannot sync a directory", queuecore.LogPath, d, queuecore.LogErr, err)
			s.fl.note(func(fd *dirt) { fd.dirs[d] = struct{}{} })
		}
	}
}

// resolveIDs gives each ID to one file: the one that is where its
// metadata says (the others are copies made by hand: `cp -a`).
func (sc *scan) resolveIDs() {
	byID := map[uint64][]*file{}
	for _, f := range sc.files {
		if !f.gone && f.fd.hasID {
			byID[f.fd.msg.ID] = append(byID[f.fd.msg.ID], f)
		}
	}
	for _, fs := range byID {
		if len(fs) < 2 {
			continue
		}
		keep := fs[0]
		for _, f := range fs {
			if f.where() {
				keep = f
				break
			}
		}
		for _, f := range fs {
			if f != keep {
				f.copy = true
			}
		}
	}
}

// resolveNames keeps names unique among a queue's live messages: a second
// live file of a name (a person's copy into another state) cannot be a
// message of its own and goes to lost+found.
func (sc *scan) resolveNames() {
	type qn struct{ q, name string }
	byName := map[qn][]*file{}
	for _, f := range sc.files {
		if !f.gone && f.state.Live() {
			k := qn{f.queue, f.name}
			byName[k] = append(byName[k], f)
		}
	}
	for _, fs := range byName {
		if len(fs) < 2 {
			continue
		}
		keep := fs[0]
		for _, f := range fs {
			if f.where() && !f.copy {
				keep = f
				break
			}
		}
		for _, f := range fs {
			if f != keep {
				sc.s.toLostFound(f.abs(sc.s), f.rel, fmt.Sprintf("another live message of queue %s is named %q (in %s/): live names are unique", keep.queue, keep.name, keep.state.Dir()))
				f.gone = true
				sc.lost++
			}
		}
	}
}

// index builds the index from the files, and the changes made by hand.
func (sc *scan) index() {
	s := sc.s
	sc.ids = map[uint64]bool{}
	var fresh []*file
	for _, f := range sc.files {
		if f.gone {
			continue
		}
		if !f.fd.hasID || f.copy {
			fresh = append(fresh, f)
			continue
		}
		m := sc.message(f, f.fd.msg.ID)
		kind := queuecore.HandKind(0)
		if f.fd.hasState && f.fd.hasQueue && !f.where() {
			kind = queuecore.HandMoved
		}
		sc.add(f, m, kind)
	}
	// Files without an ID of their own get new ones in the order of their
	// times, so that new messages in inbox/ line up as they were written.
	slices.SortFunc(fresh, func(a, b *file) int {
		return cmp.Or(a.mtime.Compare(b.mtime), strings.Compare(a.rel, b.rel))
	})
	next := max(s.ix.maxID, s.idsMark)
	for _, f := range fresh {
		next++
		m := sc.message(f, next)
		m.Seq = next
		kind := queuecore.HandCopied
		if !f.fd.hasID {
			kind = queuecore.HandNew
			m.PublishedAt, m.FirstAt, m.StateAt = f.mtime, f.mtime, f.mtime
			m.UID, m.GID = f.uid, f.gid
		}
		sc.add(f, m, kind)
	}
}

// message is the file's message as found: where it is, with its fields.
func (sc *scan) message(f *file, id uint64) queuecore.Message {
	m := f.fd.msg
	m.ID, m.Queue, m.State, m.Name, m.Size = id, f.queue, f.state, f.name, f.size
	return m
}

func (sc *scan) add(f *file, m queuecore.Message, kind queuecore.HandKind) {
	s := sc.s
	q := s.ix.queues[m.Queue]
	if s.ix.byID[m.ID] != nil || q.named(m.Name, m.State == queuecore.StateArchived) != nil {
		// resolveIDs and resolveNames leave no duplicate: only a bug gets here.
		s.toLostFound(f.abs(s), f.rel, "a duplicate the scan missed")
		return
	}
	s.ix.add(newEntry(&m, q))
	sc.ids[m.ID] = true
	if kind == 0 {
		return
	}
	h := queuecore.HandChange{Kind: kind, Msg: m}
	if kind != queuecore.HandNew {
		h.From, h.FromQueue = f.fd.msg.State, f.fd.msg.Queue
	}
	s.hand = append(s.hand, h)
	s.rewrite[m.ID] = true
	sc.note(kind.String())
	s.log.Debug("found changed by hand", queuecore.LogPath, f.rel, "kind", kind.String(), queuecore.LogID, m.ID,
		"from_queue", h.FromQueue, "from_state", h.From.Dir(), "had_id", f.fd.msg.ID)
}

// readManifest compares the tree with the manifest of the last clean
// stop: a message it names that is nowhere now was removed by hand. The
// manifest is then removed, so that a crash later cannot make it stale.
func (sc *scan) readManifest() error {
	s := sc.s
	p := filepath.Join(s.dir, manifestName)
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewScanner(f)
	r.Buffer(make([]byte, 4096), 1<<20)
	for r.Scan() {
		me, ok := parseManifestLine(r.Text())
		if !ok || sc.ids[me.id] {
			continue
		}
		s.hand = append(s.hand, queuecore.HandChange{Kind: queuecore.HandGone,
			Msg: queuecore.Message{ID: me.id, Queue: me.queue, State: me.state, Name: me.name}})
		sc.note(queuecore.HandGone.String())
	}
	if err := r.Err(); err != nil {
		s.log.Warn("manifest cut short; removals by hand past it are not counted", queuecore.LogPath, p, queuecore.LogErr, err)
	}
	if err := os.Remove(p); err != nil {
		return err
	}
	if s.durable {
		return s.fsyncPath(s.dir)
	}
	return nil
}

// report logs what Open did, in one line.
func (sc *scan) report(took time.Duration) {
	s := sc.s
	args := []any{"queues", len(sc.queues), "messages", s.ix.n, queuecore.LogTook, took.Round(time.Millisecond)}
	if sc.fixed > 0 {
		args = append(args, "changes_finished", sc.fixed)
	}
	if sc.lost > 0 {
		args = append(args, "to_lost_found", sc.lost)
	}
	for _, k := range []queuecore.HandKind{queuecore.HandMoved, queuecore.HandNew, queuecore.HandCopied, queuecore.HandGone} {
		if n := sc.counts[k.String()]; n > 0 {
			args = append(args, "by_hand_"+k.String(), n)
		}
	}
	s.log.Info("fs store opened", args...)
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
