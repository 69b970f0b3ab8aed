package fusefs

import (
	"context"
	"errors"
	"syscall"
	"time"

	"yirangmq/queuecore"

	"github.com/hanwen/go-fuse/v2/fs"
)

// pending is a file in inbox/ that is not a message yet: being written, or
// a draft (.NAME) waiting for its rename.
//
// The commit point (docs/contract.md §2): close(2) reaches the daemon as FLUSH,
// once per closed descriptor (also when a child that inherited it exits),
// and the last close as RELEASE, asynchronously. So the commit happens at
// the FLUSH from the creating process once a byte was written, and its
// result is what close(2) returns; otherwise at RELEASE (empty messages,
// descriptors handed to another process), where nobody hears the result
// but the log.
type pending struct {
	draft   bool
	creator uint32 // thread that created the file (FUSE gives thread ids)
	uid     uint32
	gid     uint32
	created time.Time
	limit   int64 // the queue's maxMessageBytes at create

	buf      []byte
	written  bool  // at least one write(2), however short
	tooBig   bool  // EFBIG already logged
	quota    bool  // EDQUOT already logged
	held     int64 // bytes of buf accounted in FS.drafts
	wasDraft bool  // committed by the rename of a draft
	done     bool  // committed, refused or discarded: later writes are EPERM

	// editorTemp: named like an in-place editor's temporary file, held
	// until renamed or until its creator exits (editortemp.go), whose
	// pidfd is creatorFD (-1 when none).
	editorTemp bool
	creatorFD  int

	mtime    time.Time     // set by the writer (utimes before the commit): kept as the inbox mtime
	delay    time.Duration // user.yirangmq.delay_sec
	dedupKey string        // user.yirangmq.dedup_key
}

// writeHandle is the descriptor a Create returned; only its flushes and
// release commit.
type writeHandle struct{}

// commit publishes (or refuses) the file. It runs once; a second call
// returns 0. When the message went to delayed/ or dlq/, or nowhere
// (refused, deduplicated), the kernel may still believe for up to the
// entry timeout that inbox/NAME holds it (the CREATE reply let it cache
// the name); it is not told (see Options), and whatever it then sends for
// that name is checked against the queue.
func (n *msgNode) commit(ctx context.Context) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.pend
	if p == nil || p.done {
		return 0
	}
	p.done = true
	// The file stays in FS.pending until the commit's outcome is known
	// (n.mu is held throughout): an unlink that comes meanwhile finds it,
	// waits for n.mu and then removes whatever the commit made of it
	// (stateDir.Unlink). Dropped from the map first, the file of an empty
	// message committed at RELEASE (after close(2) has returned) was in
	// neither place for the length of the commit: an unlink then got
	// ENOENT, or returned 0 while the commit published the message anyway.
	defer n.fsys.dropPending(n.queue, n.name, n)
	if p.tooBig {
		// A write past maxMessageBytes already failed with EFBIG: what was
		// written before it (or nothing at all) is not the producer's
		// message, so committing it would publish a half or empty message.
		// Drop the file and fail the close too, for a producer that only
		// checks close(2).
		n.release(p)
		return n.fsys.refuse(refusal{msg: "message dropped: a write went past maxMessageBytes", queue: n.queue, name: n.name, uid: p.uid, errno: syscall.EFBIG}, "limit", p.limit)
	}
	res, err := n.fsys.core.Publish(ctx, n.queue, n.name, p.buf, queuecore.PublishOptions{
		UID: p.uid, GID: p.gid, Delay: p.delay, DedupKey: p.dedupKey, ID: n.id, MTime: p.mtime,
	})
	var ve *queuecore.ValidationError
	switch {
	case err == nil && res.Deduplicated:
		n.fsys.log.Debug("duplicate dropped", queuecore.LogQueue, n.queue, queuecore.LogName, n.name)
	case err == nil:
		n.pend = nil // from now on the node is the message
	case errors.As(err, &ve) && ve.Kept:
		n.pend = nil // the message lives on in dlq/; close(2) says EINVAL (the core logged why)
		n.fsys.refuse(refusal{msg: "publish refused", queue: n.queue, name: n.name, uid: p.uid, errno: errnoOf(err), err: err, logged: true})
	default:
		n.fsys.refuse(refusal{msg: "publish failed", queue: n.queue, name: n.name, uid: p.uid, errno: errnoOf(err), err: err})
	}
	if n.pend == nil || err == nil || !p.wasDraft {
		// Published (or dropped as a duplicate): the store has it. Or
		// refused: the file is gone.
		n.release(p)
	} // else keep the bytes: a draft whose rename failed is a draft again
	return errnoOf(err)
}

// discardOrCommitted is the unlink of a file that was being written or a
// draft. It waits for a commit under way (which holds n.mu). A file not
// committed yet is dropped, and so is one whose commit published nothing
// (refused, or dropped as a duplicate): settled, the unlink is done.
// Otherwise the commit published it, and m is the message it became,
// wherever it is now (zero when it is gone already): the caller removes it.
func (n *msgNode) discardOrCommitted(ctx context.Context) (m queuecore.Message, settled bool) {
	n.mu.Lock()
	if p := n.pend; p != nil {
		p.done = true
		n.release(p)
		n.mu.Unlock()
		n.fsys.dropPending(n.queue, n.name, n)
		return queuecore.Message{}, true
	}
	n.mu.Unlock()
	m, err := n.messageAnywhere(ctx)
	if err != nil {
		return queuecore.Message{}, false
	}
	return m, false
}

// release drops the bytes of a file not committed and gives them
// back to the draft bounds.
func (n *msgNode) release(p *pending) {
	if p == nil {
		return
	}
	p.buf = nil
	if p.held != 0 {
		n.fsys.drafts.grow(&n.fsys.opts, p.uid, -p.held)
		p.held = 0
	}
}

// rename turns a draft into a file to commit under newName.
func (n *msgNode) rename(newName string) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pend == nil || n.pend.done {
		return syscall.ENOENT
	}
	n.name = newName
	n.pend.draft, n.pend.editorTemp = false, false
	n.pend.wasDraft = true
	return 0
}

// restoreDraft undoes rename after a failed commit that kept nothing (the
// store refused it before anything was published): the file is the draft
// it was. It reports whether it did.
func (n *msgNode) restoreDraft(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.pend
	if p == nil || p.tooBig {
		return false // published, kept in dlq/, or refused for its size
	}
	n.name, p.draft, p.done = name, true, false
	return true
}

func (n *msgNode) isStaleDraft(now time.Time, ttl time.Duration) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pend == nil || !n.pend.draft || now.Sub(n.pend.created) < ttl {
		return false
	}
	n.pend.done = true
	n.release(n.pend)
	return true
}

// A message node while it is written: the bytes go to its pending, and
// the commit is at FLUSH or RELEASE (above).
var (
	_ = (fs.NodeWriter)((*msgNode)(nil))
	_ = (fs.NodeFsyncer)((*msgNode)(nil))
	_ = (fs.NodeFlusher)((*msgNode)(nil))
	_ = (fs.NodeReleaser)((*msgNode)(nil))
)

func (f *FS) dropPending(queue, name string, n *msgNode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := pendingKey{queue, name}
	if f.pending[key] == n {
		delete(f.pending, key)
	}
}
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
		if err := n.resizeLocked(end); err != nil {
			return 0, errnoOf(err)
		}
	}
	copy(p.buf[off:], data)
	if len(data) > 0 {
		p.written = true
	}
	n.fsys.trimWrite(data)
	return uint32(len(data)), 0
}

func len64(b []byte) int64 { return int64(len(b)) }

// resizeLocked grows or truncates the buffer of a file being written; past
// the queue's maxMessageBytes it is ErrTooLarge (EFBIG at write(2), as
// docs/contract.md says), past the draft bounds errDraftsFull (EDQUOT).
func (n *msgNode) resizeLocked(size int64) error {
	p := n.pend
	if p.done {
		return queuecore.ErrImmutable
	}
	if size > p.limit {
		if !p.tooBig {
			// Recorded at the close, which fails with EFBIG too (commit).
			n.fsys.log.Warn("write refused: message larger than the queue's maxMessageBytes",
				queuecore.LogQueue, n.queue, queuecore.LogName, n.name, queuecore.LogUID, p.uid, "limit", p.limit)
			p.tooBig = true
		}
		return queuecore.ErrTooLarge
	}
	if size <= int64(cap(p.buf)) {
		old := len(p.buf)
		p.buf = p.buf[:size]
		if int(size) > old {
			clear(p.buf[old:])
		}
		return nil
	}
	// Grow by doubling (within maxMessageBytes), or to exactly size when
	// the draft bounds leave no room for more.
	newCap := max(size, min(2*int64(cap(p.buf)), p.limit))
	if !n.fsys.growDrafts(p.uid, newCap-p.held) {
		newCap = size
		if !n.fsys.growDrafts(p.uid, newCap-p.held) {
			if !p.quota {
				n.fsys.refuse(refusal{msg: "write refused: too many uncommitted bytes (EDQUOT)", queue: n.queue, name: n.name, uid: p.uid, errno: errnoOf(errDraftsFull)},
					"max_total", n.fsys.opts.MaxDraftBytes, "max_per_uid", n.fsys.opts.MaxDraftBytesPerUID)
				p.quota = true
			}
			return errDraftsFull
		}
	}
	p.held = newCap
	nb := make([]byte, size, newCap)
	copy(nb, p.buf)
	p.buf = nb
	return nil
}

// Fsync before close is allowed and harmless: durability comes with the
// commit at close.
func (n *msgNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno { return 0 }

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
	ready := p != nil && !p.draft && !p.editorTemp && !p.done && (p.written || p.tooBig)
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

// Release commits what no Flush did: empty files, and files whose
// descriptor went to another process.
func (n *msgNode) Release(ctx context.Context, fh fs.FileHandle) syscall.Errno {
	n.released()
	if h, ok := fh.(*readHandle); ok && h.held > 0 {
		n.fsys.drafts.grow(&n.fsys.opts, h.uid, -h.held) // a copy of a file not committed
		h.held, h.body = 0, nil
	}
	if h, ok := fh.(*readHandle); ok && h.file != nil {
		h.file.Close()
		h.file = nil
		n.fsys.bodyFiles.give()
	}
	if _, ok := fh.(*writeHandle); !ok {
		return 0
	}
	if n.holdAtRelease() {
		return 0 // an editor's temporary file: see editortemp.go
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
