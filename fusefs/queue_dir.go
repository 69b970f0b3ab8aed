package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"yirangmq/queuecore"
)

// queueNode is QUEUE/: the five state directories and the pseudo-files.
type queueNode struct {
	fs.Inode
	fsys  *FS
	queue string
}

var _ = (fs.NodeGetattrer)((*queueNode)(nil))

func (q *queueNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	info, err := q.fsys.core.QueueInfo(q.queue)
	if err != nil {
		return errnoOf(err)
	}
	fillDir(&out.Attr, q.fsys.queueIno(q.queue, kQueueDir), info.UID, info.GID, info.Mode, info.CreatedAt)
	return 0
}

var _ = (fs.NodeSetattrer)((*queueNode)(nil))

// Setattr carries chmod and chown of a queue directory; they persist and
// its state directories follow.
func (q *queueNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	info, err := q.fsys.core.QueueInfo(q.queue)
	if err != nil {
		return errnoOf(err)
	}
	uid, gid, mode := info.UID, info.GID, info.Mode
	if v, ok := in.GetUID(); ok {
		uid = v
	}
	if v, ok := in.GetGID(); ok {
		gid = v
	}
	if v, ok := in.GetMode(); ok {
		mode = v & 0o7777
	}
	if _, ok := in.GetSize(); ok {
		return syscall.EISDIR
	}
	if uid != info.UID || gid != info.GID || mode != info.Mode {
		if err := q.fsys.core.SetQueueOwner(ctx, q.queue, uid, gid, mode); err != nil {
			return errnoOf(err)
		}
		q.fsys.invalidateQueueAttrs(q.queue)
	}
	return q.Getattr(ctx, fh, out)
}

var _ = (fs.NodeLookuper)((*queueNode)(nil))

func (q *queueNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if nameTooLong(name) {
		return nil, syscall.ENAMETOOLONG // see names.go
	}
	info, err := q.fsys.core.QueueInfo(q.queue)
	if err != nil {
		return nil, errnoOf(err)
	}
	if s, ok := queuecore.StateFromDir(name); ok {
		ino := q.fsys.queueIno(q.queue, uint32(s))
		fillDir(&out.Attr, ino, info.UID, info.GID, info.Mode, info.CreatedAt)
		return q.NewInode(ctx, &stateDir{fsys: q.fsys, queue: q.queue, state: s}, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino}), 0
	}
	var node fs.InodeEmbedder
	var k uint32
	switch name {
	case ".stats":
		node, k = &queueStatsNode{fsys: q.fsys, queue: q.queue}, kStats
	case ".policy":
		node, k = &policyNode{fsys: q.fsys, queue: q.queue}, kPolicy
	case ".next":
		node, k = &nextNode{fsys: q.fsys, queue: q.queue}, kNext
	default:
		return nil, syscall.ENOENT
	}
	ino := q.fsys.queueIno(q.queue, k)
	fillPseudo(&out.Attr, ino, info.UID, info.GID, k == kPolicy)
	return q.NewInode(ctx, node, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino}), 0
}

var _ = (fs.NodeReaddirer)((*queueNode)(nil))

// Readdir lists the state directories, archive last (so that `rm -r QUEUE`
// empties archive/ after its acks have landed there), then .stats and
// .policy; .next is found by exact name only.
func (q *queueNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	entries := dots(q.fsys.queueIno(q.queue, kQueueDir), fuse.FUSE_ROOT_ID)
	for _, s := range queuecore.States {
		entries = append(entries, fuse.DirEntry{Name: s.Dir(), Mode: syscall.S_IFDIR, Ino: q.fsys.queueIno(q.queue, uint32(s))})
	}
	entries = append(entries,
		fuse.DirEntry{Name: ".stats", Mode: syscall.S_IFREG, Ino: q.fsys.queueIno(q.queue, kStats)},
		fuse.DirEntry{Name: ".policy", Mode: syscall.S_IFREG, Ino: q.fsys.queueIno(q.queue, kPolicy)})
	return fs.NewListDirStream(entries), 0
}

var _ = (fs.NodeRmdirer)((*queueNode)(nil))

// Rmdir of a state directory: state directories are permanent, so removing
// an empty one succeeds and changes nothing (this is what lets `rm -r
// QUEUE` work); a non-empty one is ENOTEMPTY.
func (q *queueNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	s, ok := queuecore.StateFromDir(name)
	if !ok {
		return syscall.ENOENT
	}
	empty := true
	err := q.fsys.core.List(ctx, q.queue, s, func(queuecore.Message) bool {
		empty = false
		return false
	})
	if err != nil {
		return errnoOf(err)
	}
	if !empty {
		return syscall.ENOTEMPTY
	}
	return 0
}

var _ = (fs.NodeUnlinker)((*queueNode)(nil))

// Unlink of .stats or .policy does nothing and succeeds, so that `rm -r
// QUEUE` can go through; they cannot really be removed.
func (q *queueNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if name == ".stats" || name == ".policy" {
		return 0
	}
	return syscall.ENOENT
}

var _ = (fs.NodeCreater)((*queueNode)(nil))

func (q *queueNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, q.fsys.refuse(refusal{msg: "create refused: messages are created in inbox/", queue: q.queue, name: name, uid: callerUID(ctx), errno: syscall.EPERM})
}

var _ = (fs.NodeMkdirer)((*queueNode)(nil))

func (q *queueNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

var _ = (fs.NodeRenamer)((*queueNode)(nil))

func (q *queueNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EPERM
}

var _ = (fs.NodeSymlinker)((*queueNode)(nil))

func (q *queueNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

var _ = (fs.NodeMknoder)((*queueNode)(nil))

func (q *queueNode) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// invalidateQueueAttrs tells the kernel that a queue directory's state
// directories changed owner or mode with it.
//
// It runs inside the queue directory's Setattr, before chmod/chown
// returns: from a goroutine, `chmod 0777 Q && ls Q/inbox` could still be
// refused on the state directory's old mode for a moment (default
// permissions are checked on the kernel's cached attributes). An attribute
// invalidation (offset < 0) takes no inode lock in the kernel, so sending
// it for other inodes from this handler is safe. The queue directory's own
// attributes need no notification: the SETATTR reply carries them.
func (f *FS) invalidateQueueAttrs(queue string) {
	qdir := f.root.GetChild(queue)
	if qdir == nil {
		return
	}
	for _, s := range queuecore.States {
		if d := qdir.GetChild(s.Dir()); d != nil {
			d.NotifyContent(-1, 0) // attributes only
		}
	}
}
