package torture

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/fusefs"
	"yirangmq/testenv"
)

// The harness kills like a supervisor and helps nothing: SIGKILL, then it
// waits for the process to exit, and the next `yirangmq mount` on the
// mountpoint has to deal with the dead mount it left. It never aborts a
// FUSE connection nor detaches a mount between kills, and its clients are
// plain system calls without timeouts. What it watches for instead:
//
//   - a daemon still there StuckAfter after SIGKILL (one thread asleep in
//     the kernel keeps the process, /dev/fuse and so the mount alive);
//   - a client system call blocked for longer than StuckAfter (a .next
//     read may wait for a message while its daemon lives, so its clock
//     starts at the later of its start and the last kill of its daemon);
//   - an old mount that does not answer ENOTCONN once its daemon is gone;
//   - a new daemon that had to abort a wedged connection to mount.
//
// Only once such a failure is recorded does the harness abort the stuck
// connection, so that the failed run can end and report.

// StuckAfter is how long a killed daemon may take to exit, and a client
// call may stay blocked, before the run fails.
const StuckAfter = 10 * time.Second

// alive reports whether pid exists and has not yet been reaped.
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// deadMountAnswers checks that the mount a killed daemon left fails
// with ENOTCONN instead of hanging (testenv.DeadMountAnswers, which
// takes the ECANCELED and ECONNABORTED of FUSE's io_uring before it).
func deadMountAnswers(mp string) error {
	return testenv.DeadMountAnswers(mp, StuckAfter, testenv.MayUseRings())
}

// abortMount frees a mount whose daemon or clients are stuck, once the
// failure has been recorded, so that the run can end.
func abortMount(mp string) {
	if info, ok, err := fusefs.LookupMount(mp); err == nil && ok && info.Conn != "" {
		_ = fusefs.AbortConnection(info.Conn)
	}
}

// watchdog knows every client's system call in flight.
type watchdog struct {
	mu      sync.Mutex
	clients []*client
	kills   map[*mountState]time.Time // last kill of each mount's daemon
}

func newWatchdog() *watchdog { return &watchdog{kills: map[*mountState]time.Time{}} }

func (w *watchdog) add(c *client) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.clients = append(w.clients, c)
}

func (w *watchdog) killed(m *mountState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.kills[m] = time.Now()
}

// stuck returns a description of each client call blocked past limit.
func (w *watchdog) stuck(limit time.Duration) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	now := time.Now()
	for _, c := range w.clients {
		start := c.inflight.Load()
		if start == 0 {
			continue
		}
		since := time.Unix(0, start)
		call, _ := c.call.Load().(string)
		if strings.HasPrefix(call, "read .next") {
			if k := w.kills[c.m]; k.After(since) {
				since = k
			}
		}
		if d := now.Sub(since); d > limit {
			tid := c.tid.Load()
			wchan, _ := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/wchan", tid))
			stack, _ := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stack", tid))
			out = append(out, fmt.Sprintf("client %s: %s blocked for %v, thread %d wchan %s\n%s",
				c.name, call, d.Round(time.Second), tid, wchan, stack))
		}
	}
	return out
}

// pin binds the calling goroutine to its thread, so that the watchdog can
// read the kernel's wait channel of a blocked call; unpin lets it go.
// A goroutine must unpin before it ends: Go ends a thread whose locked
// goroutine exits, and a child process started from that thread with a
// parent-death signal (the daemons, the PostgreSQL server) would die too.
func (c *client) pin() {
	runtime.LockOSThread()
	c.tid.Store(int32(unix.Gettid()))
}

func (c *client) unpin() { runtime.UnlockOSThread() }

// begin and end bracket a system call for the watchdog.
func (c *client) begin(call string) {
	c.call.Store(call)
	c.inflight.Store(time.Now().UnixNano())
}

func (c *client) end() { c.inflight.Store(0) }

// clientState is what the watchdog reads of a client.
type clientState struct {
	inflight atomic.Int64 // start of the call in flight (UnixNano), 0 when none
	call     atomic.Value // string: the call in flight
	tid      atomic.Int32
}

// killDaemon kills d like a supervisor and waits for it to exit; it
// returns how long that took, and an error when it did not within
// StuckAfter (with the threads left and what they wait on).
func killDaemon(d *testenv.Daemon) (time.Duration, error) {
	return d.KillAndWait(StuckAfter)
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// cleanStaleRuns detaches the mounts that torture runs of processes no
// longer alive left under base (one directory per process id), aborting
// their connections first, and removes those directories. Live runs of
// other processes are left alone. This is cleanup before a run, of what
// an earlier, failed or interrupted test process left behind.
func cleanStaleRuns(base string) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || alive(pid) {
			continue
		}
		dir := filepath.Join(base, e.Name())
		for _, mp := range mountsUnder(dir) {
			abortMount(mp)
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
		if len(mountsUnder(dir)) == 0 {
			os.RemoveAll(dir)
		}
	}
}

func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 {
			if mp := unescapeMount(f[4]); strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
			}
		}
	}
	return out
}
