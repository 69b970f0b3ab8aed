// Package spare keeps empty files made ahead, which the fs store writes a
// new message's body into and renames into place instead of creating a
// file of its own. Both the fs store (backends/fs) and the format-1
// reader it converts old stores with (backends/fs/internal/format1) use
// it: the same pool, made and emptied the same way, so that DIR/spare
// means one thing whichever of them opened the store last. This carries
// no guarantee: it earns its place by speed (the A/B of
// docs/performance-history.md, "Spare files made ahead").
//
// Every message's body is a new file, so every publish allocates an inode
// and every ack frees one. On ext4 without a journal (common on devices,
// and on the machines the benchmarks ran on) the kernel does not reuse an
// inode freed in the last minute, or the last five while its inode table
// block is not written back yet, and it looks at every such free inode,
// one by one, before it takes a fresh one (ext4's find_inode_bit and
// recently_deleted). After a few thousand messages a second that scan
// costs a create much of a publish's CPU, which a publish at close(2)
// waited for (docs/performance-history.md has the figures). A goroutine
// now pays it ahead, on another CPU or while the daemon waits for work,
// and keeps Count open files ready; a publish takes one, or creates its
// file as before when none is left (a burst). The CPU is the same; the
// publish does not wait for it.
//
// The CPU of that scan grows with the number of inodes freed lately in
// the block group a create looks in, which for a file is its directory's.
// So the spares are spread over dirs directories, DIR/spare/K, in
// turn (makeSubs), and DIR/spare is marked for the kernel to place
// its subdirectories in block groups apart (ext4's FS_TOPDIR_FL, chattr
// +T; best effort, other file systems ignore or refuse it). A body keeps
// its inode when it is renamed into a queue, so the inodes its ack frees
// are spread the same way, and each create scans about an eighth of them.
//
// A spare is never a file a reader has seen: it is created empty by this
// process and only ever renamed away from DIR/spare/K. DIR/spare/K is
// never synced, so a power cut after the rename of a spare into a queue
// can leave its old name as a second link to the body: what is left there
// at Start is removed, name by name, without opening anything (a body
// whose queue's directory was not synced yet belongs to a publish that
// had not returned).
package spare

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// DirName is the spares' directory inside a store's directory.
const DirName = "spare"

// Count is the pool's size when the store's settings do not name one.
const Count = 16

const (
	dirs = 8 // subdirectories DIR/spare/K, used in turn
	// fsTopdirFL is FS_TOPDIR_FL of linux/fs.h (not in x/sys/unix).
	fsTopdirFL = 0x00020000
)

// File is a created empty file, open for writing.
type File struct {
	Path string
	Dir  string // DIR/spare/K that holds it
	FD   int
}

// Pool is the pool and the goroutine that fills it. A nil *Pool is an
// empty pool: Take finds nothing, Close does nothing.
type Pool struct {
	dir  string
	subs [dirs]string // DIR/spare/K, used in turn
	log  *slog.Logger
	ch   chan File     // the pool; the goroutine blocks sending when it is full
	kick chan struct{} // wakes a goroutine that stopped after an error
	stop chan struct{}
	done chan struct{}
	seq  uint64
	off  atomic.Bool // failed: take hands out nothing
}

// Start empties DIR/spare (what a crash left) and starts filling it.
// n is the pool's size; with n <= 0 there is no pool (a nil *Pool).
func Start(storeDir string, n int, log *slog.Logger) (*Pool, error) {
	dir := filepath.Join(storeDir, DirName)
	if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory (%s); the store leaves it alone", dir, fi.Mode().Type())
	}
	subs, err := clearSpares(dir)
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, nil
	}
	if err := os.Mkdir(dir, 0o700); err == nil {
		_ = backends.SyncDir(storeDir)
	} else if !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create the spare files' directory: %w", err)
	}
	markTopDir(dir) // before its subdirectories are made
	p := &Pool{
		dir:  dir,
		log:  log,
		ch:   make(chan File, n-1), // plus the one the goroutine holds
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	if err := p.makeSubs(subs); err != nil {
		return nil, err
	}
	go p.run()
	return p, nil
}

// makeSubs keeps the subdirectories of DIR/spare that the last run used
// (subs, their names, as clearSpares found them) and makes new ones up to
// dirs. A new one is named by a random
// number: ext4 places a subdirectory of a +T directory by a hash of its
// name, so fixed names would put the spares of every store on the file
// system (and of a store made again) in the same block groups, where the
// others' deletes slow each create down again.
func (p *Pool) makeSubs(subs []string) error {
	n, made := 0, false
	for _, name := range subs {
		if n == dirs {
			_ = unix.Rmdir(p.dir + "/" + name) // one too many, emptied by clearSpares
			continue
		}
		p.subs[n] = p.dir + "/" + name
		n++
	}
	defer func() {
		// A new directory's name is made durable before a body is
		// renamed out of it.
		if made {
			_ = backends.SyncDir(p.dir)
		}
	}()
	for n < dirs {
		sub := p.dir + "/" + strconv.FormatUint(uint64(rand.Uint32()), 10)
		err := os.Mkdir(sub, 0o700)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("create the spare files' directory: %w", err)
		}
		p.subs[n] = sub
		n++
		made = true
	}
	return nil
}

// clearSpares unlinks what a crash left in DIR/spare and in its
// numbered subdirectories (and the spares of a version that kept them in
// DIR/spare itself), name by name: a name left by a power cut may be a
// second link to a message's body, which must stay as it is. Directories
// stay; one not named by a number, or one inside a subdirectory, is made
// by hand and left alone with what it holds. It returns the names of the
// numbered subdirectories, for makeSubs.
func clearSpares(dir string) (subs []string, err error) {
	names, err := dirNames(dir)
	if err != nil {
		return nil, fmt.Errorf("read the spare files' directory: %w", err)
	}
	for _, name := range names {
		p := dir + "/" + name
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("remove a spare file left by the last run: %w", err)
		}
		if !fi.IsDir() {
			if err := unix.Unlink(p); err != nil && err != unix.ENOENT {
				return nil, fmt.Errorf("remove a spare file left by the last run: %w", &os.PathError{Op: "unlink", Path: p, Err: err})
			}
			continue
		}
		if _, err := strconv.ParseUint(name, 10, 32); err != nil {
			continue // made by hand: left alone
		}
		inner, err := dirNames(p)
		if err != nil {
			return nil, fmt.Errorf("read the spare files' directory: %w", err)
		}
		for _, in := range inner {
			if err := unix.Unlink(p + "/" + in); err != nil && err != unix.ENOENT && err != unix.EISDIR {
				return nil, fmt.Errorf("remove a spare file left by the last run: %w", &os.PathError{Op: "unlink", Path: p + "/" + in, Err: err})
			}
		}
		subs = append(subs, name)
	}
	return subs, nil
}

// dirNames lists a directory, sorted; a missing one is empty.
func dirNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, err
}

// markTopDir asks the file system to place dir's new subdirectories in
// block groups apart (FS_TOPDIR_FL, chattr +T; ext2/3/4). Best effort:
// elsewhere the flag is refused or means nothing, and the spares work
// as well, only not spread.
func markTopDir(dir string) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil || flags&fsTopdirFL != 0 {
		return
	}
	_ = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsTopdirFL))
}

// Failed turns the pool off for the rest of the run after a spare could
// not become a body for a reason other than space (a rename between
// spare/ and a queue's directory refused, EXDEV, by a per-directory quota
// or encryption; a spare removed by hand): publishes create their own
// files from then on. Said once.
func (p *Pool) Failed(err error) {
	if p.off.Swap(true) {
		return
	}
	p.log.Warn("spare body files turned off; publishes create their own", queuecore.LogErr, err)
}

// run creates spares until the pool is full, then waits for room.
func (p *Pool) run() {
	defer close(p.done)
	failed := false
	for {
		f, err := p.create()
		if err != nil {
			// A full disk, or no more inodes: publishes create their
			// own files meanwhile, and the next one to find the pool
			// empty wakes us.
			if !failed {
				p.log.Warn("cannot create spare body files; publishes create their own", queuecore.LogErr, err)
				failed = true
			}
			select {
			case <-p.kick:
				continue
			case <-p.stop:
				return
			}
		}
		failed = false
		select {
		case p.ch <- f:
		case <-p.stop:
			p.Discard(f)
			return
		}
	}
}

func (p *Pool) create() (File, error) {
	remade := false
	for {
		p.seq++
		sub := p.subs[p.seq%dirs]
		path := sub + "/" + strconv.FormatUint(p.seq, 10)
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
		if err == unix.EEXIST {
			continue // not ours: a hand put it there; the next Open removes it
		}
		if err == unix.ENOENT && !remade {
			// Removed by hand: made again, once per spare.
			remade = true
			p.seq--
			if err := os.Mkdir(sub, 0o700); err == nil || errors.Is(err, os.ErrExist) {
				_ = backends.SyncDir(p.dir)
				continue
			}
		}
		if err != nil {
			return File{}, &os.PathError{Op: "create", Path: path, Err: err}
		}
		return File{Path: path, Dir: sub, FD: fd}, nil
	}
}

// Take hands out a spare, if one is ready. The caller writes it, closes
// it and renames it into place, or discards it.
func (p *Pool) Take() (File, bool) {
	if p == nil || p.off.Load() {
		return File{}, false
	}
	select {
	case f := <-p.ch:
		return f, true
	default:
		select {
		case p.kick <- struct{}{}:
		default:
		}
		return File{}, false
	}
}

// Discard removes a spare that will not be used.
func (p *Pool) Discard(f File) {
	unix.Close(f.FD)
	unix.Unlink(f.Path)
}

// Close stops the goroutine and removes the spares left.
func (p *Pool) Close() { p.halt(true) }

// halt stops the goroutine and closes the spares left; remove removes
// them too (a test's kill -9 leaves them).
func (p *Pool) halt(remove bool) {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
	for {
		select {
		case f := <-p.ch:
			unix.Close(f.FD)
			if remove {
				unix.Unlink(f.Path)
			}
		default:
			return
		}
	}
}
