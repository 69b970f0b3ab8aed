package format1

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// fileOpKind is what a file operation does to the tree.
type fileOpKind uint8

const (
	opWrite   fileOpKind = iota + 1 // write body to path to (temp file, xattr, rename)
	opRename                        // rename from to to
	opRemove                        // unlink from
	opMkQueue                       // create queue to's directories
	opRmQueue                       // move queue from's tree to the trash (id is the record's lsn)
	opPlace                         // link a staged body from DIR/staged at to (staged.go)
)

// fileOp is one change to the tree, derived from a committed record.
type fileOp struct {
	kind     fileOpKind
	id       uint64
	from, to string
	body     *pendingBody
}

// pendingRecord is a committed record whose file operations are not done.
type pendingRecord struct {
	end int64 // logical position of the record's end in the journal
	ops []fileOp
}

// pendingBody is the body of an insert until its file is written. It
// shares the bytes of the journal frame.
type pendingBody struct {
	data []byte
}

// isMessageOp reports whether op.id is a message's ID (opRmQueue's is an lsn).
func isMessageOp(k fileOpKind) bool {
	return k == opWrite || k == opRename || k == opRemove || k == opPlace
}

// runFileOps does the file operations of every durable pending record, in
// journal order, unless someone else already did them up to pos. A failed
// operation fails the store; the operations after it stay undone (the
// journal still has them for the next Open). One that failed for lack of
// space stalls them instead: they are tried again later (Close's checkpoint).
//
// It stays whole: frozen format-1 code (see the package comment).
func (s *Store) runFileOps(pos int64) {
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	if s.applied >= pos {
		return
	}
	s.mu.Lock()
	if s.failErr != nil {
		// After a failure the tree is left as it is for the next Open to repair.
		s.mu.Unlock()
		return
	}
	durable := s.synced.Load()
	n := 0
	for n < len(s.pending) && s.pending[n].end <= durable {
		n++
	}
	recs := s.pending[:n:n]
	if n == len(s.pending) {
		s.pending = nil
	} else {
		s.pending = append([]pendingRecord(nil), s.pending[n:]...)
	}
	s.mu.Unlock()

	var err error
	var stalled []pendingRecord // on a full disk: what is left, in order
	done := make([]*fileOp, 0, n)
	for i := range recs {
		for j := range recs[i].ops {
			op := &recs[i].ops[j]
			if err = s.doFileOp(op); err != nil {
				if isNoSpace(err) {
					stalled = append([]pendingRecord{{end: recs[i].end, ops: recs[i].ops[j:]}}, recs[i+1:]...)
				}
				break
			}
			if op.kind == opPlace {
				s.placed = append(s.placed, placedBody{path: op.from, end: recs[i].end})
			}
			done = append(done, op)
		}
		if err != nil {
			break
		}
	}

	s.mu.Lock()
	for _, op := range done {
		if !isMessageOp(op.kind) {
			continue // a queue's: its id is an lsn, or 0, not a message's
		}
		if s.busy[op.id]--; s.busy[op.id] <= 0 {
			delete(s.busy, op.id)
		}
		if op.kind == opWrite && s.unwritten[op.id] == op.body {
			delete(s.unwritten, op.id)
		}
	}
	switch {
	case stalled != nil:
		// The disk is full: not a failure. The journal holds the bodies
		// and the index is right; the operations wait, in order, for
		// Close's checkpoint to retry them.
		s.pending = append(stalled, s.pending...)
		if !s.stalled {
			s.stalled = true
			s.log.Warn("disk full: body files wait in the journal until there is room", logErr, err)
		}
	case err != nil:
		s.failLocked(err)
	default:
		if s.stalled {
			s.stalled = false
			s.log.Info("disk has room again: waiting body files written")
		}
		s.applied = max(s.applied, durable)
	}
	close(s.progress)
	s.progress = make(chan struct{})
	s.mu.Unlock()
}

func (s *Store) doFileOp(op *fileOp) error {
	switch op.kind {
	case opWrite:
		return s.writeBody(op.to, op.id, op.body.data)
	case opRename:
		s.dirty.file(op.to)
		s.dirty.dir(filepath.Dir(op.from))
		err := renameMkdir(op.from, op.to)
		if errors.Is(err, os.ErrNotExist) {
			s.log.Warn("body file to move is missing", logID, op.id, logPath, op.from)
			return nil
		}
		if err == nil {
			s.dirty.moved(op.from, op.to, op.id)
		}
		return err
	case opPlace:
		// The file is synced already: only the target directory's entry
		// is for the checkpoint to sync. The staged name stays until a
		// snapshot holds the record (staged.go), as a journal keeps a
		// body, so the message counts as written now (freshAfter).
		// runFileOps notes it in s.placed.
		s.dirty.dir(filepath.Dir(op.to))
		s.dirty.wrote(op.id)
		err := linkMkdir(op.from, op.to)
		if errors.Is(err, os.ErrNotExist) {
			// Only a hand in DIR/staged gets here: the body is gone.
			s.log.Error("staged body to place is missing", logID, op.id, logPath, op.from)
			return nil
		}
		return err
	case opRemove:
		s.dirty.dir(filepath.Dir(op.from))
		s.dirty.removed(op.from)
		err := os.Remove(op.from)
		if errors.Is(err, os.ErrNotExist) {
			s.log.Warn("body file to remove is missing", logID, op.id, logPath, op.from)
			return nil
		}
		return err
	case opMkQueue:
		s.dirty.dir(s.qdir, filepath.Join(s.qdir, op.to))
		return s.mkQueueDirs(op.to)
	case opRmQueue:
		s.dirty.dir(s.qdir, filepath.Join(s.dir, trashDir))
		return s.trashQueue(op.from, op.id)
	}
	return fmt.Errorf("file op %d: %w", op.kind, errBadOp)
}

// renameMkdir renames, creating the target's directory if it is missing.
func renameMkdir(from, to string) error {
	if err := mkdirRetry(unix.Rename, from, to); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

// mkdirRetry calls op(from, to) and, if it fails with ENOENT while from
// exists (the target's directory is missing), creates that directory and
// calls it again.
func mkdirRetry(op func(from, to string) error, from, to string) error {
	err := op(from, to)
	if err == unix.ENOENT {
		if _, serr := os.Lstat(from); serr == nil {
			if err = os.MkdirAll(filepath.Dir(to), 0o700); err == nil {
				err = op(from, to)
			}
		}
	}
	return err
}

// linkMkdir links a second name to a file, creating the target's
// directory if it is missing. A file already at to (which no message
// has: the index said the name was free, and the operations before this
// one are done) is replaced, through a temp name and a rename.
func linkMkdir(from, to string) error {
	err := mkdirRetry(unix.Link, from, to)
	if err == unix.EEXIST {
		tmp := filepath.Dir(to) + "/" + tempPrefix + "p" + filepath.Base(from)
		_ = unix.Unlink(tmp)
		if err = unix.Link(from, tmp); err == nil {
			if err = unix.Rename(tmp, to); err != nil {
				_ = unix.Unlink(tmp)
			}
		}
	}
	if err != nil {
		return &os.LinkError{Op: "link", Old: from, New: to, Err: err}
	}
	return nil
}

// writeBody writes a body file: a temp file in the same directory, the
// message ID as an xattr (so that a repair can tell whose a stray file
// is), then a rename, so the name never shows a partial body. No fsync:
// the journal holds the body until a checkpoint syncs the file system.
func (s *Store) writeBody(path string, id uint64, body []byte) error {
	s.dirty.file(path)
	s.dirty.wrote(id)
	if sp, ok := s.spares.Take(); ok {
		// The rename's old name goes with the next checkpoint's sync
		// of spare/K, so that no power cut after it leaves a second,
		// uncounted name of the body there (on a disk without a
		// journal the two directories are written back in any order).
		s.dirty.dir(sp.Dir)
		err := s.writeWithID(sp.FD, id, body)
		if cerr := unix.Close(sp.FD); err == nil {
			err = cerr
		}
		if err == nil {
			err = renameMkdir(sp.Path, path)
		}
		if err == nil {
			return nil
		}
		unix.Unlink(sp.Path)
		if isNoSpace(err) {
			return fmt.Errorf("write body of message %d: %w", id, &os.PathError{Op: "write", Path: path, Err: err})
		}
		// Anything else (a spare removed by hand, a rename refused
		// between the two directories) is the pool's problem, not the
		// message's: create the file in place, as without a pool.
		s.spares.Failed(err)
	}
	dir := filepath.Dir(path)
	tmp := dir + "/" + tempPrefix + "w" + strconv.FormatUint(id, 10)
	fd, err := unix.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err == unix.ENOENT {
		if err = os.MkdirAll(dir, 0o700); err == nil {
			fd, err = unix.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
		}
	}
	if err != nil {
		return fmt.Errorf("write body of message %d: %w", id, &os.PathError{Op: "open", Path: tmp, Err: err})
	}
	err = s.writeWithID(fd, id, body)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Rename(tmp, path)
	}
	if err != nil {
		unix.Unlink(tmp)
		return fmt.Errorf("write body of message %d: %w", id, &os.PathError{Op: "write", Path: path, Err: err})
	}
	return nil
}

// writeWithID writes body to fd and tags the file with message id's ID
// xattr (so that a repair can tell whose a file is), unless the file
// system refuses user xattrs, which is said once and remembered.
func (s *Store) writeWithID(fd int, id uint64, body []byte) error {
	if err := writeAll(fd, body); err != nil || s.noXattr.Load() {
		return err
	}
	err := unix.Fsetxattr(fd, idXattr, strconv.AppendUint(nil, id, 10), 0)
	if err == unix.ENOTSUP || err == unix.EOPNOTSUPP {
		s.noXattr.Store(true)
		s.log.Warn("the file system refuses user xattrs; repairs after a crash will know less", logErr, err)
		return nil
	}
	return err
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// readOwner reads the message ID xattr of a body file.
func readOwner(path string) (uint64, bool) {
	var buf [24]byte
	n, err := unix.Lgetxattr(path, idXattr, buf[:])
	if err != nil || n <= 0 {
		return 0, false
	}
	id, err := strconv.ParseUint(string(buf[:n]), 10, 64)
	return id, err == nil
}

// mkQueueDirs creates a queue's directory and its state directories.
func (s *Store) mkQueueDirs(name string) error {
	for _, st := range queuecore.States {
		if err := os.MkdirAll(filepath.Join(s.qdir, name, st.Dir()), 0o700); err != nil {
			return fmt.Errorf("create queue directory: %w", err)
		}
	}
	return nil
}

// trashQueue moves a deleted queue's tree out of queues/ (one rename, so a
// re-created queue of the same name starts empty at once) and removes it
// in the background.
func (s *Store) trashQueue(name string, lsn uint64) error {
	from := filepath.Join(s.qdir, name)
	trash := filepath.Join(s.dir, trashDir)
	if err := os.MkdirAll(trash, 0o700); err != nil {
		return fmt.Errorf("create trash: %w", err)
	}
	to := filepath.Join(trash, name+"."+strconv.FormatUint(lsn, 10))
	if err := os.Rename(from, to); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("move deleted queue to trash: %w", err)
	}
	s.trashWG.Add(1)
	go func() {
		defer s.trashWG.Done()
		if err := os.RemoveAll(to); err != nil {
			s.log.Warn("remove deleted queue", logPath, to, logErr, err)
		}
	}()
	return nil
}

// dirtySet remembers the body files and directories changed since the last
// checkpoint. Bodies are not synced when written (the journal holds them);
// a checkpoint fsyncs exactly these before the snapshot lets the journal
// go. (syncfs(2) would be one call, but it does not reach the file system
// under a FUSE mount, nor is a store's durability worth betting on it.)
//
// The set of files is capped at maxDirtyFiles paths, so that a backlog
// published between two checkpoints does not grow memory with it: past
// the cap only directories are noted, and sync fsyncs every file of them
// (unless syncfs(2) did the work already).
//
// It also remembers where each body file moved since then came from
// (moves: its path now → its path at the last sync). A rename between two
// directories is made durable by two fsyncs, one per directory, and a
// power cut between them can leave the file in neither: the source's
// loss of the name durable, the target's gain of it not (a file system
// that does not journal the rename as one change, as the power-cut test's
// does not). The body of a message published before the last checkpoint
// is in no journal any more, so it would be lost. So sync fsyncs the
// directories targets first (syncOrder), and a moved file whose source
// directory still comes first (a cycle: leases into processing/, nacks out
// of it) is linked at its old path again before any directory is synced,
// and unlinked there only once every one is: at every moment the file has
// a durable name. A cut between leaves an extra name at the old path,
// which the journal (not yet replaced by the snapshot) touched, so Open
// removes it. (Linking every moved file cost a checkpoint of 32,768 moves
// about 0.3 s with file operations stopped.)
type dirtySet struct {
	mu       sync.Mutex
	files    map[string]struct{}
	dirs     map[string]struct{}
	overflow bool              // more than maxDirtyFiles files: every file in dirs is dirty
	moves    map[string]string // path now → path at the last sync

	// A message whose body was written after the last sync began has
	// that body in a journal Open would replay until the next checkpoint
	// ends (the sync runs before the snapshot replaces it), so its moves
	// need no name kept: Open writes it again. Message IDs grow, so that
	// is every ID above freshAfter: the largest ID whose body was written
	// before the last sync began, or the largest ID at Open. Until Open
	// ends it is math.MaxUint64: every move is kept.
	freshAfter uint64
	maxWritten uint64 // largest ID of a body written

	// manyMoves is set once moves holds maxMoves (maxDirtyMoves unless a
	// test sets it), and cleared when a sync takes them: every commit
	// reads it (Store.maybeCheckpointLocked) without taking mu.
	manyMoves atomic.Bool
	maxMoves  int
}

const maxDirtyFiles = 8192

// maxDirtyMoves is the number of moves past which a checkpoint starts
// whatever the journal's size (about 200 bytes of memory a move), so
// that the moves map stays bounded.
const maxDirtyMoves = 32768

// moved notes a rename of message id's body file from one path to another.
func (d *dirtySet) moved(from, to string, id uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	origin, ok := d.moves[from]
	if ok {
		delete(d.moves, from)
	} else {
		if id > d.freshAfter {
			return // its body is in a journal Open replays
		}
		origin = from
	}
	if d.moves == nil {
		d.moves = map[string]string{}
	}
	if origin != to {
		d.moves[to] = origin
		if len(d.moves) >= d.maxMoves {
			d.manyMoves.Store(true)
		}
	}
}

// wrote notes the body of message id written to its file.
func (d *dirtySet) wrote(id uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.maxWritten = max(d.maxWritten, id)
}

// opened ends the keeping of every move: the IDs up to maxID (every
// message at Open) have their bodies in files only.
func (d *dirtySet) opened(maxID uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.freshAfter = max(maxID, d.maxWritten)
}

// removed notes the removal of a body file: a deleted message's file
// needs no name kept.
func (d *dirtySet) removed(path string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.moves, path)
}

// file notes a body file written or moved to path, and its directory.
func (d *dirtySet) file(path string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.files == nil {
		d.files, d.dirs = map[string]struct{}{}, map[string]struct{}{}
	}
	if !d.overflow {
		d.files[path] = struct{}{}
		if len(d.files) > maxDirtyFiles {
			d.overflow = true
			clear(d.files)
		}
	}
	d.dirs[filepath.Dir(path)] = struct{}{}
}

// dir notes directories whose entries changed.
func (d *dirtySet) dir(dirs ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.files == nil {
		d.files, d.dirs = map[string]struct{}{}, map[string]struct{}{}
	}
	for _, x := range dirs {
		d.dirs[x] = struct{}{}
	}
}

// sync fsyncs every file, then every directory, noted since the last
// call. Paths that are gone were moved or removed later, and their new
// places are noted too. On failure the set is kept for the next try.
// After an overflow, every file of the noted directories is synced,
// unless syncfsOK says a syncfs(2) of the store did it.
//
// The caller holds Store.fileMu: no body file moves while it runs.
//
// It stays whole: frozen format-1 code (see the package comment).
func (d *dirtySet) sync(syncfsOK bool) error {
	d.mu.Lock()
	files, dirs, overflow, moves := d.files, d.dirs, d.overflow, d.moves
	d.files, d.dirs, d.overflow, d.moves = nil, nil, false, nil
	d.manyMoves.Store(false)
	if d.freshAfter != math.MaxUint64 {
		d.freshAfter = max(d.freshAfter, d.maxWritten)
	}
	d.mu.Unlock()
	restore := func() {
		for f := range files {
			d.file(f)
		}
		for x := range dirs {
			d.dir(x)
		}
		d.mu.Lock()
		if overflow {
			d.overflow = true
		}
		if d.moves == nil && len(moves) > 0 {
			d.moves = make(map[string]string, len(moves))
		}
		for now, origin := range moves {
			if _, ok := d.moves[now]; !ok {
				d.moves[now] = origin
			}
		}
		d.manyMoves.Store(len(d.moves) >= d.maxMoves)
		d.mu.Unlock()
	}
	// The directories are synced targets first (syncOrder), so that a
	// move's target is mostly durable before its source; only a move whose
	// source comes first (a cycle: leases into processing/, nacks out of
	// it) needs its file linked at its old path for the time of the sync
	// (see dirtySet). The old path may hold another file by now (a new
	// message under the same name): that file keeps it.
	order := syncOrder(dirs, moves)
	var relinked []string
	for now, origin := range moves {
		if order[filepath.Dir(origin)] > order[filepath.Dir(now)] {
			continue // the target is synced before the source
		}
		err := unix.Link(now, origin)
		switch {
		case err == nil:
			relinked = append(relinked, origin)
		case err == unix.EEXIST || err == unix.ENOENT:
		default:
			for _, p := range relinked {
				_ = unix.Unlink(p)
			}
			restore()
			return fmt.Errorf("link %s at its old path %s: %w", now, origin, err)
		}
	}
	defer func() {
		// Drop the extra names, and make that durable; on an error the
		// next checkpoint or Open does.
		oldDirs := map[string]struct{}{}
		for _, p := range relinked {
			if err := unix.Unlink(p); err == nil {
				oldDirs[filepath.Dir(p)] = struct{}{}
			}
		}
		for x := range oldDirs {
			if err := fsyncPath(x); err != nil {
				d.dir(x)
			}
		}
	}()
	if overflow && !syncfsOK {
		for x := range dirs {
			if err := fsyncFilesIn(x); err != nil {
				restore()
				return err
			}
		}
	}
	for f := range files {
		if err := fsyncPath(f); err != nil {
			restore()
			return err
		}
	}
	byOrder := make([]string, 0, len(dirs))
	for x := range dirs {
		byOrder = append(byOrder, x)
	}
	slices.SortFunc(byOrder, func(a, b string) int { return order[a] - order[b] })
	for _, x := range byOrder {
		if err := fsyncPath(x); err != nil {
			restore()
			return err
		}
	}
	return nil
}

// syncOrder numbers the directories to sync so that the targets of the
// moves come before their sources where it can: sinks first (directories
// no file moved out of to another one still unnumbered), and in a cycle
// any one of it. A directory of a move that is not in dirs gets a number
// too.
func syncOrder(dirs map[string]struct{}, moves map[string]string) map[string]int {
	out := map[string]map[string]struct{}{} // source → targets
	all := map[string]struct{}{}
	for x := range dirs {
		all[x] = struct{}{}
	}
	for now, origin := range moves {
		src, dst := filepath.Dir(origin), filepath.Dir(now)
		all[src], all[dst] = struct{}{}, struct{}{}
		if src == dst {
			continue
		}
		if out[src] == nil {
			out[src] = map[string]struct{}{}
		}
		out[src][dst] = struct{}{}
	}
	order := make(map[string]int, len(all))
	rest := make([]string, 0, len(all))
	for x := range all {
		rest = append(rest, x)
	}
	slices.Sort(rest) // a stable choice in a cycle
	for len(rest) > 0 {
		picked := -1
		for i, x := range rest {
			sink := true
			for dst := range out[x] {
				if _, done := order[dst]; !done {
					sink = false
					break
				}
			}
			if sink {
				picked = i
				break
			}
		}
		if picked < 0 {
			picked = 0 // a cycle: break it anywhere
		}
		order[rest[picked]] = len(order)
		rest = slices.Delete(rest, picked, picked+1)
	}
	return order
}

func fsyncPath(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s to fsync: %w", p, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("fsync %s: %w", p, err)
	}
	return nil
}

// fsyncFilesIn fsyncs every file of dir, reading it a chunk at a time.
func fsyncFilesIn(dir string) error {
	_, err := readChunks(dir, func(names []string) error {
		for _, n := range names {
			if err := fsyncPath(dir + "/" + n); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EISDIR) {
				return err
			}
		}
		return nil
	})
	return err
}
