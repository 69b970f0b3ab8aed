package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// mountSpec says how to mount one store.
type mountSpec struct {
	backend, sync string
	// transport is the daemon's --transport; empty passes none (the
	// daemon's default, or a build from before the flag).
	transport    string
	cacheTimeout time.Duration
	debug        bool
}

func (s mountSpec) String() string {
	name := s.backend + "-" + s.sync + "-cache" + s.cacheTimeout.String()
	if s.transport != "" {
		name += "-" + s.transport
	}
	if s.debug {
		name += "-debug"
	}
	return name
}

// args are the yirangmq command line that mounts store on mnt.
func (s mountSpec) args(store, mnt string) []string {
	args := []string{"mount", "--backend", s.backend, "--store", store, "--sync", s.sync,
		"--cache-timeout", s.cacheTimeout.String()}
	if s.debug {
		args = append(args, "--debug")
	}
	if s.transport != "" {
		args = append(args, "--transport", s.transport)
	}
	return append(args, mnt)
}

// daemon is a yirangmq mount served by a child process, started with the
// ready handshake of testenv.StartDaemon (which needs a testing.TB).
type daemon struct {
	mnt, store, logPath string
	cmd                 *exec.Cmd
	logFile             *os.File
	exited              chan struct{}
}

// startDaemon mounts a new store under dir and waits until the daemon
// says ready. The caller must call stop on every path (the bench's
// cleanup list does).
func startDaemon(bin, dir string, spec mountSpec) (*daemon, error) {
	d := &daemon{
		mnt:     filepath.Join(dir, "mnt"),
		store:   filepath.Join(dir, "store"),
		logPath: filepath.Join(dir, "daemon.log"),
	}
	if err := os.MkdirAll(d.mnt, 0o755); err != nil {
		return nil, err
	}
	lf, err := os.Create(d.logPath)
	if err != nil {
		return nil, err
	}
	d.logFile = lf
	d.cmd = exec.Command(bin, spec.args(d.store, d.mnt)...)
	d.cmd.Stdout, d.cmd.Stderr = lf, lf
	// If the bench dies without its cleanup (SIGKILL), the daemon gets
	// SIGTERM and unmounts by itself. Daemons are started from the main
	// goroutine, locked to the main thread, which lives as long as we do.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	exited, ready, err := testenv.StartReady(d.cmd, 20*time.Second)
	if err != nil {
		lf.Close()
		return nil, fmt.Errorf("start daemon: %w", err)
	}
	d.exited = exited
	select {
	case <-exited:
		d.logFile.Close()
		return nil, fmt.Errorf("daemon %s stopped before it was ready:\n%s", spec, d.tail(2000))
	default:
	}
	if !ready {
		d.stop()
		return nil, fmt.Errorf("daemon %s not ready after 20 s:\n%s", spec, d.tail(2000))
	}
	return d, nil
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// gone tells whether the daemon has exited.
func (d *daemon) gone() bool {
	select {
	case <-d.exited:
		return true
	default:
		return false
	}
}

// tail returns the last n bytes of the daemon's log.
func (d *daemon) tail(n int64) string {
	b, err := os.ReadFile(d.logPath)
	if err != nil {
		return ""
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return string(b)
}

// stop sends SIGTERM, waits for the clean unmount (10 s, then SIGKILL),
// and makes sure the mountpoint is unmounted. Safe to call twice.
func (d *daemon) stop() error {
	if d == nil || d.cmd == nil || d.cmd.Process == nil {
		return nil
	}
	err := testenv.StopDaemon(d.cmd, d.exited, d.mnt)
	d.logFile.Close()
	return err
}

// connection returns the FUSE connection number of the mount, as the
// kernel's fuse tracepoints print it (the mount's dev_t, kernel encoding).
func (d *daemon) connection() (uint32, error) {
	var st unix.Stat_t
	if err := unix.Stat(d.mnt, &st); err != nil {
		return 0, err
	}
	return kernelDev(st.Dev), nil
}

// kernelDev converts a user-space dev_t to the kernel's internal
// encoding (major<<20 | minor) that tracepoints print.
func kernelDev(dev uint64) uint32 {
	return unix.Major(dev)<<20 | unix.Minor(dev)
}

// procCPU returns the user+system CPU time a process has used.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command may hold spaces; fields count from after its ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("odd /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("odd /proc/%d/stat", pid)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on every Linux we run on.
const clockTicks = 100

// machineBusy returns the busy and total CPU time of the machine from
// /proc/stat, to tell how much of it other processes took during a phase.
func machineBusy() (busy, total time.Duration, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0, errors.New("odd /proc/stat")
	}
	var sum, idle int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 8 { // guest time is already counted in user
			break
		}
		sum += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	tick := time.Second / clockTicks
	return time.Duration(sum-idle) * tick, time.Duration(sum) * tick, nil
}

// detachDeadBenchMounts lazily unmounts mounts a killed earlier run of
// this bench left behind ("Transport endpoint is not connected"). Live
// mounts, which may belong to a bench running now, are left alone.
func detachDeadBenchMounts() {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || (f[2] != "fuse.yirangmq" && f[2] != "fuse."+loopbackFSName) || !strings.Contains(f[1], "/"+workPrefix) {
			continue
		}
		mp := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(f[1])
		var st unix.Stat_t
		if err := unix.Stat(mp, &st); errors.Is(err, unix.ENOTCONN) {
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	}
}
