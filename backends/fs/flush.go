package fs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// A commit changes the tree at once (renames, links, attributes) and
// leaves what makes it durable to a flush: fsyncs of the files whose
// attributes changed and of the directories whose entries changed. In
// SyncFull and SyncStrict a commit that must be durable when it returns
// waits for a flush that started after its changes; the one that finds no
// flush running does it for every commit waiting (group commit), so N
// concurrent commits share the fsyncs of one directory. A lease or an ack
// in SyncFull (Op.NoSync) does not wait: a timer flushes within
// queuecore.SyncDelay. Every flush takes everything changed before it
// started, so a commit that returns durable makes every earlier one
// durable too.
//
// Order inside a flush, so that a power cut at any moment leaves each
// message under at least one name and whole:
//  1. DIR/intents, when finished intents were removed since it was last
//     synced (an intent itself is durable before its batch touches the
//     tree: writeIntent);
//  2. the files whose attributes changed (their txn attribute first
//     written, so a durable new name implies a durable txn or fields);
//  3. the directories that gained or lost entries;
//  4. then, under the store's mutex, the old names of moved files are
//     removed (a move links the file at its new name and keeps the old one
//     until now), the txn attributes of changes now durable are removed,
//     and so are the intent files; their directories are synced by the
//     next flush, DIR/intents before anything else (a finished intent
//     that a power cut brought back would be done again over what
//     changed after it).
//
// SyncNormal and SyncOff flush nothing: a move is a rename(2), and a txn
// or an intent is removed as soon as its change is made.

// flusher is the state of the group commit.
type flusher struct {
	mu      sync.Mutex
	cond    *sync.Cond
	running bool
	// gen counts the batches of dirt added; done is the gen up to which
	// everything is durable.
	gen, done uint64
	dirt      dirt
	timer     *time.Timer
	stopped   bool
}

// dirt is what a flush must make durable.
type dirt struct {
	files   map[uint64]struct{} // message IDs whose file's attributes changed
	dirs    map[string]struct{}
	intents []string // batch directories of intents, removed once the rest is durable
	// intentsDir: batch directories were removed since DIR/intents was
	// last synced. It is synced first, before anything changed after
	// them is durable: a finished intent that a power cut brought back
	// would be done again over those changes.
	intentsDir bool
	stale      map[string]uint64 // old names (of that gen) to remove once the rest is durable
	txns       map[uint64]uint64 // message IDs whose txn (of that gen) to remove after
}

func (f *flusher) init() {
	f.cond = sync.NewCond(&f.mu)
	f.dirt = newDirt()
}

func newDirt() dirt {
	return dirt{files: map[uint64]struct{}{}, dirs: map[string]struct{}{}, stale: map[string]uint64{}, txns: map[uint64]uint64{}}
}

func (d *dirt) empty() bool {
	return len(d.files) == 0 && len(d.dirs) == 0 && len(d.intents) == 0 && len(d.stale) == 0 && len(d.txns) == 0 && !d.intentsDir
}

// note adds what a commit changed and returns the gen a flush must reach
// for it to be durable.
func (f *flusher) note(add func(d *dirt)) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	add(&f.dirt)
	f.gen++
	return f.gen
}

// flushUntil returns once everything noted up to gen is durable, flushing
// itself when no flush is running.
func (s *Store) flushUntil(gen uint64) error {
	f := &s.fl
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.done < gen {
		if f.running {
			f.cond.Wait()
			continue
		}
		f.running = true
		f.mu.Unlock()
		upTo, err := s.flush()
		f.mu.Lock()
		f.running = false
		f.cond.Broadcast()
		if err != nil {
			return err
		}
		f.done = upTo
	}
	return nil
}

// flushAll flushes whatever is noted.
func (s *Store) flushAll() error {
	s.fl.mu.Lock()
	gen := s.fl.gen
	s.fl.mu.Unlock()
	return s.flushUntil(gen)
}

// flushSoon arms the timer that flushes what NoSync commits changed within
// queuecore.SyncDelay.
func (s *Store) flushSoon() {
	f := &s.fl
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.timer != nil || f.stopped {
		return
	}
	f.timer = time.AfterFunc(queuecore.SyncDelay, func() {
		f.mu.Lock()
		f.timer = nil
		gen := f.gen
		f.mu.Unlock()
		if err := s.flushUntil(gen); err != nil {
			s.log.Error("flush of leases and acks failed", queuecore.LogErr, err)
		}
	})
}

func (f *flusher) stopTimer() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
	if f.timer != nil && f.timer.Stop() {
		f.timer = nil
	}
}

// flush makes everything noted durable (see the order above) and returns
// the gen it covers; then it removes the old names of moved files and the
// intents of batches now durable, and finishes the txns (finishTxns). In
// SyncNormal and SyncOff it only finishes txns. A failed sync puts the
// store in the failed state: what is on disk is no longer known.
func (s *Store) flush() (uint64, error) {
	s.fl.mu.Lock()
	take, upTo := s.fl.dirt, s.fl.gen
	s.fl.dirt = newDirt()
	s.fl.mu.Unlock()
	if take.empty() {
		return upTo, nil
	}
	var err error
	if s.durable {
		err = s.flushSyncs(take)
	}
	s.mu.Lock()
	if err != nil {
		s.failLocked(err)
	}
	if s.failErr != nil {
		err = s.failErr
		s.mu.Unlock()
		return 0, err
	}
	var later []string
	for p, gen := range take.stale {
		if s.stale[p].gen != gen {
			continue // removed with its message, or the name of a later move
		}
		s.dropStaleLocked(p)
		if err := unix.Unlink(p); err != nil && !errors.Is(err, unix.ENOENT) {
			s.log.Warn("cannot remove the old name of a moved message", queuecore.LogPath, p, queuecore.LogErr, err)
		}
		later = append(later, filepath.Dir(p))
	}
	s.mu.Unlock()
	for _, p := range take.intents {
		if err := os.RemoveAll(p); err != nil {
			s.log.Warn("cannot remove a batch's intent", queuecore.LogPath, p, queuecore.LogErr, err)
		}
	}
	retry := s.finishTxns(take.txns)
	if len(later)+len(take.intents)+len(retry) > 0 {
		s.fl.note(func(d *dirt) {
			for _, p := range later {
				d.dirs[p] = struct{}{}
			}
			d.intentsDir = d.intentsDir || len(take.intents) > 0
			for id, gen := range retry {
				d.txns[id] = gen
			}
		})
		s.flushSoon()
	}
	return upTo, nil
}

// finishTxns writes the fields of the txns of take (those still the
// file's latest) and removes the txn attributes: the fields outside the
// lock, through the file's name at the time (a move meanwhile only makes
// the writes fail, and the txn is finished at a later flush), the
// removal under it, where a later txn cannot slip in. It returns the txns
// to try again.
func (s *Store) finishTxns(txns map[uint64]uint64) map[uint64]uint64 {
	type work struct {
		id, gen uint64
		path    string
		set     []field
		remove  []string
		ok      bool
	}
	var ws []work
	s.mu.RLock()
	for id, gen := range txns {
		pt, ok := s.txns[id]
		e := s.ix.ByID[id]
		if !ok || pt.gen != gen || e == nil {
			continue // finished, superseded by a later txn, or deleted
		}
		m := e.Message()
		nf := fields(&m)
		w := work{id: id, gen: gen, path: s.entryPath(e), set: nf, remove: otherKeys(nf)}
		if pt.known {
			w.set, w.remove = fieldDiff(pt.disk, nf)
		}
		ws = append(ws, w)
	}
	s.mu.RUnlock()
	for i := range ws {
		ws[i].ok = applyFields(ws[i].path, ws[i].set, ws[i].remove) == nil
	}
	var retry map[uint64]uint64
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range ws {
		pt, ok := s.txns[w.id]
		if !ok || pt.gen != w.gen {
			continue
		}
		if !w.ok || unix.Lremovexattr(w.path, xattrPrefix+keyTxn) != nil {
			// Perhaps half written: the next try writes every field.
			pt.known = false
			s.txns[w.id] = pt
			if retry == nil {
				retry = map[uint64]uint64{}
			}
			retry[w.id] = w.gen
			continue
		}
		delete(s.txns, w.id)
	}
	return retry
}

// flushSyncs does the fsyncs of take: DIR/intents first when batch
// directories were removed, then files, then directories (an intent is
// durable before its batch changes anything: writeIntent). Never one
// syncfs(2) for many: it writes back every dirty page of the whole file
// system, other programs' too, so a commit's time would have no bound
// (measured: docs/performance-history.md, "The fs store without syncfs").
func (s *Store) flushSyncs(take dirt) error {
	if take.intentsDir {
		if err := s.fsyncPath(filepath.Join(s.dir, intentsDir)); err != nil {
			return err
		}
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	s.mu.RLock()
	for id := range take.files {
		e := s.ix.ByID[id]
		if e == nil {
			continue // deleted since: nothing of it to keep
		}
		f, err := os.OpenFile(s.entryPath(e), os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			s.mu.RUnlock()
			return fmt.Errorf("flush message %d: %w", id, err)
		}
		files = append(files, f)
	}
	s.mu.RUnlock()
	for _, f := range files {
		if err := s.fsync(f); err != nil {
			return fmt.Errorf("fsync %s: %w", f.Name(), err)
		}
	}
	dirs := make([]string, 0, len(take.dirs))
	for d := range take.dirs {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		if err := s.fsyncPath(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err // a directory gone with its deleted queue needs nothing
		}
	}
	return nil
}

func (s *Store) fsync(f *os.File) error {
	if s.cfg.fsync != nil {
		return s.cfg.fsync(f)
	}
	return f.Sync()
}

// fsyncPath fsyncs the file or directory at p.
func (s *Store) fsyncPath(p string) error {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	err = s.fsync(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync %s: %w", p, err)
	}
	return nil
}

// finishAllTxns finishes every txn left (at Close, once all is durable),
// and syncs the files it changed, so that a stopped store carries no txn.
func (s *Store) finishAllTxns() error {
	s.mu.RLock()
	all := make(map[uint64]uint64, len(s.txns))
	for id, pt := range s.txns {
		all[id] = pt.gen
	}
	s.mu.RUnlock()
	if left := s.finishTxns(all); len(left) > 0 {
		return fmt.Errorf("%d messages keep a txn attribute: their fields could not be written", len(left))
	}
	if !s.durable {
		return nil
	}
	var errs []error
	s.mu.RLock()
	defer s.mu.RUnlock()
	for id := range all {
		if e := s.ix.ByID[id]; e != nil {
			if err := s.fsyncPath(s.entryPath(e)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
