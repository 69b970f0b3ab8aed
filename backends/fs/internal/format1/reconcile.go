package format1

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"yirangmq/queuecore"
)

// stray is a file in the tree at a path no message has.
type stray struct {
	path    string // where it is now
	orig    string // where it was found
	queue   string
	name    string
	rel     string // path under queues/, for lost+found
	owner   uint64 // from the ID xattr, if ownerOK
	ownerOK bool
	touched bool // the replayed journal wrote, moved or removed a file at its first path
	claimed bool
}

// reconciler brings the tree in line with the index after a replay.
type reconciler struct {
	s       *Store
	rs      *replayState
	strays  []*stray
	missing []*entry
	aside   int

	temps, moved, written, rewritten, removed, lostFound, lost int
}

// Log keys of the repair summary.
const (
	logTempsRemoved  = "temp_files_removed"
	logMoved         = "bodies_moved"
	logWritten       = "bodies_written_from_journal"
	logRewritten     = "bodies_rewritten"
	logStraysRemoved = "stray_files_removed"
	logLostFound     = "files_to_lost_found"
	logLost          = "messages_lost"
)

// maxLogged caps the log lines of one kind of repair; the summary counts
// them all.
const maxLogged = 20

// reconcile walks queues/ and repairs what does not match the index; see
// "Open and repair" in the package comment. It returns the number of
// repairs.
func (s *Store) reconcile(ctx context.Context, rs *replayState) (int, error) {
	r := &reconciler{s: s, rs: rs}
	if err := os.RemoveAll(filepath.Join(s.dir, trashDir)); err != nil {
		return 0, fmt.Errorf("empty trash: %w", err)
	}
	names, err := readNames(s.qdir)
	if err != nil {
		return 0, err
	}
	for _, name := range names {
		if s.ix.Queues[name] != nil {
			continue
		}
		p := filepath.Join(s.qdir, name)
		switch {
		case strings.HasPrefix(name, tempPrefix):
			r.temps++
			err = os.RemoveAll(p)
		case rs.deletedQueues[name]:
			r.removed++
			s.log.Info("removed the tree of a deleted queue", logPath, p)
			err = os.RemoveAll(p)
		default:
			err = r.toLostFound(p, name)
		}
		if err != nil {
			return 0, err
		}
	}
	for _, q := range s.ix.SortedQueues() {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := r.queue(q); err != nil {
			return 0, err
		}
	}
	if err := r.resolve(); err != nil {
		return 0, err
	}
	n := r.moved + r.written + r.rewritten + r.removed + r.lostFound + r.lost
	if n > 0 || r.temps > 0 {
		s.log.Info("repaired the store tree",
			logTempsRemoved, r.temps, logMoved, r.moved, logWritten, r.written, logRewritten, r.rewritten,
			logStraysRemoved, r.removed, logLostFound, r.lostFound, logLost, r.lost)
	}
	return n + r.temps, nil
}

// queue reconciles one queue's directory.
func (r *reconciler) queue(q *queue) error {
	s := r.s
	dir := filepath.Join(s.qdir, q.Name)
	if err := s.mkQueueDirs(q.Name); err != nil {
		return err
	}
	names, err := readNames(dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		if _, ok := queuecore.StateFromDir(name); ok {
			continue
		}
		if err := r.toLostFound(filepath.Join(dir, name), q.Name+"/"+name); err != nil {
			return err
		}
	}
	for _, st := range queuecore.States {
		if err := r.stateDir(q, st); err != nil {
			return err
		}
	}
	return nil
}

// stateDir matches the files of one state directory with the index. It
// matches the tree's messages by a hash of their names, not by a lookup
// per file, because a state directory may hold a million files; those of
// a spill are looked up (a hash probe) and ticked off in a bitmap. The
// directory is read a chunk at a time, so that memory stays bounded.
func (r *reconciler) stateDir(q *queue, st queuecore.State) error {
	s := r.s
	dir := filepath.Join(s.qdir, q.Name, st.Dir())
	want := make(map[string]*entry, q.ByState[st].Len())
	q.ByState[st].Ascend(func(e *entry) bool {
		want[e.Name()] = e
		return true
	})
	var sp *spill
	var seen []uint64
	if st == queuecore.StateReady && q.Ext.spill != nil {
		sp = q.Ext.spill
		seen = make([]uint64, len(sp.gone))
	}
	found, err := readChunks(dir, func(names []string) error {
		return r.names(q, dir, names, want, sp, seen)
	})
	if err != nil || !found {
		return err
	}
	for _, e := range want {
		r.missing = append(r.missing, e)
	}
	return sp.each(q, func(e *entry) {
		if x := int(e.Slot - 1); seen[x/64]&(1<<(x%64)) == 0 {
			r.missing = append(r.missing, e)
		}
	})
}

// names matches one chunk of a state directory's names: see stateDir.
func (r *reconciler) names(q *queue, dir string, names []string, want map[string]*entry, sp *spill, seen []uint64) error {
	for _, name := range names {
		p := dir + "/" + name
		if strings.HasPrefix(name, tempPrefix) {
			r.temps++
			if err := os.RemoveAll(p); err != nil {
				return err
			}
			continue
		}
		touched := r.rs.isTouched(q.Name, p)
		e := want[name]
		fromSpill := false
		if e == nil && sp != nil && !strings.HasPrefix(name, tempPrefix) {
			_, se, err := sp.find(q, name)
			if err != nil {
				return err
			}
			e, fromSpill = se, se != nil
		}
		if e == nil {
			r.addStray(p, q.Name, name, touched)
			continue
		}
		if touched {
			// The journal changed this path since the last checkpoint:
			// make sure the file is e's and whole.
			ok, err := r.check(e, p)
			if err != nil {
				return err
			}
			if !ok {
				continue // moved aside: e is missing
			}
		}
		if fromSpill {
			x := int(e.Slot - 1)
			seen[x/64] |= 1 << (x % 64)
		} else {
			delete(want, name)
		}
	}
	return nil
}

// check looks at the file at e's path, which the journal touched: it must
// be e's (by its ID xattr) and, if the journal holds e's body, hold that
// body. A file of another message is moved aside as a stray (ok false); a
// damaged body is rewritten from the journal.
func (r *reconciler) check(e *entry, p string) (ok bool, err error) {
	owner, ownerOK := readOwner(p)
	if ownerOK && owner != e.ID {
		return false, r.moveAside(p, e.Q.Name, e.Name(), true)
	}
	ref, has := r.rs.bodies[e.ID]
	if !has {
		return true, nil
	}
	if ref.staged != nil {
		// A staged body was synced whole before its record and linked
		// into place: with its ID xattr its size is checked, not its bytes
		// (an open after a crash would read every big body the journal
		// names).
		r.s.dirty.dir(filepath.Dir(p)) // the open's checkpoint makes it durable before DIR/staged is emptied
		if ownerOK {
			if st, err := os.Lstat(p); err == nil && st.Mode().IsRegular() && st.Size() == int64(ref.staged.n) {
				return true, nil
			}
		} else if fileMatches(p, *ref.staged) {
			// Without an ID xattr the size does not tell whose it is:
			// its bytes do.
			return true, nil
		}
		if !ownerOK {
			// Whose it is is unknown: kept as a stray; resolve looks in
			// DIR/staged for e's body.
			return false, r.moveAside(p, e.Q.Name, e.Name(), true)
		}
		placed, err := r.placeStaged(e, p, *ref.staged)
		if err == nil && !placed {
			r.s.log.Error("the body file of a message is not the size its record says, and its staged copy is gone; kept as it is",
				logID, e.ID, logPath, p, logBytes, ref.staged.n)
		}
		return err == nil, err
	}
	want, err := r.rs.read(ref)
	if err != nil {
		return false, err
	}
	got, err := os.ReadFile(p)
	if err == nil && bytes.Equal(got, want) {
		return true, nil
	}
	if !ownerOK {
		// Whose it is is unknown: keep it as a stray, not overwritten.
		if err := r.moveAside(p, e.Q.Name, e.Name(), true); err != nil {
			return false, err
		}
	}
	r.rewritten++
	r.logf(r.rewritten, "rewrote a damaged body from the journal", logID, e.ID, logPath, p)
	return true, r.s.writeBody(p, e.ID, want)
}

// moveAside renames the file at p to a temp name in its directory and keeps
// it as a stray, so that its path is free for its rightful owner.
func (r *reconciler) moveAside(p, queue, name string, touched bool) error {
	r.aside++
	np := filepath.Join(filepath.Dir(p), tempPrefix+"reconcile-"+strconv.Itoa(r.aside))
	r.s.dirty.dir(filepath.Dir(p))
	if err := os.Rename(p, np); err != nil {
		return err
	}
	x := r.addStray(np, queue, name, touched)
	x.orig = p
	x.rel = strings.TrimPrefix(p, r.s.qdir+"/")
	return nil
}

func (r *reconciler) addStray(p, queue, name string, touched bool) *stray {
	x := &stray{path: p, orig: p, queue: queue, name: name, touched: touched}
	x.rel = strings.TrimPrefix(p, r.s.qdir+"/")
	x.owner, x.ownerOK = readOwner(p)
	r.strays = append(r.strays, x)
	return x
}

// resolve gives every message without a file its body back (its own stray
// file, found by ID xattr; the journal's copy; a stray of the same queue
// and name) and disposes of the strays nobody claimed.
//
// It stays whole: frozen format-1 code (see the package comment).
func (r *reconciler) resolve() error {
	s := r.s
	byOwner := map[uint64][]*stray{}
	byName := map[[2]string][]*stray{}
	byPath := map[string]*stray{}
	for _, x := range r.strays {
		if x.ownerOK {
			byOwner[x.owner] = append(byOwner[x.owner], x)
		} else {
			k := [2]string{x.queue, x.name}
			byName[k] = append(byName[k], x)
			byPath[x.orig] = x
		}
	}
	// Without an ID xattr, a file whose move the crash cut off is found at
	// one of the paths the journal says its message had, latest first.
	fromHistory := func(id uint64) *stray {
		h := r.rs.history[id]
		for i := len(h) - 1; i >= 0; i-- {
			if x := byPath[h[i]]; x != nil && !x.claimed {
				x.claimed = true
				return x
			}
		}
		return nil
	}
	claim := func(xs []*stray) *stray {
		for _, x := range xs {
			if !x.claimed {
				x.claimed = true
				return x
			}
		}
		return nil
	}
	// moveTo renames x to p, where the body of e belongs.
	moveTo := func(x *stray, e *entry, p string) error {
		s.dirty.file(p)
		s.dirty.dir(filepath.Dir(x.path))
		if err := renameMkdir(x.path, p); err != nil {
			return err
		}
		s.dirty.moved(x.path, p, e.ID)
		r.moved++
		r.logf(r.moved, "moved a body to where its message is", logID, e.ID, logFrom, x.path, logTo, p)
		return nil
	}
	for _, e := range r.missing {
		p := s.entryPath(e)
		if x := claim(byOwner[e.ID]); x != nil {
			if err := moveTo(x, e, p); err != nil {
				return err
			}
			continue
		}
		if ref, ok := r.rs.bodies[e.ID]; ok && ref.staged != nil {
			placed, err := r.placeStaged(e, p, *ref.staged)
			if err != nil {
				return err
			}
			if placed {
				continue
			}
		} else if ok {
			b, err := r.rs.read(ref)
			if err != nil {
				return err
			}
			if err := s.writeBody(p, e.ID, b); err != nil {
				return err
			}
			r.written++
			r.logf(r.written, "wrote a missing body from the journal", logID, e.ID, logPath, p)
			continue
		}
		x := fromHistory(e.ID)
		if x == nil {
			x = claim(byName[[2]string{e.Q.Name, e.Name()}])
		}
		if x != nil {
			if err := moveTo(x, e, p); err != nil {
				return err
			}
			continue
		}
		// Only a power cut in SyncNormal or SyncOff, or a hand, can get
		// here: the message cannot be served, so it goes.
		r.lost++
		s.ix.Remove(e)
		if r.lost <= maxLogged*5 {
			s.log.Error("the body of a message is lost; the message is dropped", logID, e.ID, logPath, p)
		}
	}
	for _, x := range r.strays {
		if x.claimed {
			continue
		}
		// A file the journal touched, or the body of a deleted message, is
		// explained; a file nothing explains is kept for the operator.
		if x.touched || x.ownerOK && s.ix.lacks(x.owner) {
			s.dirty.dir(filepath.Dir(x.path))
			if err := os.Remove(x.path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			r.removed++
			r.logf(r.removed, "removed the body file of a deleted or moved message", logPath, x.path)
			continue
		}
		if err := r.toLostFound(x.path, x.rel); err != nil {
			return err
		}
	}
	return nil
}

// toLostFound moves a file or tree nothing explains to lost+found/rel.
func (r *reconciler) toLostFound(p, rel string) error {
	dst := filepath.Join(r.s.dir, lostFoundDir, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	if _, err := os.Lstat(dst); err == nil {
		dst += "." + time.Now().UTC().Format("20060102T150405.000000000")
	}
	r.s.dirty.file(dst)
	r.s.dirty.dir(filepath.Dir(p))
	if err := os.Rename(p, dst); err != nil {
		return fmt.Errorf("move to lost+found: %w", err)
	}
	r.lostFound++
	r.s.log.Warn("moved a file no metadata explains to lost+found", logFrom, p, logTo, dst)
	return nil
}

func (r *reconciler) logf(n int, msg string, args ...any) {
	if n <= maxLogged {
		r.s.log.Info(msg, args...)
	}
}

// readChunks calls fn with the names of dir a chunk at a time, so that a
// directory of a million files costs a chunk of memory. A missing dir is
// not read: found is false. A read error ends it before fn sees the names
// read with it.
func readChunks(dir string, fn func(names []string) error) (found bool, err error) {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	for {
		names, err := f.Readdirnames(4096)
		if err != nil && !errors.Is(err, io.EOF) {
			return true, fmt.Errorf("read directory %s: %w", dir, err)
		}
		if len(names) == 0 {
			return true, nil
		}
		if err := fn(names); err != nil {
			return true, err
		}
	}
}

// readNames lists a directory; a missing one is empty.
func readNames(dir string) ([]string, error) {
	var all []string
	_, err := readChunks(dir, func(names []string) error {
		all = append(all, names...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return all, nil
}
