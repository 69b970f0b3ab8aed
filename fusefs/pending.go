package fusefs

import (
	"context"
	"errors"
	"syscall"
	"time"

	"yirangmq/queuecore"
)

// pending is a file in inbox/ that is not a message yet: being written, or
// a draft (.NAME) waiting for its rename.
//
// The commit point (SPEC.md §2): close(2) reaches the daemon as FLUSH,
// once per closed descriptor (also when a child that inherited it exits),
// and the last close as RELEASE, asynchronously. So the commit happens at
// the FLUSH from the creating process once a byte was written, and its
// result is what close(2) returns; otherwise at RELEASE (empty messages,
// descriptors handed to another process), where nobody hears the result
// but the log.
type pending struct {
	draft   bool
	creator uint32 // thread group that created the file
	uid     uint32
	gid     uint32
	created time.Time
	limit   int64 // the queue's maxMessageBytes at create

	buf     []byte
	written bool // at least one write(2), however short
	tooBig  bool // EFBIG already logged
	done    bool // committed, refused or discarded: later writes are EPERM

	delay    time.Duration // user.yirangmq.delay_sec
	dedupKey string        // user.yirangmq.dedup_key
}

// writeHandle is the descriptor a Create returned; only its flushes and
// release commit.
type writeHandle struct{}

// commit publishes the file. It runs once; a second call returns 0.
func (n *msgNode) commit(ctx context.Context) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.pend
	if p == nil || p.done {
		return 0
	}
	p.done = true
	n.fsys.dropPending(n.queue, n.name, n)
	res, err := n.fsys.core.Publish(ctx, n.queue, n.name, p.buf, queuecore.PublishOptions{
		UID: p.uid, GID: p.gid, Delay: p.delay, DedupKey: p.dedupKey, ID: n.id,
	})
	var ve *queuecore.ValidationError
	switch {
	case err == nil && res.Deduplicated:
		n.fsys.log.Debug("duplicate dropped", "queue", n.queue, "name", n.name)
	case err == nil:
		n.pend = nil // from now on the node is the message
	case errors.As(err, &ve) && ve.Kept:
		n.pend = nil // the message lives on in dlq/; close(2) says EINVAL (the core logged why)
	default:
		n.fsys.log.Warn("publish failed", "queue", n.queue, "name", n.name, "err", err)
	}
	if err != nil || res.Message.State != queuecore.StateReady {
		// The kernel believes inbox/NAME holds this file: tell it to look
		// again (the message is in delayed/ or dlq/, or nowhere).
		n.fsys.queueInvalidation(queuecore.Event{Queue: n.queue, Name: n.name, To: queuecore.StateReady})
	}
	p.buf = nil
	return errnoOf(err)
}

// discard drops a file being written or a draft (rm before commit).
func (n *msgNode) discard() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pend != nil {
		n.pend.done = true
		n.pend.buf = nil
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
	n.pend.draft = false
	return 0
}

func (n *msgNode) isStaleDraft(now time.Time, ttl time.Duration) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.pend == nil || !n.pend.draft || now.Sub(n.pend.created) < ttl {
		return false
	}
	n.pend.done = true
	n.pend.buf = nil
	return true
}

func (f *FS) dropPending(queue, name string, n *msgNode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := pendingKey{queue, name}
	if f.pending[key] == n {
		delete(f.pending, key)
	}
}
