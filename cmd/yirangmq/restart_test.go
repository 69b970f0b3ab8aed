package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// unitExecStart returns the ExecStart command line of the shipped systemd
// unit, split into words, with the install directory, store and
// mountpoint replaced by the given ones.
func unitExecStart(t *testing.T, bin, store, mp string) []string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	f, err := os.Open(filepath.Join(filepath.Dir(file), "..", "..", "dist", "yirangmq.service"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "ExecStart=")
		if !ok {
			continue
		}
		var args []string
		for _, w := range strings.Fields(line) {
			switch w {
			case "@BINDIR@/yirangmq":
				w = bin
			case "/var/lib/yirangmq":
				w = store
			case "/mnt/mq":
				w = mp
			}
			args = append(args, w)
		}
		return args
	}
	t.Fatal("the unit has no ExecStart line")
	return nil
}

// TestRestartLoopAfterKill9 does what systemd does with the shipped unit
// (Type=notify, Restart=on-failure) when the daemon is killed with
// SIGKILL under load, again and again: the process must exit at once,
// the mount it leaves must answer ENOTCONN (never hang), and the unit's
// own ExecStart command, started again on the same mountpoint, must
// detach the dead mount and serve, with every committed message there.
// Nothing is aborted or unmounted by the test between kills.
func TestRestartLoopAfterKill9(t *testing.T) {
	const kills = 10
	dir := deadMountDir(t)
	store, mp := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mp, 0o755); err != nil { // the unit's ExecStartPre
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.Unmount(mp) })
	args := unitExecStart(t, testenv.Binary(t), store, mp)
	sock := filepath.Join(dir, "notify.sock")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()

	var cur *exec.Cmd
	var exited chan struct{}
	var logs *testenv.SyncBuffer
	start := func() {
		t.Helper()
		cur = exec.Command(args[0], args[1:]...)
		cur.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
		logs = &testenv.SyncBuffer{}
		cur.Stdout, cur.Stderr = logs, logs
		cur.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cur.Start(); err != nil {
			t.Fatal(err)
		}
		exited = make(chan struct{})
		c, ch := cur, exited
		go func() { c.Wait(); close(ch) }()
		// Type=notify: the service is up at READY=1.
		notify.SetReadDeadline(time.Now().Add(20 * time.Second))
		buf := make([]byte, 4096)
		for {
			n, _, err := notify.ReadFromUnix(buf)
			if err != nil {
				t.Fatalf("no READY=1 from %v: %v\n%s", args, err, logs)
			}
			if strings.Contains(string(buf[:n]), "READY=1") {
				return
			}
		}
	}
	t.Cleanup(func() {
		if cur != nil && cur.Process != nil {
			cur.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				cur.Process.Kill()
			}
		}
	})

	start()
	q, kept := filepath.Join(mp, "jobs"), filepath.Join(mp, "kept")
	for _, d := range []string{q, kept} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// The load: two producers and a consumer with plain system calls, no
	// timeouts; errors while the daemon is down are expected and ignored.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var inflight [3]atomic.Int64
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; !stop.Load(); seq++ {
				inflight[i].Store(time.Now().UnixNano())
				if i < 2 {
					p := filepath.Join(q, "inbox", fmt.Sprintf("load-%d-%d", i, seq))
					if fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644); err == nil {
						unix.Write(fd, []byte("load"))
						unix.Close(fd)
					}
				} else if fd, err := unix.Open(filepath.Join(q, ".next"), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
					buf := make([]byte, 4096)
					n, err := unix.Read(fd, buf)
					unix.Close(fd)
					if err == nil && n > 1 {
						unix.Unlink(filepath.Join(q, strings.TrimSuffix(string(buf[:n]), "\n")))
					}
				}
				inflight[i].Store(0)
				time.Sleep(time.Millisecond) // pacing of the load
			}
		}()
	}

	var serving, exits []time.Duration
	for k := 0; k < kills; k++ {
		// One message committed before each kill must be there after it.
		keep := filepath.Join(kept, "inbox", fmt.Sprintf("keep-%02d", k))
		if err := os.WriteFile(keep, []byte("kept"), 0o644); err != nil {
			t.Fatalf("kill %d: publish: %v", k, err)
		}
		time.Sleep(time.Duration(100+k*37%200) * time.Millisecond) // under load
		killed := time.Now()
		pid := cur.Process.Pid
		cur.Process.Kill()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("kill %d: daemon %d still there 10 s after SIGKILL:\n%s", k, pid, testenv.ThreadStates(pid))
		}
		exits = append(exits, time.Since(killed))
		// The unit's daemon takes the default transport, auto:
		// io_uring when the kernel offers it.
		if err := testenv.DeadMountAnswers(mp, 10*time.Second, true); err != nil {
			t.Fatalf("kill %d: %v", k, err)
		}
		start()
		if _, err := os.ReadFile(keep); err != nil {
			t.Fatalf("kill %d: serving again, but %s: %v\n%s", k, keep, err, logs)
		}
		serving = append(serving, time.Since(killed))
		// The log reaches the test through a pipe, copied by a goroutine
		// of os/exec: READY=1 can come first.
		if !testenv.RetryUntil(5*time.Second, func() bool { return strings.Contains(logs.String(), "detached a dead mount") }) {
			t.Errorf("kill %d: the new daemon did not say it detached the dead mount:\n%s", k, logs)
		}
		if strings.Contains(logs.String(), "wedged") {
			t.Errorf("kill %d: the new daemon found a wedged mount:\n%s", k, logs)
		}
	}
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		for i := range inflight {
			if s := inflight[i].Load(); s != 0 {
				t.Errorf("client %d blocked for %v", i, time.Since(time.Unix(0, s)))
			}
		}
		t.Fatal("a client call is stuck")
	}
	for k := 0; k < kills; k++ {
		if b, err := os.ReadFile(filepath.Join(kept, "inbox", fmt.Sprintf("keep-%02d", k))); err != nil || string(b) != "kept" {
			t.Errorf("keep-%02d after the loop: %q, %v", k, b, err)
		}
	}
	slices.Sort(exits)
	slices.Sort(serving)
	t.Logf("%d kills: exit after SIGKILL p50 %v max %v; SIGKILL to serving again (READY=1 and a read through the mount) p50 %v max %v",
		kills, exits[kills/2].Round(time.Millisecond), exits[kills-1].Round(time.Millisecond),
		serving[kills/2].Round(time.Millisecond), serving[kills-1].Round(time.Millisecond))
}
