package fs

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/backends/fs/internal/memindex"
	"yirangmq/queuecore"
)

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
	s.ix.Queues[name] = memindex.NewQueue[queueExt](info)
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
	} else if q, st, name, ok := splitRel(t.to); ok && keep.rel == t.from && s.ix.Queues[q] != nil {
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
	next := max(s.ix.MaxID, s.idsMark)
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
	q := s.ix.Queues[m.Queue]
	if s.ix.ByID[m.ID] != nil || q.Named(m.Name, m.State == queuecore.StateArchived) != nil {
		// resolveIDs and resolveNames leave no duplicate: only a bug gets here.
		s.toLostFound(f.abs(s), f.rel, "a duplicate the scan missed")
		return
	}
	s.ix.Add(memindex.NewEntry(&m, q))
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
