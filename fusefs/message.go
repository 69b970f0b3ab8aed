package fusefs

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"yirangmq/queuecore"
)

// msgNode is a message file: committed (id set, pend nil) or still being
// written or a draft (pend set). One node type for both, so the inode a
// writer created is the same inode that the message is once committed.
type msgNode struct {
	fs.Inode
	fsys  *FS
	queue string
	id    uint64 // reserved at create for files written through the mount
	gen   uint64 // inode generation (placements.go)

	lru lruLinks // place in the pruner's list (memory.go), under FS.lru.mu

	mu   sync.Mutex
	name string
	pend *pending // nil once committed
}

// readHandle serves reads of a committed message; the body never changes.
type readHandle struct{ body []byte }

// current returns the message this node stands for, wherever it is now.
func (n *msgNode) current(ctx context.Context) (queuecore.Message, error) {
	n.mu.Lock()
	name := n.name
	n.mu.Unlock()
	queue, id := n.queue, n.id
	if s, ok := n.fsys.successors.get(id, time.Now()); ok {
		queue, id = s.queue, s.id // a replay or a forward made a new message of it
	}
	for _, archived := range []bool{false, true} {
		m, err := n.fsys.core.Find(ctx, queue, name, archived)
		if err == nil && m.ID == id {
			return m, nil
		}
		if err != nil && !errors.Is(err, queuecore.ErrNotFound) {
			return m, err
		}
	}
	return queuecore.Message{}, queuecore.ErrNotFound
}

// fillAttr sets the attributes of a file being written, or of the message.
func (n *msgNode) fillAttr(ctx context.Context, out *fuse.Attr) syscall.Errno {
	n.mu.Lock()
	if p := n.pend; p != nil {
		out.Ino = msgIno(n.id)
		out.Mode = syscall.S_IFREG | 0o644
		out.Size = uint64(len(p.buf))
		out.Nlink = 1
		out.Uid, out.Gid = p.uid, p.gid
		out.SetTimes(&p.created, &p.created, &p.created)
		out.Blksize = 4096
		out.Blocks = (out.Size + 511) / 512
		n.mu.Unlock()
		return 0
	}
	n.mu.Unlock()
	m, err := n.current(ctx)
	if err != nil {
		return errnoOf(err)
	}
	fillMessage(out, m)
	return 0
}

// fillMessage sets a message's attributes; its times say what its state
// means (SPEC.md §2): commit time in inbox/, lease deadline in processing/,
// due time in delayed/, dead-letter time in dlq/, ack time in archive/.
func fillMessage(out *fuse.Attr, m queuecore.Message) {
	t := m.StateAt
	switch m.State {
	case queuecore.StateReady:
		t = m.PublishedAt
	case queuecore.StateLeased, queuecore.StateDelayed:
		t = m.Deadline
	}
	out.Ino = msgIno(m.ID)
	out.Mode = syscall.S_IFREG | 0o644
	out.Size = uint64(m.Size)
	out.Nlink = 1
	out.Uid, out.Gid = m.UID, m.GID
	out.SetTimes(&t, &t, &t)
	out.Blksize = 4096
	out.Blocks = (out.Size + 511) / 512
}

var _ = (fs.NodeGetattrer)((*msgNode)(nil))

func (n *msgNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	return n.fillAttr(ctx, &out.Attr)
}

var _ = (fs.NodeOpener)((*msgNode)(nil))

// Open of a committed message is read-only: a committed message is
// immutable, so opening it for writing (cp or > onto it, >>) is EPERM.
func (n *msgNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	n.mu.Lock()
	p := n.pend
	name := n.name
	n.mu.Unlock()
	writing := flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
	if p != nil {
		if writing {
			return nil, 0, syscall.EPERM // one writer per file being written: its creator
		}
		n.mu.Lock()
		body := append([]byte(nil), p.buf...)
		n.mu.Unlock()
		return &readHandle{body: body}, fuse.FOPEN_DIRECT_IO, 0
	}
	if writing {
		n.fsys.log.Warn("open for writing refused: committed messages are immutable", "queue", n.queue, "name", name)
		return nil, 0, syscall.EPERM
	}
	m, err := n.current(ctx)
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	body, err := n.fsys.core.Body(ctx, m)
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	return &readHandle{body: body}, fuse.FOPEN_KEEP_CACHE, 0
}

var _ = (fs.NodeReader)((*msgNode)(nil))

func (n *msgNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, ok := fh.(*readHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	if off >= int64(len(h.body)) {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), int64(len(h.body)))
	return fuse.ReadResultData(h.body[off:end]), 0
}

var _ = (fs.NodeSetattrer)((*msgNode)(nil))

// Setattr: touch of a leased message extends its lease (touch -d sets the
// deadline); a file being written may be truncated and have its mode and
// times set (cp -p, rsync); anything else on a committed message is EPERM.
func (n *msgNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	p := n.pend
	if p != nil {
		if size, ok := in.GetSize(); ok {
			if errno := n.resizeLocked(int64(size)); errno != 0 {
				n.mu.Unlock()
				return errno
			}
		}
		n.mu.Unlock()
		return n.fillAttr(ctx, &out.Attr)
	}
	name := n.name
	n.mu.Unlock()
	_, hasSize := in.GetSize()
	_, hasMode := in.GetMode()
	_, hasUID := in.GetUID()
	_, hasGID := in.GetGID()
	mtime, hasMtime := in.GetMTime()
	if hasSize || hasMode || hasUID || hasGID {
		n.fsys.log.Warn("setattr refused: committed messages are immutable", "queue", n.queue, "name", name)
		return syscall.EPERM
	}
	if hasMtime || in.Valid&(fuse.FATTR_MTIME_NOW|fuse.FATTR_ATIME|fuse.FATTR_ATIME_NOW) != 0 {
		m, err := n.current(ctx)
		if err != nil {
			return errnoOf(err)
		}
		if m.State != queuecore.StateLeased {
			return syscall.EPERM // only a lease has a deadline to move
		}
		var deadline time.Time // zero: now + visibility timeout
		if hasMtime && in.Valid&fuse.FATTR_MTIME_NOW == 0 {
			deadline = mtime
		}
		m, err = n.fsys.core.Extend(ctx, n.queue, name, deadline)
		if err != nil {
			return errnoOf(err)
		}
		fillMessage(&out.Attr, m)
		return 0
	}
	return n.fillAttr(ctx, &out.Attr)
}

var _ = (fs.NodeWriter)((*msgNode)(nil))

func (n *msgNode) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if _, ok := fh.(*writeHandle); !ok {
		return 0, syscall.EBADF
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.pend
	if p == nil || p.done {
		return 0, syscall.EPERM // after the commit the message is immutable
	}
	end := off + int64(len(data))
	if end > len64(p.buf) {
		if errno := n.resizeLocked(end); errno != 0 {
			return 0, errno
		}
	}
	copy(p.buf[off:], data)
	if len(data) > 0 {
		p.written = true
	}
	return uint32(len(data)), 0
}

func len64(b []byte) int64 { return int64(len(b)) }

// resizeLocked grows or truncates the buffer of a file being written; past
// the queue's maxMessageBytes it is EFBIG, at write(2) as SPEC.md says.
func (n *msgNode) resizeLocked(size int64) syscall.Errno {
	p := n.pend
	if p.done {
		return syscall.EPERM
	}
	if size > p.limit {
		if !p.tooBig {
			n.fsys.log.Warn("write refused: message larger than the queue's maxMessageBytes",
				"queue", n.queue, "name", n.name, "limit", p.limit)
			p.tooBig = true
		}
		return syscall.EFBIG
	}
	if size <= int64(cap(p.buf)) {
		old := len(p.buf)
		p.buf = p.buf[:size]
		if int(size) > old {
			clear(p.buf[old:])
		}
		return 0
	}
	nb := make([]byte, size, max(size, 2*int64(cap(p.buf))))
	copy(nb, p.buf)
	p.buf = nb
	return 0
}

var _ = (fs.NodeFsyncer)((*msgNode)(nil))

// Fsync before close is allowed and harmless: durability comes with the
// commit at close.
func (n *msgNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno { return 0 }

var _ = (fs.NodeFlusher)((*msgNode)(nil))

// Flush commits when it comes from the process that created the file and
// something was written: then close(2) returns the commit's result.
func (n *msgNode) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno {
	if _, ok := fh.(*writeHandle); !ok {
		return 0
	}
	n.mu.Lock()
	p := n.pend
	// A file refused with EFBIG is settled at its creator's close too, even
	// when no write succeeded, so that close(2) reports the EFBIG.
	ready := p != nil && !p.draft && !p.done && (p.written || p.tooBig)
	var creator uint32
	if p != nil {
		creator = p.creator
	}
	n.mu.Unlock()
	if !ready {
		return 0
	}
	if _, _, pid := caller(ctx); !sameProcess(pid, creator) {
		return 0 // a child that inherited the descriptor; the creator's close commits
	}
	return n.commit(ctx)
}

var _ = (fs.NodeReleaser)((*msgNode)(nil))

// Release commits what no Flush did: empty files, and files whose
// descriptor went to another process.
func (n *msgNode) Release(ctx context.Context, fh fs.FileHandle) syscall.Errno {
	if _, ok := fh.(*writeHandle); !ok {
		return 0
	}
	n.mu.Lock()
	p := n.pend
	ready := p != nil && !p.draft && !p.done
	n.mu.Unlock()
	if ready {
		n.commit(context.Background())
	}
	return 0
}

var _ = (fs.NodeOnForgetter)((*msgNode)(nil))

// OnForget: the kernel dropped this inode.
func (n *msgNode) OnForget() {
	n.fsys.untrack(n)
	n.fsys.placements.forgotten(n.id, n.gen)
}
