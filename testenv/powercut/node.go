package powercut

import (
	"context"
	"maps"
	"slices"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// node is the FUSE face of one inode of the model. It keeps no state of
// its own: every operation takes the model's lock and works on the
// current tree. Files have no handles: reads and writes go to the inode.
type node struct {
	fs.Inode
	m  *model
	in *inode
}

func (n *node) child(ctx context.Context, c *inode, out *fuse.EntryOut) *fs.Inode {
	fillAttr(c, &out.Attr)
	return n.NewInode(ctx, &node{m: n.m, in: c}, fs.StableAttr{Mode: c.mode & syscall.S_IFMT, Ino: c.ino})
}

func fillAttr(in *inode, a *fuse.Attr) {
	a.Ino = in.ino
	a.Mode = in.mode
	a.Size = uint64(len(in.data))
	a.Blocks = (a.Size + 511) / 512
	a.Blksize = 4096
	a.Nlink = uint32(max(in.nlink, 1))
	if in.isDir() {
		a.Size = 4096
		a.Nlink = 2
		for _, c := range in.entries {
			if c.isDir() {
				a.Nlink++
			}
		}
	}
	a.SetTimes(nil, &in.mtime, &in.mtime)
	a.Owner = fuse.Owner{Uid: uint32(syscall.Getuid()), Gid: uint32(syscall.Getgid())}
}

var _ = (fs.NodeLookuper)((*node)(nil))

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	c, errno := n.m.lookup(n.in, name)
	if errno != 0 {
		return nil, errno
	}
	return n.child(ctx, c, out), 0
}

var _ = (fs.NodeGetattrer)((*node)(nil))

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	fillAttr(n.in, &out.Attr)
	return 0
}

var _ = (fs.NodeSetattrer)((*node)(nil))

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	if sz, ok := in.GetSize(); ok {
		if n.in.isDir() {
			return syscall.EISDIR
		}
		n.m.truncate(n.in, int64(sz))
	}
	if mode, ok := in.GetMode(); ok {
		n.in.mode = n.in.mode&syscall.S_IFMT | mode&0o7777
		n.in.dataDirty = true
	}
	if mt, ok := in.GetMTime(); ok {
		n.in.mtime = mt
	}
	fillAttr(n.in, &out.Attr)
	return 0
}

var _ = (fs.NodeOpener)((*node)(nil))

// Open keeps no handle. No FOPEN_DIRECT_IO: SQLite maps its -shm file
// shared, which needs the page cache.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, 0, 0
}

var _ = (fs.NodeCreater)((*node)(nil))

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	c, errno := n.m.create(n.in, name, syscall.S_IFREG|mode&0o7777)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return n.child(ctx, c, out), nil, 0, 0
}

var _ = (fs.NodeMkdirer)((*node)(nil))

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	c, errno := n.m.create(n.in, name, syscall.S_IFDIR|mode&0o7777)
	if errno != 0 {
		return nil, errno
	}
	return n.child(ctx, c, out), 0
}

var _ = (fs.NodeLinker)((*node)(nil))

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, ok := target.(*node)
	if !ok || t.in.isDir() {
		return nil, syscall.EPERM
	}
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	if _, ok := n.in.entries[name]; ok {
		return nil, syscall.EEXIST
	}
	n.m.link(n.in, name, t.in)
	return n.child(ctx, t.in, out), 0
}

var _ = (fs.NodeUnlinker)((*node)(nil))

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	return n.m.remove(n.in, name, false)
}

var _ = (fs.NodeRmdirer)((*node)(nil))

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	return n.m.remove(n.in, name, true)
}

var _ = (fs.NodeRenamer)((*node)(nil))

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	to, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	return n.m.rename(n.in, name, to.in, newName, flags)
}

var _ = (fs.NodeReaddirer)((*node)(nil))

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	var list []fuse.DirEntry
	for _, name := range slices.Sorted(maps.Keys(n.in.entries)) {
		c := n.in.entries[name]
		list = append(list, fuse.DirEntry{Name: name, Mode: c.mode & syscall.S_IFMT, Ino: c.ino})
	}
	return fs.NewListDirStream(list), 0
}

var _ = (fs.NodeReader)((*node)(nil))

func (n *node) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	if off >= int64(len(n.in.data)) {
		return fuse.ReadResultData(nil), 0
	}
	k := copy(dest, n.in.data[off:])
	return fuse.ReadResultData(dest[:k]), 0
}

var _ = (fs.NodeWriter)((*node)(nil))

func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	n.m.write(n.in, data, off)
	return uint32(len(data)), 0
}

var _ = (fs.NodeAllocater)((*node)(nil))

func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	const keepSize, punchHole = 1, 2 // FALLOC_FL_*
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	end := int64(off + size)
	switch {
	case mode&punchHole != 0:
		if e := min(end, int64(len(n.in.data))); int64(off) < e {
			clear(n.in.data[off:e])
			n.in.dataDirty = true
		}
	case mode&keepSize != 0:
	case end > int64(len(n.in.data)):
		n.m.truncate(n.in, end)
	}
	return 0
}

var _ = (fs.NodeFsyncer)((*node)(nil))

// Fsync serves FSYNC and FSYNCDIR; bit 0 of flags is fdatasync.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	n.m.fsync(n.in, flags&1 != 0)
	return 0
}

var _ = (fs.NodeFlusher)((*node)(nil))

// Flush (close(2)) makes nothing durable.
func (n *node) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno { return 0 }

var _ = (fs.NodeGetxattrer)((*node)(nil))

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	v, ok := n.in.xattr[attr]
	if !ok {
		return 0, syscall.ENODATA
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

var _ = (fs.NodeSetxattrer)((*node)(nil))

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	const xattrCreate, xattrReplace = 1, 2
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	_, ok := n.in.xattr[attr]
	switch {
	case flags&xattrCreate != 0 && ok:
		return syscall.EEXIST
	case flags&xattrReplace != 0 && !ok:
		return syscall.ENODATA
	}
	if n.in.xattr == nil {
		n.in.xattr = map[string][]byte{}
	}
	n.in.xattr[attr] = slices.Clone(data)
	n.in.dataDirty = true
	return 0
}

var _ = (fs.NodeRemovexattrer)((*node)(nil))

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	if _, ok := n.in.xattr[attr]; !ok {
		return syscall.ENODATA
	}
	delete(n.in.xattr, attr)
	n.in.dataDirty = true
	return 0
}

var _ = (fs.NodeListxattrer)((*node)(nil))

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	var list []byte
	for _, k := range slices.Sorted(maps.Keys(n.in.xattr)) {
		list = append(append(list, k...), 0)
	}
	if len(dest) < len(list) {
		return uint32(len(list)), syscall.ERANGE
	}
	return uint32(copy(dest, list)), 0
}

var _ = (fs.NodeStatfser)((*node)(nil))

// Statfs reports a roomy file system, so that nobody refuses to write.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	out.Bsize, out.Frsize, out.NameLen = 4096, 4096, 255
	out.Blocks, out.Bfree, out.Bavail = 1<<24, 1<<23, 1<<23
	out.Files, out.Ffree = 1<<20, 1<<19
	return 0
}
