package fusefs

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"

	"yirangmq/queuecore"
)

// Extended attributes of docs/contract.md §4, all under user.yirangmq.
const xattrPrefix = "user.yirangmq."

// messageXattrs returns the attributes of a message, in listing order.
// The place in line costs a walk of inbox/, so it is computed only when
// want asks for it ("position" or "eta_sec"); a listing (want == "") gives
// the keys with empty values.
func (n *msgNode) messageXattrs(ctx context.Context, m queuecore.Message, want string) [][2]string {
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	a := [][2]string{
		{"id", m.MessageID},
		{"attempts", strconv.Itoa(m.Attempts)},
		{"published_at", ts(m.FirstAt)},
		{"redrives", strconv.Itoa(m.Redrives)},
	}
	switch m.State {
	case queuecore.StateReady:
		switch want {
		case "position", "eta_sec":
			if pos, eta, err := n.fsys.core.Position(ctx, m); err == nil {
				a = append(a, [2]string{"position", strconv.Itoa(pos)})
				if eta >= 0 {
					a = append(a, [2]string{"eta_sec", strconv.FormatFloat(eta.Seconds(), 'f', 1, 64)})
				}
			}
		case "":
			a = append(a, [2]string{"position", ""})
			if n.fsys.core.AckRate(m.Queue) > 0 {
				a = append(a, [2]string{"eta_sec", ""})
			}
		}
	case queuecore.StateLeased:
		a = append(a, [2]string{"lease_deadline", ts(m.Deadline)})
	case queuecore.StateDelayed:
		a = append(a, [2]string{"due_at", ts(m.Deadline)})
	}
	if m.Consumer != "" {
		a = append(a, [2]string{"consumer", m.Consumer})
	}
	if m.Reason != "" {
		a = append(a, [2]string{"reason", m.Reason}, [2]string{"reason_message", m.ReasonMessage})
	}
	if !m.FailedAt.IsZero() {
		a = append(a, [2]string{"failed_at", ts(m.FailedAt)})
	}
	if m.DedupKey != "" {
		a = append(a, [2]string{"dedup_key", m.DedupKey})
	}
	return a
}

// xattrs returns the node's attributes: a message's, or what a producer
// set on a file before its commit.
func (n *msgNode) xattrs(ctx context.Context, want string) ([][2]string, syscall.Errno) {
	n.mu.Lock()
	if p := n.pend; p != nil {
		var a [][2]string
		if p.delay > 0 {
			a = append(a, [2]string{"delay_sec", strconv.FormatFloat(p.delay.Seconds(), 'f', -1, 64)})
		}
		if p.dedupKey != "" {
			a = append(a, [2]string{"dedup_key", p.dedupKey})
		}
		n.mu.Unlock()
		return a, 0
	}
	open := n.opens > 0
	n.mu.Unlock()
	// By name: ESTALE when the name the kernel kept is no longer this
	// message's, and the kernel looks it up again and retries (as for a
	// GETATTR). With a descriptor open the call may come through it, and
	// then it is the message's wherever it is now.
	var m queuecore.Message
	var errno syscall.Errno
	if open {
		var err error
		m, err = n.messageAnywhere(ctx)
		errno = errnoOf(err)
	} else {
		m, errno = n.messageInDir(ctx)
	}
	if errno != 0 {
		return nil, errno
	}
	return n.messageXattrs(ctx, m, want), 0
}

var _ = (fs.NodeListxattrer)((*msgNode)(nil))

func (n *msgNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	a, errno := n.xattrs(ctx, "")
	if errno != 0 {
		return 0, errno
	}
	var b []byte
	for _, kv := range a {
		b = append(b, xattrPrefix+kv[0]...)
		b = append(b, 0)
	}
	return copyXattr(dest, b)
}

var _ = (fs.NodeGetxattrer)((*msgNode)(nil))

func (n *msgNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	key, ok := strings.CutPrefix(attr, xattrPrefix)
	if !ok {
		return 0, syscall.ENODATA
	}
	a, errno := n.xattrs(ctx, key)
	if errno != 0 {
		return 0, errno
	}
	for _, kv := range a {
		if kv[0] == key {
			return copyXattr(dest, []byte(kv[1]))
		}
	}
	return 0, syscall.ENODATA
}

func copyXattr(dest, value []byte) (uint32, syscall.Errno) {
	if len(dest) == 0 {
		return uint32(len(value)), 0 // the caller asks for the size
	}
	if len(dest) < len(value) {
		return 0, syscall.ERANGE
	}
	return uint32(copy(dest, value)), 0
}

// Keys a producer or consumer may set; every other user.yirangmq key is
// read-only (EPERM) and any other namespace unsupported (ENOTSUP).
var settable = map[string]bool{"reason": true, "reason_message": true, "delay_sec": true, "dedup_key": true}

var _ = (fs.NodeSetxattrer)((*msgNode)(nil))

// Setxattr: before the commit, delay_sec and dedup_key; on a leased
// message, reason and reason_message (what dlq/ records after a nack or a
// dead-lettering).
func (n *msgNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	key, ok := strings.CutPrefix(attr, xattrPrefix)
	if !ok {
		return syscall.ENOTSUP
	}
	if !settable[key] {
		errno := syscall.ENOTSUP
		if knownXattr[key] {
			errno = syscall.EPERM
		}
		return n.fsys.refuse(refusal{msg: "setxattr refused", queue: n.queue, name: n.nameNow(), uid: callerUID(ctx), errno: errno}, "attr", attr)
	}
	value := strings.TrimSpace(string(data))
	n.mu.Lock()
	if p := n.pend; p != nil {
		defer n.mu.Unlock()
		if p.done {
			return syscall.EPERM
		}
		switch key {
		case "delay_sec":
			s, err := strconv.ParseFloat(value, 64)
			if err != nil || s < 0 || s > 7*24*3600 {
				return n.fsys.refuse(refusal{msg: "setxattr refused: delay_sec must be 0 to 604800 seconds", queue: n.queue, name: n.name, uid: callerUID(ctx), errno: syscall.EINVAL}, "value", value)
			}
			p.delay = time.Duration(s * float64(time.Second))
			return 0
		case "dedup_key":
			if len(value) == 0 || len(value) > 256 {
				return syscall.EINVAL
			}
			p.dedupKey = value
			return 0
		}
		return syscall.EPERM // a reason belongs to a leased message
	}
	name := n.name
	n.mu.Unlock()
	// By a name the kernel kept from before the message moved away:
	// ESTALE, and a setxattr by path is retried after a fresh lookup, so
	// a reason cannot land on the lease someone else took of the message.
	m, errno := n.messageInDir(ctx)
	if errno != 0 {
		return errno
	}
	if m.State != queuecore.StateLeased || (key != "reason" && key != "reason_message") {
		return syscall.EPERM
	}
	reason, msg := m.Reason, m.ReasonMessage
	if !m.FailedAt.IsZero() { // the reason of an earlier failure: start afresh
		reason, msg = "", ""
	}
	if key == "reason" {
		reason = value
	} else {
		msg = value
		if reason == "" {
			reason = queuecore.ReasonHandlerFailed
		}
	}
	return errnoOf(n.fsys.core.SetReason(ctx, n.queue, name, reason, msg))
}

var knownXattr = map[string]bool{
	"id": true, "attempts": true, "position": true, "eta_sec": true, "published_at": true,
	"lease_deadline": true, "due_at": true, "reason": true, "reason_message": true,
	"failed_at": true, "consumer": true, "redrives": true, "dedup_key": true, "delay_sec": true,
}

var _ = (fs.NodeRemovexattrer)((*msgNode)(nil))

func (n *msgNode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if key, ok := strings.CutPrefix(attr, xattrPrefix); ok && knownXattr[key] {
		return syscall.EPERM
	}
	return syscall.ENODATA
}
