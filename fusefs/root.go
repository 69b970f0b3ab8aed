package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// rootNode is the mount's top directory: one directory per queue, plus
// .stats and .metrics.
type rootNode struct {
	fs.Inode
	fsys *FS
}

var _ = (fs.NodeGetattrer)((*rootNode)(nil))

func (r *rootNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	fillDir(&out.Attr, inoRoot, r.fsys.uid, r.fsys.gid, 0o755, r.fsys.startTime())
	return 0
}

var _ = (fs.NodeLookuper)((*rootNode)(nil))

func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if nameTooLong(name) {
		return nil, syscall.ENAMETOOLONG // see names.go
	}
	switch name {
	case ".stats":
		fillPseudo(&out.Attr, inoRootStats, r.fsys.uid, r.fsys.gid, false)
		return r.NewInode(ctx, &rootStatsNode{fsys: r.fsys}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: inoRootStats}), 0
	case ".metrics":
		fillPseudo(&out.Attr, inoMetrics, r.fsys.uid, r.fsys.gid, false)
		return r.NewInode(ctx, &metricsNode{fsys: r.fsys}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: inoMetrics}), 0
	}
	if _, err := r.fsys.core.QueueInfo(name); err != nil {
		return nil, errnoOf(err)
	}
	return r.queueInode(ctx, name, out)
}

func (r *rootNode) queueInode(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	q := &queueNode{fsys: r.fsys, queue: name}
	var a fuse.AttrOut
	if errno := q.Getattr(ctx, nil, &a); errno != 0 {
		return nil, errno
	}
	out.Attr = a.Attr
	return r.NewInode(ctx, q, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: r.fsys.queueIno(name, kQueueDir)}), 0
}

var _ = (fs.NodeReaddirer)((*rootNode)(nil))

func (r *rootNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	entries := append(dots(fuse.FUSE_ROOT_ID, fuse.FUSE_ROOT_ID), []fuse.DirEntry{
		{Name: ".stats", Mode: syscall.S_IFREG, Ino: inoRootStats},
		{Name: ".metrics", Mode: syscall.S_IFREG, Ino: inoMetrics},
	}...)
	for _, q := range r.fsys.core.QueueNames() {
		entries = append(entries, fuse.DirEntry{Name: q, Mode: syscall.S_IFDIR, Ino: r.fsys.queueIno(q, kQueueDir)})
	}
	return fs.NewListDirStream(entries), 0
}

var _ = (fs.NodeMkdirer)((*rootNode)(nil))

// Mkdir creates a queue.
func (r *rootNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	uid, gid, _ := caller(ctx)
	if err := r.fsys.core.CreateQueue(ctx, name, uid, gid, mode&0o7777); err != nil {
		return nil, r.fsys.refuse(refusal{msg: "mkdir refused", name: name, uid: uid, errno: errnoOf(err), err: err})
	}
	return r.queueInode(ctx, name, out)
}

var _ = (fs.NodeRmdirer)((*rootNode)(nil))

// Rmdir deletes an empty queue (ENOTEMPTY while it holds messages).
func (r *rootNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if err := r.fsys.core.DeleteQueue(ctx, name, false); err != nil {
		return errnoOf(err)
	}
	return 0
}

var _ = (fs.NodeCreater)((*rootNode)(nil))

func (r *rootNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, r.fsys.refuse(refusal{msg: "create refused: only queue directories live at the top of a mount", name: name, uid: callerUID(ctx), errno: syscall.EPERM})
}

var _ = (fs.NodeUnlinker)((*rootNode)(nil))

func (r *rootNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if name == ".stats" || name == ".metrics" {
		return syscall.EPERM
	}
	return syscall.ENOENT
}

var _ = (fs.NodeRenamer)((*rootNode)(nil))

func (r *rootNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EPERM // queues cannot be renamed
}

var _ = (fs.NodeSymlinker)((*rootNode)(nil))

func (r *rootNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

var _ = (fs.NodeMknoder)((*rootNode)(nil))

func (r *rootNode) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

var _ = (fs.NodeStatfser)((*rootNode)(nil))

func (r *rootNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	out.Bsize = 4096
	out.NameLen = 255
	out.Frsize = 4096
	return 0
}
