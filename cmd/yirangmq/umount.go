package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"yirangmq/fusefs"
)

// runUmount unmounts a mount and waits for its daemon to exit, so that a
// script can restart it, back the store up or unplug the device after it.
//
// A daemon stops once the kernel lets go of its mount, and the kernel
// lets go only when no mount namespace holds a copy of it any more: a
// container, `unshare -m`, a systemd service with PrivateTmp= started
// while the mount was there each hold one, and the daemon then serves on
// after the unmount here. umount says so, names the holders and how to
// finish, rather than return 0 as if the daemon had stopped.
func runUmount(ctx context.Context, env *cliEnv, args []string) error {
	fl := pflag.NewFlagSet("umount", pflag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintln(fl.Output(), "Usage: yirangmq umount [OPTIONS] MOUNTPOINT\n\nUnmounts a yirangmq mount and waits until its daemon has exited (the store\nis then closed). If the daemon cannot exit because another mount namespace\nstill holds the mount, says which processes hold it and how to finish.\n\nOptions:")
		printOptions(fl)
	}
	lazy := fl.BoolP("lazy", "l", false, "detach now even if busy, and do not wait (the daemon stops when the last user leaves)")
	timeout := fl.Duration("timeout", time.Minute, "how long to wait for the daemon to exit after the unmount")
	if ok, err := parseFlags(env, fl, args); !ok {
		return err
	}
	if fl.NArg() != 1 {
		fmt.Fprintln(env.stderr, "yirangmq umount: exactly one MOUNTPOINT is needed")
		return errUsage
	}
	mp, err := filepath.Abs(fl.Arg(0))
	if err != nil {
		return err
	}
	// /proc/self/mountinfo names the mountpoint without symlinks. (The
	// mountpoint itself is the mount's root, which a dead mount cannot
	// stat: then the path stays as given.)
	if dir, err := filepath.EvalSymlinks(filepath.Dir(mp)); err == nil {
		mp = filepath.Join(dir, filepath.Base(mp))
	}
	info, mounted, err := fusefs.LookupMount(mp)
	switch {
	case err != nil:
		return fmt.Errorf("unmount %s: %w", mp, err)
	case !mounted:
		return fmt.Errorf("unmount %s: not a mountpoint", mp)
	case info.FSType != "fuse.yirangmq":
		return fmt.Errorf("unmount %s: not a yirangmq mount (%s); use umount(8)", mp, info.FSType)
	}
	// The daemon, held by a pidfd from before the unmount: its pid cannot
	// be reused by another process while we wait.
	pid := daemonPid(mp)
	pidfd := -1
	if pid > 0 {
		if fd, err := unix.PidfdOpen(pid, 0); err == nil {
			pidfd = fd
			defer unix.Close(pidfd)
		}
	}
	if err := unmount(mp, *lazy); err != nil {
		return err
	}
	if *lazy {
		return nil
	}
	return waitForDaemon(ctx, mp, pid, pidfd, info.Conn, *timeout)
}

// waitForDaemon waits, after the unmount of mp, until its daemon has
// exited, says who holds the mount in another namespace if one does, or
// gives up after timeout.
func waitForDaemon(ctx context.Context, mp string, pid, pidfd int, conn string, timeout time.Duration) error {
	// Without the daemon's pid (its .stats did not answer in time: a
	// dead mount, or a daemon busy under load), its FUSE connection
	// tells: it goes when the daemon has let go of /dev/fuse.
	gone := func() bool {
		if pidfd >= 0 {
			return exited(pidfd, time.Second)
		}
		if conn == "" {
			return true
		}
		if _, err := os.Stat("/sys/fs/fuse/connections/" + conn); errors.Is(err, os.ErrNotExist) {
			return true
		}
		time.Sleep(time.Second)
		return false
	}
	deadline := time.Now().Add(timeout)
	for {
		if gone() {
			return nil
		}
		if holders := mountHolders(conn); len(holders) > 0 {
			return heldElsewhere(mp, pid, holders)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("unmounted %s, but its daemon (pid %d) has not exited %s later: see its log", mp, pid, timeout)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("unmounted %s; interrupted while the daemon (pid %d) was stopping", mp, pid)
		}
	}
}

// unmount unmounts mp in this mount namespace.
func unmount(mp string, lazy bool) error {
	flags := 0
	if lazy {
		flags = unix.MNT_DETACH
	}
	err := unix.Unmount(mp, flags)
	if errors.Is(err, unix.EPERM) {
		// Not root: fusermount3 can unmount what this user mounted.
		fargs := []string{"-u", mp}
		if lazy {
			fargs = []string{"-u", "-z", mp}
		}
		if out, ferr := exec.Command("fusermount3", fargs...).CombinedOutput(); ferr != nil {
			return fmt.Errorf("unmount %s: %s", mp, strings.TrimSpace(string(out)))
		}
		return nil
	}
	switch {
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("unmount %s: busy: a process has a file open or its working directory there (try fuser -m %s, or --lazy)", mp, mp)
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("unmount %s: not a mountpoint", mp)
	case err != nil:
		return fmt.Errorf("unmount %s: %w", mp, err)
	}
	return nil
}

// daemonPid reads the daemon's pid from MOUNT/.stats, or 0 when the
// mount does not answer within 15 s (a dead or wedged mount).
func daemonPid(mp string) int {
	got := make(chan int, 1)
	go func() {
		var d struct {
			Pid int `json:"pid"`
		}
		b, err := os.ReadFile(filepath.Join(mp, ".stats"))
		if err == nil {
			err = json.Unmarshal(b, &d)
		}
		got <- d.Pid
	}()
	select {
	case pid := <-got:
		return pid
	case <-time.After(15 * time.Second):
		return 0
	}
}

// exited waits up to d for the process of pidfd to exit.
func exited(pidfd int, d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, int(d.Milliseconds()))
	for errors.Is(err, unix.EINTR) {
		n, err = unix.Poll(fds, int(d.Milliseconds()))
	}
	return err == nil && n > 0
}

// holder is a mount namespace that still holds a mount: a process in it,
// and where the mount is there.
type holder struct {
	pid  int
	comm string
	at   string
}

// mountHolders finds the mount namespaces that still hold FUSE connection
// conn (the device 0:conn), one process of each (the lowest pid): every
// process's /proc/PID/mountinfo lists the mounts of its namespace.
func mountHolders(conn string) []holder {
	if conn == "" {
		return nil
	}
	dev := "0:" + conn
	procs, _ := os.ReadDir("/proc")
	seen := map[string]bool{}
	var out []holder
	pids := make([]int, 0, len(procs))
	for _, p := range procs {
		if pid, err := strconv.Atoi(p.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid)
		ns, err := os.Readlink(dir + "/ns/mnt")
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		at, ok := mountOf(dir+"/mountinfo", dev)
		if !ok {
			continue
		}
		comm, _ := os.ReadFile(dir + "/comm")
		out = append(out, holder{pid: pid, comm: strings.TrimSpace(string(comm)), at: at})
	}
	return out
}

// mountOf returns where a mountinfo file has a yirangmq mount of device
// dev.
func mountOf(path, dev string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[2] != dev {
			continue
		}
		for i := 5; i+1 < len(fields); i++ {
			if fields[i] == "-" && fields[i+1] == "fuse.yirangmq" {
				return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(fields[4]), true
			}
		}
	}
	return "", false
}

// heldElsewhere explains why the daemon goes on serving.
func heldElsewhere(mp string, pid int, holders []holder) error {
	var b strings.Builder
	daemon, kill := fmt.Sprintf("the daemon (pid %d)", pid), fmt.Sprintf("`kill %d`", pid)
	if pid <= 0 {
		daemon, kill = "the daemon", "kill the daemon"
	}
	fmt.Fprintf(&b, "unmounted %s here, but %s keeps serving: %d other mount namespace(s) still hold the mount, so the kernel has not let it go:", mp, daemon, len(holders))
	for i, h := range holders {
		if i == 5 {
			fmt.Fprintf(&b, "\n  and %d more", len(holders)-i)
			break
		}
		fmt.Fprintf(&b, "\n  pid %d (%s) has it at %s", h.pid, h.comm, h.at)
	}
	h := holders[0]
	fmt.Fprintf(&b, "\nFinish with `nsenter -t %d -m umount %s` for each (or stop those processes): the daemon then exits by itself. Or %s: it stops within seconds, and the mounts left elsewhere then fail with ENOTCONN.", h.pid, h.at, kill)
	return errors.New(b.String())
}
