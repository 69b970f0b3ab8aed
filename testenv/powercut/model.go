// Package powercut is a test-only FUSE file system that simulates a power
// cut: everything written since the last durability point lives in a
// volatile layer that Cut drops.
//
// The file system keeps its whole tree in memory (stores under test are
// small), twice: the current tree, which every operation reads and
// changes, and the durable tree, which is what a disk would hold after the
// power went out. Only these move the current state into the durable one:
//
//   - fsync(2) of a regular file: that inode's data, xattrs and mode (not
//     its names: those belong to the directories that hold it);
//   - fdatasync(2) of a regular file: that inode's data only;
//   - fsync(2) or fdatasync(2) of a directory: that directory's entry list
//     (each entry points at an inode; the inode brings its own durable
//     content, empty if it was never synced);
//   - FS.Sync: everything, the effect syncfs(2) or sync(2) would have on a
//     disk file system.
//
// syncfs(2) and sync(2) do not reach a FUSE daemon: the kernel sends
// FUSE_SYNCFS only to virtiofs (fuse_sync_fs returns early unless
// fc->sync_fs, which only virtiofs sets). So a process that relies on
// syncfs(2) on a FUSE mount gets nothing made durable, and so it is here:
// that is what the real kernel does, and TestSyncfsDoesNotReachDaemon
// checks it on the running kernel.
//
// The model is the POSIX minimum, stricter than ext4 or XFS in two ways: a
// directory's entries are durable per directory (a rename between two
// directories is durable in each when that one is synced, so after a cut
// the file can be under both names or neither), and the fsync of one file
// makes nothing else durable (ext4's fsync commits every metadata change
// of the running journal transaction). Options.GlobalFsync relaxes the
// second: every fsync then makes everything durable, roughly a file system
// with one ordered journal, which tells a loss due to syncfs not reaching
// FUSE from a missing fsync.
//
// POSIX record locks and flock(2) are left to the kernel (the mount does
// not ask for FUSE_POSIX_LOCKS), which is right while every user of the
// mount is on this machine. Shared mmap works through the page cache.
package powercut

import (
	"maps"
	"slices"
	"sync"
	"syscall"
	"time"
)

// inode is one file or directory, with its current and durable states.
type inode struct {
	ino   uint64
	mode  uint32 // S_IFREG or S_IFDIR | permission bits
	mtime time.Time
	nlink int // names in the current tree (regular files)

	data    []byte
	xattr   map[string][]byte
	entries map[string]*inode // directories

	durData    []byte
	durXattr   map[string][]byte
	durMode    uint32
	durEntries map[string]*inode

	dataDirty    bool // data, xattrs or mode changed since the last sync
	entriesDirty bool
}

func (in *inode) isDir() bool { return in.mode&syscall.S_IFMT == syscall.S_IFDIR }

// model is the two trees and the counters, under one mutex.
type model struct {
	mu          sync.Mutex
	root        *inode
	nextIno     uint64
	globalFsync bool
	stats       Stats
}

// Stats are the counters of a mounted file system.
type Stats struct {
	Fsyncs     int64 `json:"fsyncs"`     // fsync(2) of regular files
	Fdatasyncs int64 `json:"fdatasyncs"` // fdatasync(2) of regular files
	DirFsyncs  int64 `json:"dirFsyncs"`  // fsync(2) or fdatasync(2) of directories
	Syncs      int64 `json:"syncs"`      // FS.Sync calls
	Cuts       int64 `json:"cuts"`
	// Lost at the cuts so far: files whose content differed from the
	// durable one, their current bytes, directories whose entries did.
	LostFiles int64 `json:"lostFiles"`
	LostBytes int64 `json:"lostBytes"`
	LostDirs  int64 `json:"lostDirs"`

	// Volatile now (filled by FS.Stats): what a cut would drop.
	VolatileFiles int64 `json:"volatileFiles"`
	VolatileBytes int64 `json:"volatileBytes"`
	VolatileDirs  int64 `json:"volatileDirs"`
}

func newModel(globalFsync bool) *model {
	m := &model{nextIno: 1, globalFsync: globalFsync}
	m.root = m.newInode(syscall.S_IFDIR | 0o755)
	return m
}

// newInode makes an inode that nothing names yet; its durable state is
// empty until it is synced.
func (m *model) newInode(mode uint32) *inode {
	m.nextIno++
	// The mode is durable with the first name: it is in the inode that
	// the directory's sync writes.
	in := &inode{ino: m.nextIno, mode: mode, durMode: mode, mtime: time.Now(), dataDirty: true}
	if in.isDir() {
		in.entries = map[string]*inode{}
		in.durEntries = map[string]*inode{}
	}
	return in
}

// Every method below is called with m.mu held.

func (m *model) lookup(dir *inode, name string) (*inode, syscall.Errno) {
	if !dir.isDir() {
		return nil, syscall.ENOTDIR
	}
	c, ok := dir.entries[name]
	if !ok {
		return nil, syscall.ENOENT
	}
	return c, 0
}

func (m *model) link(dir *inode, name string, c *inode) {
	dir.entries[name] = c
	dir.entriesDirty = true
	dir.mtime = time.Now()
	if !c.isDir() {
		c.nlink++
	}
}

func (m *model) unlinkEntry(dir *inode, name string) {
	c := dir.entries[name]
	delete(dir.entries, name)
	dir.entriesDirty = true
	dir.mtime = time.Now()
	if c != nil && !c.isDir() {
		c.nlink--
	}
}

func (m *model) create(dir *inode, name string, mode uint32) (*inode, syscall.Errno) {
	if _, ok := dir.entries[name]; ok {
		return nil, syscall.EEXIST
	}
	c := m.newInode(mode)
	m.link(dir, name, c)
	return c, 0
}

func (m *model) remove(dir *inode, name string, wantDir bool) syscall.Errno {
	c, errno := m.lookup(dir, name)
	if errno != 0 {
		return errno
	}
	switch {
	case wantDir && !c.isDir():
		return syscall.ENOTDIR
	case !wantDir && c.isDir():
		return syscall.EISDIR
	case wantDir && len(c.entries) > 0:
		return syscall.ENOTEMPTY
	}
	m.unlinkEntry(dir, name)
	return 0
}

const (
	renameNoReplace = 1 // RENAME_NOREPLACE
	renameExchange  = 2 // RENAME_EXCHANGE
)

func (m *model) rename(from *inode, name string, to *inode, newName string, flags uint32) syscall.Errno {
	c, errno := m.lookup(from, name)
	if errno != 0 {
		return errno
	}
	if !to.isDir() {
		return syscall.ENOTDIR
	}
	if flags&renameExchange != 0 {
		return syscall.EINVAL
	}
	if old, ok := to.entries[newName]; ok {
		if old == c {
			return 0
		}
		switch {
		case flags&renameNoReplace != 0:
			return syscall.EEXIST
		case old.isDir() && !c.isDir():
			return syscall.EISDIR
		case !old.isDir() && c.isDir():
			return syscall.ENOTDIR
		case old.isDir() && len(old.entries) > 0:
			return syscall.ENOTEMPTY
		}
		m.unlinkEntry(to, newName)
	}
	m.unlinkEntry(from, name)
	m.link(to, newName, c)
	return 0
}

func (m *model) write(in *inode, data []byte, off int64) {
	if end := off + int64(len(data)); end > int64(len(in.data)) {
		in.data = slices.Grow(in.data, int(end)-len(in.data))[:end]
	}
	copy(in.data[off:], data)
	in.dataDirty = true
	in.mtime = time.Now()
}

func (m *model) truncate(in *inode, size int64) {
	if size <= int64(len(in.data)) {
		clear(in.data[size:])
		in.data = in.data[:size]
	} else {
		in.data = slices.Grow(in.data, int(size)-len(in.data))[:size]
	}
	in.dataDirty = true
	in.mtime = time.Now()
}

// fsync makes what the call covers durable, and counts it.
func (m *model) fsync(in *inode, datasync bool) {
	switch {
	case in.isDir():
		m.stats.DirFsyncs++
	case datasync:
		m.stats.Fdatasyncs++
	default:
		m.stats.Fsyncs++
	}
	if m.globalFsync {
		m.syncAll()
		return
	}
	if in.isDir() {
		syncEntries(in)
		return
	}
	in.durData = append(in.durData[:0], in.data...)
	if !datasync {
		in.durXattr = maps.Clone(in.xattr)
		in.durMode = in.mode
	}
	in.dataDirty = false
}

func syncEntries(in *inode) {
	in.durEntries = maps.Clone(in.entries)
	in.durMode = in.mode
	in.entriesDirty = false
}

func syncData(in *inode) {
	in.durData = append(in.durData[:0], in.data...)
	in.durXattr = maps.Clone(in.xattr)
	in.durMode = in.mode
	in.dataDirty = false
}

// syncAll makes the whole current tree durable.
func (m *model) syncAll() {
	walk(m.root, func(in *inode) map[string]*inode { return in.entries }, func(in *inode) {
		if in.isDir() {
			syncEntries(in)
		}
		syncData(in)
	})
}

// cut resets the current tree to the durable one and reports what it
// dropped. An inode the durable tree names twice (a file renamed between
// two directories of which both were synced, or neither) keeps both names;
// a directory keeps the first one in name order, so that the tree stays a
// tree.
func (m *model) cut() {
	m.stats.Cuts++
	walk(m.root, func(in *inode) map[string]*inode { return in.entries }, func(in *inode) {
		if in.dataDirty && !in.isDir() {
			m.stats.LostFiles++
			m.stats.LostBytes += int64(len(in.data))
		}
		if in.entriesDirty {
			m.stats.LostDirs++
		}
	})
	seenDir := map[*inode]bool{m.root: true}
	reset := func(in *inode) {
		if in.isDir() {
			in.entries = map[string]*inode{}
			for _, name := range slices.Sorted(maps.Keys(in.durEntries)) {
				c := in.durEntries[name]
				if c.isDir() {
					if seenDir[c] {
						continue
					}
					seenDir[c] = true
				}
				in.entries[name] = c
			}
			in.durEntries = maps.Clone(in.entries)
		}
		in.data = slices.Clone(in.durData)
		in.xattr = maps.Clone(in.durXattr)
		in.mode = in.durMode
		in.dataDirty, in.entriesDirty = false, false
	}
	visited := map[*inode]bool{}
	var visit func(*inode)
	visit = func(in *inode) {
		if visited[in] {
			return
		}
		visited[in] = true
		reset(in)
		for _, name := range slices.Sorted(maps.Keys(in.entries)) {
			visit(in.entries[name])
		}
	}
	visit(m.root)
	// Link counts of the new current tree.
	walk(m.root, func(in *inode) map[string]*inode { return in.entries }, func(in *inode) { in.nlink = 0 })
	walk(m.root, func(in *inode) map[string]*inode { return in.entries }, func(in *inode) {
		for _, c := range in.entries {
			if !c.isDir() {
				c.nlink++
			}
		}
	})
}

// volatile fills the Volatile counters of st.
func (m *model) volatile(st *Stats) {
	walk(m.root, func(in *inode) map[string]*inode { return in.entries }, func(in *inode) {
		if in.dataDirty && !in.isDir() {
			st.VolatileFiles++
			st.VolatileBytes += int64(len(in.data))
		}
		if in.entriesDirty {
			st.VolatileDirs++
		}
	})
}

// walk calls fn once for every inode reachable from root through the
// entries children returns.
func walk(root *inode, children func(*inode) map[string]*inode, fn func(*inode)) {
	seen := map[*inode]bool{}
	var visit func(*inode)
	visit = func(in *inode) {
		if seen[in] {
			return
		}
		seen[in] = true
		fn(in)
		for _, name := range slices.Sorted(maps.Keys(children(in))) {
			visit(children(in)[name])
		}
	}
	visit(root)
}
