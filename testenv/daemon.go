package testenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ReadyFDEnv is the variable through which the daemon is given a pipe to
// write "ready\n" on once its mount serves (see cmd/yirangmq/mount.go).
const ReadyFDEnv = "YIRANGMQ_READY_FD"

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary returns the path of a yirangmq binary built from this checkout
// (once per test process), or $YIRANGMQ_BIN when set.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("YIRANGMQ_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Dir(filepath.Dir(file))
		dir, err := os.MkdirTemp("", "yirangmq-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "yirangmq")
		cmd := exec.Command("go", "build", "-o", buildPath, "./cmd/yirangmq")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// TransportEnv names the variable that chooses the transport of every
// daemon a test starts (`yirangmq mount --transport`): classic or uring;
// unset, the daemon's default (auto). make test runs the suites that
// mount once per transport.
const TransportEnv = "YIRANGMQ_TEST_TRANSPORT"

// DaemonOptions say how to mount.
type DaemonOptions struct {
	Backend string   // sqlite (default) or fs
	Sync    string   // full (default), normal or off
	Store   string   // default: a new temporary directory
	Args    []string // more flags for yirangmq mount
	// Wrap is a command prefix to run the daemon under: the command is
	// Wrap[0] Wrap[1:]... BINARY mount .... The prefix must exec the
	// binary in its own process, keeping the environment and fd 3 (as
	// nsenter --net=PATH -- and env do), so that Pid, Stop and Kill reach
	// the daemon itself.
	Wrap []string
}

// Daemon is a yirangmq mount served by a child process.
type Daemon struct {
	Mountpoint string
	Store      string
	opts       DaemonOptions
	bin        string
	cmd        *exec.Cmd
	log        *SyncBuffer
	exited     chan struct{}
}

// StartDaemon mounts a store in a new temporary directory with the daemon
// as a child process, waits until it says ready (20 s at most), and makes
// sure the mount goes away when the test ends, whatever happens.
func StartDaemon(t testing.TB, opts DaemonOptions) *Daemon {
	t.Helper()
	if opts.Backend == "" {
		opts.Backend = "sqlite"
	}
	if opts.Sync == "" {
		opts.Sync = "full"
	}
	if opts.Store == "" {
		opts.Store = filepath.Join(t.TempDir(), "store")
	}
	d := &Daemon{Mountpoint: filepath.Join(t.TempDir(), "mnt"), Store: opts.Store, opts: opts, bin: Binary(t)}
	if err := os.MkdirAll(d.Mountpoint, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("stop daemon: %v", err)
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.Log())
		}
	})
	if err := d.start(); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *Daemon) start() error {
	args := append([]string{"mount", "--backend", d.opts.Backend, "--store", d.opts.Store, "--sync", d.opts.Sync}, d.opts.Args...)
	if tr := os.Getenv(TransportEnv); tr != "" && !slices.Contains(d.opts.Args, "--transport") {
		args = append(args, "--transport", tr)
	}
	args = append(args, d.Mountpoint)
	if w := d.opts.Wrap; len(w) > 0 {
		d.cmd = exec.Command(w[0], append(append(w[1:len(w):len(w)], d.bin), args...)...)
	} else {
		d.cmd = exec.Command(d.bin, args...)
	}
	d.log = &SyncBuffer{}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited, ready, err := StartReady(d.cmd, 20*time.Second)
	d.exited = exited
	switch {
	case err != nil:
		return err
	case !ready:
		select {
		case <-exited:
			return fmt.Errorf("daemon stopped before it was ready:\n%s", d.Log())
		default:
			kerr := d.Kill()
			return errors.Join(fmt.Errorf("daemon not ready after 20 s:\n%s", d.Log()), kerr)
		}
	}
	return nil
}

// StartReady starts cmd with the ready pipe of the daemon's handshake
// (ReadyFDEnv=3) and waits until it writes "ready" (ready is true), stops
// (ready is false, exited is closed), or timeout passes (ready is false,
// the process still runs). exited is closed when the process ends.
func StartReady(cmd *exec.Cmd, timeout time.Duration) (exited chan struct{}, ready bool, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, false, err
	}
	defer r.Close()
	cmd.Env = append(os.Environ(), ReadyFDEnv+"=3")
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, false, err
	}
	w.Close()
	exited = make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	said := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(r).ReadString('\n')
		said <- line == "ready\n"
	}()
	select {
	case ok := <-said:
		if !ok {
			<-exited
		}
		return exited, ok, nil
	case <-time.After(timeout):
		return exited, false, nil
	}
}

// Log is what the daemon printed so far.
func (d *Daemon) Log() string { return d.log.String() }

// Pid is the daemon's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Path joins elements to the mountpoint.
func (d *Daemon) Path(elem ...string) string {
	return filepath.Join(append([]string{d.Mountpoint}, elem...)...)
}

// Metric reads one value of MOUNT/.metrics.
func (d *Daemon) Metric(t testing.TB, name string) int64 {
	t.Helper()
	f, err := os.Open(d.Path(".metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return int64(n)
		}
	}
	t.Fatalf("no %s in .metrics", name)
	return 0
}

// Stop sends SIGTERM and waits for a clean unmount; past 10 s it kills the
// daemon. Either way the mountpoint is unmounted when Stop returns.
func (d *Daemon) Stop() error {
	if d.cmd == nil || d.cmd.Process == nil {
		return nil
	}
	return StopDaemon(d.cmd, d.exited, d.Mountpoint)
}

// StopDaemon stops a daemon started with StartReady: SIGTERM, up to 10 s
// for its clean unmount, then SIGKILL; mountpoint is unmounted after. A
// daemon that exits on SIGTERM but leaves its mount behind is an error:
// the cleanup's unmount must not hide it.
func StopDaemon(cmd *exec.Cmd, exited <-chan struct{}, mountpoint string) error {
	var err error
	select {
	case <-exited:
	default:
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			if IsMounted(mountpoint) {
				err = fmt.Errorf("daemon exited on SIGTERM but left %s mounted", mountpoint)
			}
		case <-time.After(10 * time.Second):
			err = errors.New("daemon did not stop within 10 s of SIGTERM; killed")
			cmd.Process.Kill()
			<-exited
		}
	}
	if uerr := Unmount(mountpoint); uerr != nil && err == nil {
		err = uerr
	}
	return err
}

// Kill kills the daemon with SIGKILL, as a crash would, and waits for the
// process to exit, as a supervisor does. It does nothing else: the dead
// mount stays where it was (its users get ENOTCONN) until Restart's
// `yirangmq mount` detaches it, or the test's cleanup does. It returns an
// error, with the state and kernel wait channel of each thread left, when
// the process is still there after ExitGrace: a killed daemon that cannot
// exit is a wedged mount.
func (d *Daemon) Kill() error {
	_, err := d.KillAndWait(ExitGrace)
	return err
}

// ExitGrace is how long a killed daemon may take to exit before Kill calls
// it stuck.
const ExitGrace = 10 * time.Second

// KillAndWait sends SIGKILL and waits up to grace for the process to exit,
// and reports how long it took.
func (d *Daemon) KillAndWait(grace time.Duration) (time.Duration, error) {
	if d.cmd == nil || d.cmd.Process == nil {
		return 0, nil
	}
	pid := d.cmd.Process.Pid
	t0 := time.Now()
	d.cmd.Process.Kill()
	select {
	case <-d.exited:
		return time.Since(t0), nil
	case <-time.After(grace):
		return time.Since(t0), fmt.Errorf("daemon %d still there %v after SIGKILL; its threads:\n%s", pid, grace, ThreadStates(pid))
	}
}

// ThreadStates lists the threads of pid with their state, kernel wait
// channel and, for those asleep uninterruptibly, their kernel stack.
func ThreadStates(pid int) string {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	var b strings.Builder
	for _, task := range tasks {
		stat, err := os.ReadFile(filepath.Join(task, "stat"))
		if err != nil {
			continue
		}
		// The state follows the parenthesised command name.
		state := "?"
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
			state = string(stat[i+2])
		}
		wchan, _ := os.ReadFile(filepath.Join(task, "wchan"))
		fmt.Fprintf(&b, "thread %s state %s wchan %s\n", filepath.Base(task), state, wchan)
		if state == "D" {
			stack, _ := os.ReadFile(filepath.Join(task, "stack"))
			b.Write(stack)
		}
	}
	if b.Len() == 0 {
		return "(no threads left)"
	}
	return b.String()
}

// DeadMountAnswers checks that the mount a killed daemon left fails with
// ENOTCONN instead of hanging, each call within grace. (A stat may still
// be answered from the kernel's attribute cache; opening the directory
// needs the daemon.)
//
// Over FUSE's io_uring the kernel ends the connection some milliseconds
// after the process is gone, once io_uring's cleanup of the dead rings
// lets go of /dev/fuse (docs/fusefs.md). A call made before that fails at
// once with ECANCELED when the kernel hands it to a ring entry whose
// thread is gone, or waits for the end and fails with ECONNABORTED. So
// when the daemon may have served through io_uring (rings), opens that
// fail with those are taken until one fails with ENOTCONN, all within
// grace.
func DeadMountAnswers(mp string, grace time.Duration, rings bool) error {
	deadline := time.Now().Add(grace)
	var seen []string
	for {
		answer, err := openDeadMount(mp, grace)
		switch {
		case err != nil:
			return err
		case errors.Is(answer, unix.ENOTCONN):
			return nil
		case rings && (errors.Is(answer, unix.ECANCELED) || errors.Is(answer, unix.ECONNABORTED)) && time.Now().Before(deadline):
			seen = append(seen, answer.Error())
		default:
			return fmt.Errorf("opening the dead mount %s: %v after %v, want ENOTCONN", mp, answer, seen)
		}
	}
}

// openDeadMount opens mp once and returns how that failed; err is set
// when the open did not return within grace, or succeeded.
func openDeadMount(mp string, grace time.Duration) (answer, err error) {
	done := make(chan error, 1)
	go func() {
		fd, err := unix.Open(mp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		done <- err
	}()
	select {
	case answer := <-done:
		if answer == nil {
			return nil, fmt.Errorf("opening the dead mount %s: it opened", mp)
		}
		return answer, nil
	case <-time.After(grace):
		return nil, fmt.Errorf("opening the dead mount %s: no answer in %v: the mount is wedged", mp, grace)
	}
}

// MayUseRings reports whether the daemons StartDaemon starts may serve
// through io_uring: their transport (TransportEnv) is not classic.
func MayUseRings() bool { return os.Getenv(TransportEnv) != "classic" }

// Restart starts the daemon again on the same store and mountpoint.
func (d *Daemon) Restart(t testing.TB) {
	t.Helper()
	if err := d.start(); err != nil {
		t.Fatal(err)
	}
}

// Unmount unmounts mp if it is mounted: normally first, lazily when busy
// or dead, retrying for a while.
func Unmount(mp string) error {
	for i := 0; i < 50; i++ {
		if !IsMounted(mp) {
			return nil
		}
		flags := 0
		if i >= 5 {
			flags = unix.MNT_DETACH
		}
		if err := unix.Unmount(mp, flags); err == nil || errors.Is(err, unix.EINVAL) {
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
	if IsMounted(mp) {
		return fmt.Errorf("%s is still mounted", mp)
	}
	return nil
}

// IsMounted reports whether mp is a mountpoint in /proc/mounts.
func IsMounted(mp string) bool {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && unescapeMount(f[1]) == mp {
			return true
		}
	}
	return false
}

// CleanLeftoverMounts detaches dead yirangmq mounts below the temporary
// directory that an earlier, killed test run left behind. Live mounts are
// left alone: they belong to test processes running now (go test runs
// packages in parallel).
func CleanLeftoverMounts() {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	tmp := os.TempDir()
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != "fuse.yirangmq" || !strings.HasPrefix(unescapeMount(f[1]), tmp) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(unescapeMount(f[1]), &st); errors.Is(err, unix.ENOTCONN) {
			_ = unix.Unmount(unescapeMount(f[1]), unix.MNT_DETACH)
		}
	}
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// SyncBuffer is a bytes.Buffer safe for a writer and a reader at once:
// a child process's output that a test reads while it runs.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
