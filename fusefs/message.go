package fusefs

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	// opens counts the file handles of this node not released yet
	// (Open, Create): a GETXATTR with some open may come from a
	// descriptor (fgetxattr), which the kernel does not retry on ESTALE.
	opens int

	// shown records the attributes this node answered the kernel with:
	// the owner uid of the last (low 32 bits; the kernel checks a touch
	// -d or a chmod against it even once expired), whether there was one
	// (shownAny) and whether any had, or is about to have, a validity
	// above 0 (shownCached; see mayCache).
	// A lease needs no invalidation when the kernel holds neither valid
	// attributes nor another owner (attrsStillRight).
	shown atomic.Uint64
}

const (
	shownAny    = 1 << 32
	shownCached = 1 << 33
)

// show records the attributes about to be answered for n; cached: with a
// validity above 0 (an answer to CREATE, and any for a file still being
// written, has none).
func (n *msgNode) show(out *fuse.Attr, cached bool) {
	v := uint64(out.Uid) | shownAny
	if cached {
		v |= shownCached
	}
	for {
		old := n.shown.Load()
		if n.shown.CompareAndSwap(old, v|old&shownCached) {
			return
		}
	}
}

// mayCache records, before the message is read for an answer whose
// attributes the kernel may keep, that such an answer is on its way: a
// lease that looks at shown meanwhile must not count on the kernel having
// none, since the answer, read before the lease, may arrive after it.
func (n *msgNode) mayCache() { n.shown.Or(shownCached) }

// attrsStillRight reports whether the kernel holds no attributes of n
// that the lease of m made wrong: n stands for m, every answer for n had
// a validity of 0 (those of the CREATE that published it, see
// uncachedCreates; so a stat asks again), and the last one named m's
// leaser as the owner (a publisher leasing its own message). Then the
// lease needs no invalidation, a FUSE notification that cost about as
// much CPU as the lease's commit.
func (n *msgNode) attrsStillRight(m queuecore.Message) bool {
	uid, ok := leaserUID(m)
	return ok && n.id == m.ID && n.shown.Load() == uint64(uid)|shownAny
}

// opened and released count the node's file handles (opens).
func (n *msgNode) opened() {
	n.mu.Lock()
	n.opens++
	n.mu.Unlock()
}

func (n *msgNode) released() {
	n.mu.Lock()
	n.opens--
	n.mu.Unlock()
}

// noFlush is in the open flags of every read-only handle: the kernel then
// sends no FLUSH at its close (FOPEN_NOFLUSH, Linux 5.16 and later; older
// kernels ignore it and send one, answered with nothing done). A FLUSH
// does something only for a writer: the commit at close. A consumer's
// `cat .next` and `cat processing/X` save one request each.
const noFlush = fuse.FOPEN_NOFLUSH

// readHandle serves reads of a committed message (the body never changes)
// or of a copy of a file not committed yet, whose bytes count in the
// draft bounds of the reader's uid until the release (held).
//
// A committed message whose store keeps the body in a file of its own
// (the fs store) is read from that file (file, size) instead of a copy in
// memory: the kernel reads it itself when it accepts the file as the
// open's backing file (FUSE passthrough, PassthroughFd), else READs are
// spliced from it. See docs/performance-history.md.
type readHandle struct {
	body []byte
	uid  uint32
	held int64

	file *os.File
	fd   int
	size int64
}

var _ = (fs.FilePassthroughFder)((*readHandle)(nil))

// PassthroughFd offers the body file as the open's backing file: go-fuse
// registers it with the kernel (once per inode while it is open), which
// then serves read(2) and mmap from it without asking the daemon. The
// kernel reads it with the daemon's credentials, through our read-only
// descriptor: the reader cannot write to it, and it holds only this
// message's bytes (readHandle.file is checked by the store).
func (h *readHandle) PassthroughFd() (int, bool) {
	if h.file == nil {
		return 0, false
	}
	return h.fd, true
}

// messageAnywhere returns the message this node stands for, wherever it is
// now (messageInDir: only in the directory of the node's name).
func (n *msgNode) messageAnywhere(ctx context.Context) (queuecore.Message, error) {
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
		t := p.created
		if !p.mtime.IsZero() {
			t = p.mtime
		}
		out.SetTimes(&t, &t, &t)
		out.Blksize = 4096
		out.Blocks = (out.Size + 511) / 512
		n.mu.Unlock()
		n.show(out, false) // see uncachedCreates
		return 0
	}
	n.mu.Unlock()
	n.mayCache()
	m, err := n.messageAnywhere(ctx)
	if err != nil {
		return errnoOf(err)
	}
	fillMessage(out, m)
	n.show(out, true)
	return 0
}

// fillMessage sets a message's attributes; its times say what its state
// means (docs/contract.md §2): commit time in inbox/, lease deadline in processing/,
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
	if uid, ok := leaserUID(m); ok {
		// A leased message belongs to its leaser: it may set the reason
		// of its failure (setxattr needs write permission) and move its
		// deadline (touch -d needs ownership), whoever published it.
		out.Uid = uid
	}
	out.SetTimes(&t, &t, &t)
	out.Blksize = 4096
	out.Blocks = (out.Size + 511) / 512
}

// leaserUID is the uid of a leased message's leaser, from its consumer
// ("uid=N pid=P cmd=C", see consumer).
func leaserUID(m queuecore.Message) (uint32, bool) {
	if m.State != queuecore.StateLeased {
		return 0, false
	}
	v, ok := strings.CutPrefix(m.Consumer, "uid=")
	if !ok {
		return 0, false
	}
	v, _, _ = strings.Cut(v, " ")
	n, err := strconv.ParseUint(v, 10, 32)
	return uint32(n), err == nil
}

var _ = (fs.NodeGetattrer)((*msgNode)(nil))

func (n *msgNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if n.refused() {
		// A file whose commit published nothing is gone, asked by name or
		// through a handle: go-fuse hands a GETATTR that names no handle
		// one of the node's open handles, and the writer's RELEASE, which
		// is asynchronous, may not have closed it yet.
		return syscall.ESTALE
	}
	if fh == nil {
		// By name: the name the kernel kept may no longer be this file's.
		if !n.isPending() {
			n.mayCache()
			m, errno := n.messageInDir(ctx)
			if errno != 0 {
				return errno
			}
			fillMessage(&out.Attr, m)
			n.show(&out.Attr, true)
			return 0
		}
	}
	if n.isPending() {
		out.SetTimeout(uncachedEntry) // see uncachedCreates
	}
	return n.fillAttr(ctx, &out.Attr)
}

// nameNow is the node's name as it is now.
func (n *msgNode) nameNow() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.name
}

func (n *msgNode) isPending() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pend != nil
}

// refused reports whether this node is a file whose commit published
// nothing (refused, or dropped as a duplicate).
func (n *msgNode) refused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pend != nil && n.pend.done
}

// messageInDir returns the committed message this node stands for, or ESTALE when
// the kernel reached it through a name it kept from before the message
// moved away or ended (the daemon never tells the kernel, see
// Options.EntryTimeout): the message is no longer in the directory that
// holds the kernel's name. On ESTALE from a GETATTR or an OPEN the kernel
// looks the name up again and retries once, so the caller gets what is
// there now (ENOENT, or the message that holds the name now), never a
// message from another directory.
func (n *msgNode) messageInDir(ctx context.Context) (queuecore.Message, syscall.Errno) {
	m, err := n.messageAnywhere(ctx)
	if errors.Is(err, queuecore.ErrNotFound) {
		return m, syscall.ESTALE
	}
	if err != nil {
		return m, errnoOf(err)
	}
	if _, parent := n.Parent(); parent != nil {
		if d, ok := parent.Operations().(*stateDir); ok && (d.state != m.State || d.queue != m.Queue) {
			return m, syscall.ESTALE
		}
	}
	return m, 0
}

var _ = (fs.NodeOpener)((*msgNode)(nil))

// Open of a committed message is read-only: a committed message is
// immutable, so opening it for writing (cp or > onto it, >>) is EPERM.
func (n *msgNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.open(ctx, flags)
	if errno == 0 {
		n.opened()
	}
	return fh, fl, errno
}

func (n *msgNode) open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	n.mu.Lock()
	p := n.pend
	name := n.name
	refused := p != nil && p.done
	n.mu.Unlock()
	writing := flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
	if refused {
		// A name the kernel kept from the CREATE reply of a publish that
		// was refused or dropped: ESTALE makes the kernel look the name
		// up again (ENOENT) and retry the open once, so open(O_CREAT)
		// creates a new file, as it would have without the kept name.
		return nil, 0, syscall.ESTALE
	}
	if p != nil {
		if writing {
			return nil, 0, syscall.EPERM // one writer per file being written: its creator
		}
		uid, _, _ := caller(ctx)
		n.mu.Lock()
		size := int64(len(p.buf))
		if !n.fsys.growDrafts(uid, size) {
			n.mu.Unlock()
			return nil, 0, n.fsys.refuse(refusal{msg: "open refused: too many uncommitted bytes (EDQUOT)", queue: n.queue, name: name, uid: uid, errno: errnoOf(errDraftsFull)})
		}
		body := append([]byte(nil), p.buf...)
		n.mu.Unlock()
		return &readHandle{body: body, uid: uid, held: size}, fuse.FOPEN_DIRECT_IO | noFlush, 0
	}
	m, errno := n.messageInDir(ctx) // ESTALE: `> inbox/X` after X was leased publishes a new X
	if errno != 0 {
		return nil, 0, errno
	}
	if writing {
		return nil, 0, n.fsys.refuse(refusal{msg: "open for writing refused: committed messages are immutable", queue: n.queue, name: name, uid: callerUID(ctx), errno: syscall.EPERM})
	}
	var f *os.File
	var err error
	inFiles := true // not known past the bound: then the copy stays out of the page cache
	if n.fsys.bodyFiles.take() {
		f, inFiles, err = n.fsys.core.BodyFile(ctx, m)
		if f == nil {
			n.fsys.bodyFiles.give()
		}
		if errors.Is(err, queuecore.ErrNotFound) {
			return nil, 0, errnoOf(err)
		}
		if err != nil {
			// Out of descriptors, say: the store can still give a copy.
			n.fsys.log.Warn("body file not usable, reading a copy of the body", queuecore.LogQueue, n.queue, queuecore.LogName, name, queuecore.LogErr, err)
		}
	}
	if f != nil {
		// go-fuse turns this into FOPEN_PASSTHROUGH when the kernel takes
		// the file (and drops KEEP_CACHE then).
		return &readHandle{file: f, fd: int(f.Fd()), size: m.Size}, fuse.FOPEN_KEEP_CACHE | noFlush, 0
	}
	body, err := n.fsys.core.Body(ctx, m)
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	if inFiles {
		// The kernel refuses to open an inode through a backing file while
		// another open of it uses the page cache (open(2) would fail with
		// EIO), and the next reader of this message may get its file: an
		// open served from memory stays out of the page cache.
		return &readHandle{body: body}, fuse.FOPEN_DIRECT_IO | noFlush, 0
	}
	return &readHandle{body: body}, fuse.FOPEN_KEEP_CACHE | noFlush, 0
}

var _ = (fs.NodeReader)((*msgNode)(nil))

func (n *msgNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, ok := fh.(*readHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	if h.file != nil {
		// Not passed through (the kernel or go-fuse declined the backing
		// file): go-fuse splices the bytes from the file to the kernel.
		if off >= h.size {
			return fuse.ReadResultData(nil), 0
		}
		return fuse.ReadResultFd(uintptr(h.fd), off, int(min(int64(len(dest)), h.size-off))), 0
	}
	if off >= int64(len(h.body)) {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), int64(len(h.body)))
	return fuse.ReadResultData(h.body[off:end]), 0
}

var _ = (fs.NodeSetattrer)((*msgNode)(nil))

// Setattr: touch of a leased message extends its lease (touch -d sets the
// deadline); a file being written may be truncated, and the modification
// time its writer sets is kept as the message's inbox mtime (rsync, cp -p,
// tar); chmod, chown and utimes that do not change what the queue means
// are accepted and ignored, on a file being written and on a committed
// message alike, by path or by descriptor (install -m, shutil.copy2,
// rsync --inplace, unzip): a tool must not report a failure after its
// message was published, or a retry publishes it twice. Truncating a
// committed message or giving it to another owner is EPERM.
func (n *msgNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	if p := n.pend; p != nil {
		if size, ok := in.GetSize(); ok {
			if err := n.resizeLocked(int64(size)); err != nil {
				n.mu.Unlock()
				return errnoOf(err)
			}
		}
		if mtime, ok := in.GetMTime(); ok && in.Valid&fuse.FATTR_MTIME_NOW == 0 && !p.done {
			p.mtime = mtime
		}
		n.mu.Unlock()
		out.SetTimeout(uncachedEntry) // see uncachedCreates
		return n.fillAttr(ctx, &out.Attr)
	}
	name := n.name
	n.mu.Unlock()
	mtime, hasMtime := in.GetMTime()
	if _, hasSize := in.GetSize(); hasSize {
		if fh == nil {
			// truncate(2) by a name the kernel kept from before the
			// message moved away or went: ESTALE makes the kernel look
			// the name up again and retry, so the caller gets what a
			// fresh lookup gives (ENOENT), not EPERM for another
			// directory's message.
			if _, errno := n.messageInDir(ctx); errno != 0 {
				return errno
			}
		}
		return n.fsys.refuse(refusal{msg: "truncate refused: committed messages are immutable", queue: n.queue, name: name, uid: callerUID(ctx), errno: errnoOf(queuecore.ErrImmutable)})
	}
	m, done, errno := n.setattrTarget(ctx, fh, out)
	if done || errno != 0 {
		return errno
	}
	uid, hasUID := in.GetUID()
	gid, hasGID := in.GetGID()
	if (hasUID && uid != m.UID) || (hasGID && gid != m.GID) {
		return n.fsys.refuse(refusal{msg: "chown refused: a message stays owned by its publisher", queue: n.queue, name: name, uid: callerUID(ctx), errno: errnoOf(queuecore.ErrImmutable)})
	}
	if m.State == queuecore.StateLeased && (hasMtime || in.Valid&(fuse.FATTR_MTIME_NOW|fuse.FATTR_ATIME|fuse.FATTR_ATIME_NOW) != 0) {
		var deadline time.Time // zero: now + visibility timeout
		if hasMtime && in.Valid&fuse.FATTR_MTIME_NOW == 0 {
			deadline = mtime
		}
		extended, err := n.fsys.core.Extend(ctx, n.queue, name, deadline)
		if err != nil {
			return errnoOf(err)
		}
		m = extended
	}
	// Anything else (a mode, the owner it has, the times of a message
	// not leased) is accepted and changes nothing.
	fillMessage(&out.Attr, m)
	n.show(&out.Attr, true)
	return 0
}

// setattrTarget is the committed message a Setattr changes. Without a
// file handle (by path, and also fchmod and futimens, which the kernel
// sends without one) the name the kernel kept may be from before the
// message moved away. Then nothing is changed, so a touch of a stale
// inbox/X cannot extend the lease someone else took of X, and the call
// succeeds (done, with out filled), so a tool that sets the times or mode
// after its close (shutil.copy2, os.Chtimes) does not fail after its
// message was published and leased at once or delayed. A message gone
// altogether is ESTALE: the kernel looks the name up again and retries,
// as for a stat.
func (n *msgNode) setattrTarget(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) (m queuecore.Message, done bool, errno syscall.Errno) {
	n.mayCache()
	if fh != nil {
		m, err := n.messageAnywhere(ctx)
		return m, false, errnoOf(err)
	}
	m, errno = n.messageInDir(ctx)
	if errno == syscall.ESTALE && m.ID != 0 {
		fillMessage(&out.Attr, m)
		n.show(&out.Attr, false)
		out.SetTimeout(uncachedEntry) // see uncachedCreates
		return m, true, 0
	}
	return m, false, errno
}

var _ = (fs.NodeOnForgetter)((*msgNode)(nil))

// OnForget: the kernel dropped this inode.
func (n *msgNode) OnForget() {
	n.fsys.untrack(n)
	n.fsys.placements.forgotten(n.id, n.gen)
	n.mu.Lock()
	if p := n.pend; p != nil && p.done {
		n.release(p) // settled, but its bytes were kept: they go now
	}
	n.mu.Unlock()
}
