package fusefs

import (
	"context"
	"log/slog"
	"syscall"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// refusal is an operation refused for its input (or for want of room), as
// its log line and its queue's .stats tell it (refuse).
type refusal struct {
	msg   string // the kind of refusal: the log line's message
	queue string // "" at the top of the mount
	name  string
	uid   uint32 // who asked
	errno syscall.Errno
	err   error // why, when msg does not say it all
	// info logs at level INFO rather than WARN: a refusal that well-behaved
	// clients meet (a name live already, a full queue).
	info bool
	// logged: the core logged it already; it is only recorded.
	logged bool
	// policy: a .policy document, which reads back with its refusal.
	policy bool
}

// refuse logs r, naming the caller's uid (the daemon's log rate-limits
// lines that name a uid per kind and per uid, so one user's flood of bad
// input cannot fill the log, cmd/yirangmq/logging.go), records it among
// its queue's last refusals (.stats, `yirangmq status`) and returns its
// errno. A shell's builtin echo ignores the errno of close(2): .stats is
// where its writer can see it.
func (f *FS) refuse(r refusal, attrs ...any) syscall.Errno {
	if !r.logged {
		args := make([]any, 0, 8+len(attrs))
		if r.queue != "" {
			args = append(args, queuecore.LogQueue, r.queue)
		}
		if r.name != "" {
			args = append(args, queuecore.LogName, r.name)
		}
		args = append(args, queuecore.LogUID, r.uid)
		if r.err != nil {
			args = append(args, queuecore.LogErr, r.err)
		}
		level := slog.LevelWarn
		if r.info {
			level = slog.LevelInfo
		}
		f.log.Log(context.Background(), level, r.msg, append(args, attrs...)...)
	}
	if r.queue != "" && f.core != nil {
		reason := r.msg
		if r.err != nil {
			reason += ": " + r.err.Error()
		}
		x := queuecore.Refusal{Name: r.name, Errno: unix.ErrnoName(r.errno), Reason: reason, UID: r.uid}
		if r.policy {
			f.core.NotePolicyRefusal(r.queue, x)
		} else {
			f.core.NoteRefusal(r.queue, x)
		}
	}
	return r.errno
}

// callerUID is the uid of the process that made a request.
func callerUID(ctx context.Context) uint32 {
	uid, _, _ := caller(ctx)
	return uid
}
