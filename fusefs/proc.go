package fusefs

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// FUSE tells a request's thread id; the commit point and
// user.yirangmq.consumer need its process. /proc says, at a price: a read
// of /proc/TID/status or /proc/TID/comm costs about as much as a FUSE
// request (docs/performance-history.md), and a lease or a publish would
// pay it every time.
// So these helpers ask /proc as little as they can.

// sameProcess reports whether two threads belong to one process (thread
// group). A close on the thread that created the file costs nothing;
// otherwise one path lookup answers: /proc/A/task/B exists only while B is
// a thread of A's thread group (the kernel checks exactly that). A thread that has exited belongs to no group it can be proven to
// share, as before: the commit then waits for RELEASE.
func sameProcess(tid, other uint32) bool {
	return tid == other || tid != 0 && other != 0 && unix.Access(taskPath(other, tid), unix.F_OK) == nil
}

// taskPath is /proc/GROUP/task/TID.
func taskPath(group, tid uint32) string {
	var b [48]byte
	p := append(b[:0], "/proc/"...)
	p = strconv.AppendUint(p, uint64(group), 10)
	p = append(p, "/task/"...)
	p = strconv.AppendUint(p, uint64(tid), 10)
	return string(p)
}

// threadGroup returns the process (thread group) of a thread, from
// /proc/TID/status; the thread itself when /proc cannot say.
func threadGroup(tid uint32) uint32 {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(tid), 10) + "/status")
	if err != nil {
		return tid
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil {
				return uint32(n)
			}
		}
	}
	return tid
}

// leasers caches user.yirangmq.consumer per thread: a consumer leases
// again and again from the same few threads. An entry is used for at most
// leaserTTL, so a command that execs shows its new name soon. Within it,
// a thread that exited and whose id the kernel gave to a new process of
// the same uid (it can, at once, when its cursor is just below that id)
// is described as the old one; the /proc/PID/task/TID check this cache
// made before could not tell either when the id was a process's own (a
// single-threaded tool's), and it took 5% of the CPU the daemon spent
// answering requests in a 4-client lease benchmark. The uid is always
// the request's, never the cache's, so a lease's owner is always right.
type leasers struct {
	mu sync.Mutex
	m  map[uint32]leaser
}

type leaser struct {
	uid, pid uint32
	at       time.Time
	desc     string
}

const (
	leaserTTL  = 250 * time.Millisecond
	maxLeasers = 1024
)

// consumer describes a leaser for user.yirangmq.consumer: its uid, its
// process id (FUSE gives the thread) and its command.
func (f *FS) consumer(ctx context.Context) string {
	uid, _, tid := caller(ctx)
	now := time.Now()
	f.leasers.mu.Lock()
	e, ok := f.leasers.m[tid]
	f.leasers.mu.Unlock()
	if ok && e.uid == uid && now.Sub(e.at) < leaserTTL && tid != 0 {
		return e.desc
	}
	pid := threadGroup(tid)
	comm, _ := os.ReadFile("/proc/" + strconv.FormatUint(uint64(tid), 10) + "/comm")
	e = leaser{uid: uid, pid: pid, at: now, desc: "uid=" + strconv.FormatUint(uint64(uid), 10) +
		" pid=" + strconv.FormatUint(uint64(pid), 10) + " cmd=" + strings.TrimSpace(string(comm))}
	if tid == 0 || comm == nil {
		return e.desc // the kernel itself, or a thread already gone: nothing to keep
	}
	f.leasers.mu.Lock()
	if f.leasers.m == nil || len(f.leasers.m) >= maxLeasers {
		f.leasers.m = make(map[uint32]leaser)
	}
	f.leasers.m[tid] = e
	f.leasers.mu.Unlock()
	return e.desc
}

// signalPending reports whether thread tid has a signal pending that it
// does not block: one it has been sent and will take once it returns from
// the kernel. A signal whose action is to be ignored is dropped when sent,
// so a pending one did end an interruptible wait of that thread.
func signalPending(tid uint32) bool {
	if tid == 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(tid), 10) + "/status")
	return err == nil && pendingUnblocked(string(b))
}

// pendingUnblocked reads /proc/TID/status: whether a signal pending for
// the thread (SigPnd) or its process (ShdPnd) is not in its mask (SigBlk).
func pendingUnblocked(status string) bool {
	var pending, blocked uint64
	for _, line := range strings.Split(status, "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch key {
		case "SigPnd", "ShdPnd", "SigBlk":
			v, err := strconv.ParseUint(strings.TrimSpace(val), 16, 64)
			if err != nil {
				return false
			}
			if key == "SigBlk" {
				blocked = v
			} else {
				pending |= v
			}
		}
	}
	return pending&^blocked != 0
}
