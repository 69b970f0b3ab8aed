package fusefs

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"yirangmq/queuecore"
)

// Pseudo-files are served with direct I/O: the kernel caches nothing, so
// every read reaches the daemon, and their size is reported as 0.
func fillPseudo(out *fuse.Attr, ino uint64, uid, gid uint32, writable bool) {
	now := time.Now()
	out.Ino = ino
	out.Mode = syscall.S_IFREG | 0o444
	if writable {
		out.Mode |= 0o200
	}
	out.Nlink = 1
	out.Uid, out.Gid = uid, gid
	out.SetTimes(&now, &now, &now)
	out.Blksize = 4096
}

// snapshot is an open pseudo-file: what it said when opened, so that
// reads in pieces see one consistent document.
type snapshot struct{ data []byte }

func (s *snapshot) read(dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= int64(len(s.data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(s.data[off:min(off+int64(len(dest)), int64(len(s.data)))]), 0
}

// readOnlyDoc is what the read-only pseudo-files share: a document made
// when the file is opened (a snapshot), read in pieces. Each of them is
// its own node type, which embeds it for Read.
type readOnlyDoc struct{}

var (
	_ = (fs.NodeReader)((*queueStatsNode)(nil))
	_ = (fs.NodeReader)((*rootStatsNode)(nil))
	_ = (fs.NodeReader)((*metricsNode)(nil))
)

func (readOnlyDoc) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	s, ok := fh.(*snapshot)
	if !ok {
		return nil, syscall.EBADF
	}
	return s.read(dest, off)
}

// openDoc opens a read-only pseudo-file on the document that doc makes;
// opening it for writing is EPERM.
func openDoc(flags uint32, doc func() ([]byte, error)) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EPERM
	}
	data, err := doc()
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	return &snapshot{data: data}, fuse.FOPEN_DIRECT_IO | noFlush, 0
}

// jsonDoc is v as indented JSON and a newline.
func jsonDoc(v any) []byte {
	data, _ := json.MarshalIndent(v, "", "  ")
	return append(data, '\n')
}

// queueStatsNode is QUEUE/.stats: the queue's counters and gauges
// (queuecore.QueueStats) as JSON.
type queueStatsNode struct {
	fs.Inode
	readOnlyDoc
	fsys  *FS
	queue string
}

var _ = (fs.NodeGetattrer)((*queueStatsNode)(nil))

func (n *queueStatsNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	fillPseudo(&out.Attr, n.fsys.queueIno(n.queue, kStats), n.fsys.uid, n.fsys.gid, false)
	return 0
}

var _ = (fs.NodeOpener)((*queueStatsNode)(nil))

func (n *queueStatsNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return openDoc(flags, func() ([]byte, error) {
		s, err := n.fsys.core.Stats(ctx, n.queue)
		if err != nil {
			return nil, err
		}
		return jsonDoc(s), nil
	})
}

// rootStatsNode is MOUNT/.stats: the daemon's figures
// (queuecore.DaemonStats) as JSON.
type rootStatsNode struct {
	fs.Inode
	readOnlyDoc
	fsys *FS
}

var _ = (fs.NodeGetattrer)((*rootStatsNode)(nil))

func (n *rootStatsNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	fillPseudo(&out.Attr, inoRootStats, n.fsys.uid, n.fsys.gid, false)
	return 0
}

var _ = (fs.NodeOpener)((*rootStatsNode)(nil))

func (n *rootStatsNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return openDoc(flags, func() ([]byte, error) {
		d, err := n.fsys.core.DaemonStats(ctx)
		if err != nil {
			return nil, err
		}
		return jsonDoc(d), nil
	})
}

// metricsNode is MOUNT/.metrics: the daemon's figures and its memory in
// the Prometheus text format (metrics.go).
type metricsNode struct {
	fs.Inode
	readOnlyDoc
	fsys *FS
}

var _ = (fs.NodeGetattrer)((*metricsNode)(nil))

func (n *metricsNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	fillPseudo(&out.Attr, inoMetrics, n.fsys.uid, n.fsys.gid, false)
	return 0
}

var _ = (fs.NodeOpener)((*metricsNode)(nil))

func (n *metricsNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return openDoc(flags, func() ([]byte, error) {
		d, err := n.fsys.core.DaemonStats(ctx)
		if err != nil {
			return nil, err
		}
		return n.fsys.appendMemoryMetrics(Metrics(d)), nil
	})
}

// policyNode is QUEUE/.policy: read it for the policy in effect, write a
// whole document to replace it. The new policy is committed at the close
// of the writer (FLUSH from the opening process, else RELEASE); an invalid
// one fails that close with EINVAL and the old policy stays.
type policyNode struct {
	fs.Inode
	fsys  *FS
	queue string
}

type policyWriter struct {
	mu      sync.Mutex
	opener  uint32 // thread that opened it
	creds   creds  // who opened it: the policy's writer
	buf     []byte
	written bool
	tooBig  bool // a write went past maxPolicyWrite: the document is not whole
	done    bool
}

var _ = (fs.NodeGetattrer)((*policyNode)(nil))

func (n *policyNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	info, err := n.fsys.core.QueueInfo(n.queue)
	if err != nil {
		return errnoOf(err)
	}
	fillPseudo(&out.Attr, n.fsys.queueIno(n.queue, kPolicy), info.UID, info.GID, true)
	return 0
}

var _ = (fs.NodeSetattrer)((*policyNode)(nil))

// Setattr accepts the truncation that `>` and cp send before writing.
func (n *policyNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if w, ok := fh.(*policyWriter); ok {
		if size, ok := in.GetSize(); ok {
			w.truncate(size)
		}
	}
	return n.Getattr(ctx, fh, out)
}

// truncate shortens the document to size bytes; a larger size changes
// nothing. size is compared as a uint64: int(size) wraps on a 32-bit
// machine (truncate -s 4294967297 became 1) and the slice panicked: EIO.
func (w *policyWriter) truncate(size uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if size < uint64(len(w.buf)) {
		w.buf = w.buf[:size]
	}
}

var _ = (fs.NodeOpener)((*policyNode)(nil))

func (n *policyNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		c := callerCreds(ctx)
		c.inGroup(^uint32(0)) // read the groups now: the writer may be gone at RELEASE
		return &policyWriter{opener: c.pid, creds: c}, fuse.FOPEN_DIRECT_IO, 0
	}
	p, err := n.fsys.core.Policy(n.queue)
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	if why := p.Broken(); why != "" {
		// The policy in effect is a closed stand-in, not the owner's: a
		// read-modify-write of it (yirangmq resume) must not reopen the
		// queue on defaults. Writing a whole valid policy does.
		n.fsys.log.Warn(".policy read refused: the stored policy cannot be loaded", queuecore.LogQueue, n.queue, queuecore.LogUID, callerUID(ctx), queuecore.LogErr, why)
		return nil, 0, syscall.EIO
	}
	doc, err := n.fsys.core.PolicyDocument(n.queue) // with the refusal of the last document written, if any
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	return &snapshot{data: doc}, fuse.FOPEN_DIRECT_IO | noFlush, 0
}

var _ = (fs.NodeReader)((*policyNode)(nil))

func (n *policyNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	s, ok := fh.(*snapshot)
	if !ok {
		return nil, syscall.EBADF
	}
	return s.read(dest, off)
}

// maxPolicyWrite bounds a policy document held in memory.
const maxPolicyWrite = 1 << 20

var _ = (fs.NodeWriter)((*policyNode)(nil))

func (n *policyNode) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	w, ok := fh.(*policyWriter)
	if !ok {
		return 0, syscall.EBADF
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return 0, syscall.EPERM
	}
	end := off + int64(len(data))
	if end > maxPolicyWrite {
		w.tooBig = true
		return 0, syscall.EFBIG
	}
	if end > int64(len(w.buf)) {
		w.buf = append(w.buf, make([]byte, end-int64(len(w.buf)))...)
	}
	copy(w.buf[off:], data)
	w.written = w.written || len(data) > 0
	return uint32(len(data)), 0
}

func (n *policyNode) commit(ctx context.Context, w *policyWriter) syscall.Errno {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done || !(w.written || w.tooBig) {
		return 0
	}
	w.done = true
	if w.tooBig {
		// What fitted before the EFBIG is not the writer's document, even
		// when it parses (a valid object followed by a megabyte of spaces).
		return n.fsys.refuse(refusal{msg: "policy rejected: document larger than the limit", queue: n.queue, uid: w.creds.uid, errno: syscall.EINVAL, policy: true}, "limit", maxPolicyWrite)
	}
	if errno := n.checkFanout(w); errno != 0 {
		return errno
	}
	if err := n.fsys.core.SetPolicy(ctx, n.queue, w.buf); err != nil {
		return n.fsys.refuse(refusal{msg: "policy rejected", queue: n.queue, uid: w.creds.uid, errno: errnoOf(err), err: err, policy: true})
	}
	n.fsys.log.Info("policy replaced", queuecore.LogQueue, n.queue)
	return 0
}

// checkFanout: naming a queue as a fanout target puts messages in its
// inbox/, so it needs what publishing there needs, write and search
// permission on that queue, for the policy's writer. It is checked when
// the policy is written; a later chmod of the target does not undo a
// fanout already in place (docs/multiuser.md).
func (n *policyNode) checkFanout(w *policyWriter) syscall.Errno {
	var doc struct {
		Fanout []string `json:"fanout"`
	}
	if json.Unmarshal(w.buf, &doc) != nil {
		return 0 // not a policy: SetPolicy says why
	}
	for _, target := range doc.Fanout {
		info, err := n.fsys.core.QueueInfo(target)
		if err != nil {
			continue // no such queue: SetPolicy says so
		}
		if !w.creds.may(info.UID, info.GID, info.Mode, mayWrite|mayExec) {
			return n.fsys.refuse(refusal{msg: "policy rejected: fanout to a queue its writer may not publish to", queue: n.queue, uid: w.creds.uid, errno: syscall.EACCES, policy: true}, "fanout", target)
		}
	}
	return 0
}

var _ = (fs.NodeFlusher)((*policyNode)(nil))

func (n *policyNode) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno {
	w, ok := fh.(*policyWriter)
	if !ok {
		return 0
	}
	if _, _, pid := caller(ctx); !sameProcess(pid, w.opener) {
		return 0
	}
	return n.commit(ctx, w)
}

var _ = (fs.NodeReleaser)((*policyNode)(nil))

func (n *policyNode) Release(ctx context.Context, fh fs.FileHandle) syscall.Errno {
	if w, ok := fh.(*policyWriter); ok {
		n.commit(context.Background(), w)
	}
	return 0
}

var _ = (fs.NodeFsyncer)((*policyNode)(nil))

func (n *policyNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	return 0
}

// nextNode is QUEUE/.next: the first read blocks until a message can be
// leased, leases it and returns "processing/NAME\n"; later reads return
// EOF. O_NONBLOCK: EAGAIN when nothing is ready. A signal interrupts the
// wait with EINTR and no lease.
type nextNode struct {
	fs.Inode
	fsys  *FS
	queue string
}

type nextHandle struct {
	mu       sync.Mutex
	nonblock bool
	leased   bool
	data     []byte
}

var _ = (fs.NodeGetattrer)((*nextNode)(nil))

func (n *nextNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	info, err := n.fsys.core.QueueInfo(n.queue)
	if err != nil {
		return errnoOf(err)
	}
	fillPseudo(&out.Attr, n.fsys.queueIno(n.queue, kNext), info.UID, info.GID, false)
	return 0
}

var _ = (fs.NodeOpener)((*nextNode)(nil))

func (n *nextNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EPERM
	}
	// A read leases: it needs what `mv inbox/X processing/` needs, write
	// and search permission on the queue's directories (they share the
	// queue's owner and mode), not the read permission of .next.
	info, err := n.fsys.core.QueueInfo(n.queue)
	if err != nil {
		return nil, 0, errnoOf(err)
	}
	if c := callerCreds(ctx); !c.may(info.UID, info.GID, info.Mode, mayWrite|mayExec) {
		return nil, 0, n.fsys.refuse(refusal{msg: ".next refused: leasing needs write permission on the queue", queue: n.queue, name: ".next", uid: c.uid, errno: syscall.EACCES})
	}
	return &nextHandle{nonblock: flags&syscall.O_NONBLOCK != 0}, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NONSEEKABLE | noFlush, 0
}

// next leases for a read of .next. On FUSE over io_uring, a read that
// would wait first looks for a signal its caller already got: the kernel
// sends an INTERRUPT only for a request it has handed to the daemon, and
// on io_uring, unlike on /dev/fuse, it does not send one afterwards for a
// signal that came while the request was still queued for a ring entry.
// The caller then waits for our answer, deaf to further signals, and a
// blocked read would ignore its Ctrl-C until a message came. Such a
// signal is still pending on the caller's thread when the request
// reaches us (signalPending); a signal that comes later reaches us as an
// INTERRUPT, as on /dev/fuse.
func (n *nextNode) next(ctx context.Context, nonblock bool) (queuecore.Message, error) {
	consumer := n.fsys.consumer(ctx)
	if nonblock || !n.fsys.onRing.Load() {
		return n.fsys.core.Next(ctx, n.queue, consumer, nonblock)
	}
	m, err := n.fsys.core.Next(ctx, n.queue, consumer, true)
	if !errors.Is(err, queuecore.ErrEmpty) {
		return m, err
	}
	if _, _, tid := caller(ctx); signalPending(tid) {
		return queuecore.Message{}, context.Canceled // EINTR, as for an INTERRUPT
	}
	return n.fsys.core.Next(ctx, n.queue, consumer, false)
}

var _ = (fs.NodeReader)((*nextNode)(nil))

func (n *nextNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, ok := fh.(*nextHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.leased {
		uid, _, _ := caller(ctx)
		if why := n.fsys.readers.enter(&n.fsys.opts, uid, n.queue); why != "" {
			return nil, n.fsys.refuse(refusal{msg: ".next refused: too many blocked readers " + why, queue: n.queue, name: ".next", uid: uid, errno: syscall.EBUSY})
		}
		m, err := n.next(ctx, h.nonblock)
		n.fsys.readers.leave(uid, n.queue)
		if err != nil {
			return nil, errnoOf(err)
		}
		h.leased = true
		// The kernel did not see this move and is not told (no entry
		// invalidations, see Options): it caches no missing names, so the
		// consumer's open and unlink of processing/NAME reach us, and a
		// lookup there gives the message a new inode generation
		// (placements.go).
		h.data = []byte(queuecore.StateLeased.Dir() + "/" + m.Name + "\n")
	}
	s := snapshot{data: h.data}
	return s.read(dest, off)
}
