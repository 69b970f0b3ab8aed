package torture

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/fusefs"
)

// A SIGKILL does not always end a FUSE daemon. The kernel only aborts a
// FUSE connection when the last thread of the daemon lets go of
// /dev/fuse, and a daemon thread that was sending an entry invalidation
// (FUSE_NOTIFY_INVAL_ENTRY) sleeps uninterruptibly in
// fuse_reverse_inval_entry for the lock of the parent directory. When a
// client holds that lock while it waits for the daemon's answer to a
// request of its own (a rename, a create, an unlink in that directory),
// the killed daemon never answers and never exits: a zombie that keeps
// the store locked, its clients stuck in D state, the mount wedged until
// someone writes to /sys/fs/fuse/connections/N/abort. An operator has to
// do just that; so does the torture, and it counts how often it had to.

// fuseConn returns the FUSE connection number of the mount at mp, read
// from /proc/self/mountinfo without touching the mount.
func fuseConn(mp string) (string, error) {
	info, ok, err := fusefs.LookupMount(mp)
	switch {
	case err != nil:
		return "", err
	case !ok:
		return "", fmt.Errorf("%s is not mounted", mp)
	case info.Conn == "":
		return "", fmt.Errorf("%s is not a FUSE mount", mp)
	}
	return info.Conn, nil
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// alive reports whether pid exists and has not yet been reaped.
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// sigkill kills the daemon pid serving mp and waits until it is gone
// (reaped by the harness, which waits for it). When it lingers past
// grace, it aborts the mount's FUSE connection and returns the kernel
// stacks of the daemon's stuck threads as wedged, and those of this
// process (the clients) as they were before the abort.
func sigkill(pid int, mp string, grace time.Duration) (wedged, clientStacks string, err error) {
	conn, cerr := fuseConn(mp)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return "", "", fmt.Errorf("kill %d: %w", pid, err)
	}
	deadline := time.Now().Add(grace)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !alive(pid) {
		return "", "", nil
	}
	wedged = kernelStacks(pid)
	if wedged == "" {
		wedged = "(no thread in D state)"
	}
	clientStacks = kernelStacks(os.Getpid())
	if cerr != nil {
		return wedged, clientStacks, fmt.Errorf("daemon %d did not die within %v of SIGKILL, and its connection is unknown: %w", pid, grace, cerr)
	}
	if err := fusefs.AbortConnection(conn); err != nil {
		return wedged, clientStacks, fmt.Errorf("daemon %d did not die within %v of SIGKILL; abort of FUSE connection %s: %w", pid, grace, conn, err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if alive(pid) {
		return wedged, clientStacks, fmt.Errorf("daemon %d still there 10 s after its FUSE connection %s was aborted", pid, conn)
	}
	return wedged, clientStacks, nil
}

// kernelStacks returns the kernel stacks of pid's threads that sleep
// uninterruptibly (state D), for the report of a wedge.
func kernelStacks(pid int) string {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	var b strings.Builder
	for _, t := range tasks {
		stat, err := os.ReadFile(filepath.Join(t, "stat"))
		if err != nil {
			continue
		}
		// The state follows the parenthesised command name.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] != 'D' {
			continue
		}
		stack, _ := os.ReadFile(filepath.Join(t, "stack"))
		fmt.Fprintf(&b, "thread %s (D):\n%s", filepath.Base(t), stack)
	}
	return b.String()
}

// cleanStaleRuns detaches the mounts that torture runs of processes no
// longer alive left under base (one directory per process id), aborting
// their connections first, and removes those directories. Live runs of
// other processes are left alone.
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
			if conn, err := fuseConn(mp); err == nil {
				_ = fusefs.AbortConnection(conn)
			}
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
