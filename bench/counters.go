package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fuseOpcodes are the FUSE requests we count one by one (numbers from
// linux/fuse.h, as the fuse:fuse_request_send tracepoint prints them);
// everything else lands in "other".
var fuseOpcodes = []struct {
	code int
	name string
}{
	{1, "LOOKUP"}, {2, "FORGET"}, {3, "GETATTR"}, {4, "SETATTR"}, {10, "UNLINK"},
	{12, "RENAME"}, {14, "OPEN"}, {15, "READ"}, {16, "WRITE"}, {18, "RELEASE"},
	{20, "FSYNC"}, {22, "GETXATTR"}, {25, "FLUSH"}, {35, "CREATE"}, {36, "INTERRUPT"},
	{40, "POLL"}, {42, "BATCH_FORGET"}, {45, "RENAME2"},
}

// counts are what one phase cost, in kernel events.
type counts struct {
	Requests map[string]int64 // by opcode name, plus "total"
	Fsyncs   int64            // fsync/fdatasync on files of the store (ext4), -1 if unknown
}

// counter counts, with perf(1) in counting mode, the FUSE requests a
// mount receives (fuse:fuse_request_send filtered on its connection) and
// the fsyncs on its store's files (ext4:ext4_sync_file_enter filtered on
// the store's directories) while a phase runs. Counting happens in the
// kernel; nothing is recorded per event, so it costs well under a
// microsecond per request, and requests other users send to other mounts
// or files are not counted.
type counter struct {
	cmd     *exec.Cmd
	ctl     *os.File
	ack     *bufio.Reader
	ackFile *os.File
	out     bytes.Buffer
	events  []string // what each output line counts, in order
}

// perfUsable tells whether perf can count fuse tracepoints here.
func perfUsable() error {
	if _, err := exec.LookPath("perf"); err != nil {
		return err
	}
	out, err := exec.Command("perf", "list", "tracepoint").CombinedOutput()
	if err != nil {
		return fmt.Errorf("perf list: %v", err)
	}
	if !bytes.Contains(out, []byte("fuse:fuse_request_send")) {
		return errors.New("the kernel has no fuse:fuse_request_send tracepoint")
	}
	return nil
}

// storeDirs returns the device and directory inodes of a store tree, so
// that fsyncs of its files (whose parent is one of them) and of the
// directories themselves can be told from anybody else's.
func storeDirs(store string) (uint32, []uint64, error) {
	var dev uint32
	var inos []uint64
	err := filepath.WalkDir(store, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.IsDir() {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return err
		}
		dev = kernelDev(st.Dev)
		inos = append(inos, st.Ino)
		return nil
	})
	return dev, inos, err
}

// startCounter starts perf with its events disabled, then enables them
// and returns once perf acknowledged: from then on the phase counts.
func startCounter(conn uint32, store string) (*counter, error) {
	c := &counter{}
	var args []string
	for _, o := range fuseOpcodes {
		args = append(args, "-e", "fuse:fuse_request_send", "--filter", fmt.Sprintf("connection == %d && opcode == %d", conn, o.code))
		c.events = append(c.events, o.name)
	}
	args = append(args, "-e", "fuse:fuse_request_send", "--filter", fmt.Sprintf("connection == %d", conn))
	c.events = append(c.events, "total")
	if store != "" {
		dev, inos, err := storeDirs(store)
		if err != nil {
			return nil, fmt.Errorf("store directories: %w", err)
		}
		var or []string
		for _, ino := range inos {
			or = append(or, fmt.Sprintf("ino == %d || parent == %d", ino, ino))
		}
		args = append(args, "-e", "ext4:ext4_sync_file_enter", "--filter", fmt.Sprintf("dev == %d && (%s)", dev, strings.Join(or, " || ")))
		c.events = append(c.events, "fsync")
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	full := append([]string{"stat", "-a", "-x", ",", "-D", "-1", "--control", "fd:3,4"}, args...)
	c.cmd = exec.Command("perf", full...)
	c.cmd.ExtraFiles = []*os.File{ctlR, ackW}
	c.cmd.Stderr = &c.out
	c.cmd.Stdout = &c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = c.cmd.Start()
	ctlR.Close()
	ackW.Close()
	if err != nil {
		ctlW.Close()
		ackR.Close()
		return nil, fmt.Errorf("start perf: %w", err)
	}
	c.ctl, c.ackFile, c.ack = ctlW, ackR, bufio.NewReader(ackR)
	if err := c.command("enable"); err != nil {
		c.kill()
		return nil, fmt.Errorf("perf enable: %w (perf said: %s)", err, strings.TrimSpace(c.out.String()))
	}
	return c, nil
}

// command sends a control command and waits for perf's ack.
func (c *counter) command(cmd string) error {
	if _, err := c.ctl.WriteString(cmd + "\n"); err != nil {
		return err
	}
	got := make(chan error, 1)
	go func() {
		line, err := c.ack.ReadString('\n')
		if err == nil && strings.Trim(line, "\x00\n ") != "ack" { // perf writes "ack\n\x00"
			err = fmt.Errorf("perf answered %q", line)
		}
		got <- err
	}()
	select {
	case err := <-got:
		return err
	case <-time.After(10 * time.Second):
		return errors.New("no ack from perf in 10 s")
	}
}

// stop disables the events, stops perf and returns the counts.
func (c *counter) stop() (counts, error) {
	if err := c.command("disable"); err != nil {
		c.kill()
		return counts{}, err
	}
	c.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
	c.ctl.Close()
	c.ackFile.Close()
	res := counts{Requests: map[string]int64{}, Fsyncs: -1}
	i := 0
	for _, line := range strings.Split(c.out.String(), "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 || (f[2] != "fuse:fuse_request_send" && f[2] != "ext4:ext4_sync_file_enter") {
			continue
		}
		if i >= len(c.events) {
			break
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return res, fmt.Errorf("perf count %q: %w", line, err)
		}
		if c.events[i] == "fsync" {
			res.Fsyncs = n
		} else if n != 0 || c.events[i] == "total" {
			res.Requests[c.events[i]] = n
		}
		i++
	}
	if i != len(c.events) {
		return res, fmt.Errorf("perf printed %d counts, want %d:\n%s", i, len(c.events), c.out.String())
	}
	var listed int64
	for k, v := range res.Requests {
		if k != "total" {
			listed += v
		}
	}
	if other := res.Requests["total"] - listed; other != 0 {
		res.Requests["other"] = other
	}
	return res, nil
}

// kill stops perf without reading it (error paths and cleanup).
func (c *counter) kill() {
	if c == nil || c.cmd == nil || c.cmd.Process == nil || c.cmd.ProcessState != nil {
		return
	}
	c.cmd.Process.Kill()
	c.cmd.Wait()
	c.ctl.Close()
	c.ackFile.Close()
}

// procRunTime is the time pid's threads have spent on a CPU, from
// /proc/PID/task/*/schedstat (nanoseconds; 0 where the kernel does not
// keep it). /proc/PID/stat's utime+stime count the same in 10 ms ticks,
// too coarse for a phase of a few thousand operations of some 20 µs.
// Threads that exited are not counted: the daemon's (Go runtime threads)
// do not exit.
func procRunTime(pid int) time.Duration {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/schedstat")
	var ns int64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		v, _ := strconv.ParseInt(f[0], 10, 64)
		ns += v
	}
	return time.Duration(ns)
}

// cpuSampler measures the CPU a phase cost: ours, the daemon's, and
// everybody else's on the machine (a sanity check on a shared VM).
type cpuSampler struct {
	daemonPID                  int
	self, daemon, busy, totalT time.Duration
	daemonRun                  time.Duration
	daemonSwitches             int64
}

func startCPU(daemonPID int) cpuSampler {
	s := cpuSampler{daemonPID: daemonPID}
	s.self, _ = procCPU(os.Getpid())
	if daemonPID > 0 {
		s.daemon, _ = procCPU(daemonPID)
		s.daemonRun = procRunTime(daemonPID)
		s.daemonSwitches = procSwitches(daemonPID)
	}
	s.busy, s.totalT, _ = machineBusy()
	return s
}

// cpuUse is a phase's CPU time: per operation for us and the daemon, and
// the share of the machine that other processes used meanwhile.
type cpuUse struct {
	ClientUSPerOp       float64 `json:"client_cpu_us_per_op"`
	DaemonUSPerOp       float64 `json:"daemon_cpu_us_per_op,omitempty"`
	DaemonSwitchesPerOp float64 `json:"daemon_switches_per_op,omitempty"`
	OthersShare         float64 `json:"others_cpu_share"` // 0..1 of all CPUs

	// The daemon's totals over the phase, unrounded, for the steps that
	// add up phases: its threads' time on a CPU (procRunTime, in ns;
	// utime+stime, in 10 ms ticks, where that is not kept) and context
	// switches.
	daemonCPU      time.Duration
	daemonSwitches int64
}

func (s cpuSampler) stop(ops int) cpuUse {
	self, _ := procCPU(os.Getpid())
	var daemon time.Duration
	var switches int64
	if s.daemonPID > 0 {
		daemon, _ = procCPU(s.daemonPID)
		switches = procSwitches(s.daemonPID)
	}
	busy, total, _ := machineBusy()
	per := func(d time.Duration) float64 { return round1(float64(d) / 1e3 / float64(max(ops, 1))) }
	u := cpuUse{ClientUSPerOp: per(self - s.self)}
	if s.daemonPID > 0 {
		u.daemonCPU, u.daemonSwitches = daemon-s.daemon, switches-s.daemonSwitches
		if run := procRunTime(s.daemonPID); s.daemonRun > 0 && run >= s.daemonRun {
			u.daemonCPU = run - s.daemonRun
		}
		u.DaemonUSPerOp = per(u.daemonCPU)
		u.DaemonSwitchesPerOp = round2(float64(u.daemonSwitches) / float64(max(ops, 1)))
	}
	if dt := total - s.totalT; dt > 0 {
		others := (busy - s.busy) - (self - s.self) - (daemon - s.daemon)
		u.OthersShare = round2(max(0, float64(others)/float64(dt)))
	}
	return u
}
