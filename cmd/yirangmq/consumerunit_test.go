package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// consumerUnits reads dist/yirangmq-consumer@.path and .service.
func consumerUnits(t *testing.T) (path, service string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dist := filepath.Join(filepath.Dir(file), "..", "..", "dist")
	p, err := os.ReadFile(filepath.Join(dist, "yirangmq-consumer@.path"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.ReadFile(filepath.Join(dist, "yirangmq-consumer@.service"))
	if err != nil {
		t.Fatal(err)
	}
	return string(p), string(s)
}

// unitValues returns the values of key in a unit file, in order.
func unitValues(unit, key string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(unit))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(l, "="); ok && k == key && !strings.HasPrefix(l, "#") {
			out = append(out, v)
		}
	}
	return out
}

// The shipped consumer units pass systemd-analyze verify, as installed
// (@BINDIR@ replaced) for a queue "jobs".
func TestConsumerUnitsVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("YIRANGMQ_REQUIRE_SYSTEMD_ANALYZE") == "1" {
			t.Fatal("no systemd-analyze (.ci/run installs systemd)")
		}
		t.Skip("no systemd-analyze")
	}
	path, service := consumerUnits(t)
	dir := t.TempDir()
	bin := testenv.Binary(t)
	os.WriteFile(filepath.Join(dir, "yirangmq-consumer@.path"), []byte(path), 0o644)
	os.WriteFile(filepath.Join(dir, "yirangmq-consumer@.service"), []byte(strings.ReplaceAll(service, "@BINDIR@", filepath.Dir(bin))), 0o644)
	cmd := exec.Command(sa, "verify", filepath.Join(dir, "yirangmq-consumer@jobs.path"), filepath.Join(dir, "yirangmq-consumer@jobs.service"))
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// No option that makes the consumer a mount namespace of its own: it
	// would hold a copy of the mount (docs/operations.md).
	for _, bad := range []string{"PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateMounts", "PrivateDevices", "ReadOnlyPaths", "TemporaryFileSystem"} {
		if len(unitValues(service, bad)) > 0 {
			t.Errorf("the consumer service sets %s, which gives it a mount namespace", bad)
		}
	}
}

// What systemd does with the units, through a real mount: it watches
// inbox/ for the inotify events of DirectoryNotEmpty= and PathChanged=
// (IN_CREATE, IN_MOVED_TO, IN_ATTRIB, IN_CLOSE_WRITE, IN_DELETE,
// IN_MOVED_FROM, IN_DELETE_SELF, IN_MOVE_SELF), starts the service's
// ExecStart when inbox/ is not empty at the start, on an event, and when
// the service stops and inbox/ is not empty; events while it runs start
// nothing more. systemd does not run in the test environment, so the test does
// that part; the rest is the units' own lines, with a drop-in's
// Environment= for the mount and the handler. Every message gets handled,
// a delayed one too, and the consumer exits once the queue is worked off.
func TestConsumerUnitsRunOnTheirEvents(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	path, service := consumerUnits(t)
	watch := unitValues(path, "DirectoryNotEmpty")
	changed := unitValues(path, "PathChanged")
	execs := unitValues(service, "ExecStart")
	if len(watch) != 1 || len(changed) != 1 || changed[0] != watch[0] || len(execs) != 1 {
		t.Fatalf("DirectoryNotEmpty=%q PathChanged=%q ExecStart=%q, want one each, on one directory", watch, changed, execs)
	}
	const mp = "/mnt/mq" // the units' mountpoint, moved here as a drop-in would
	inbox := strings.ReplaceAll(strings.Replace(watch[0], mp, d.Mountpoint, 1), "%i", "jobs")
	if inbox != d.Path("jobs", "inbox") {
		t.Fatalf("the path unit watches %s, want the queue's inbox/", watch[0])
	}
	out := t.TempDir()
	handler := filepath.Join(t.TempDir(), "handler")
	os.WriteFile(handler, []byte("#!/bin/sh\ncat > \""+out+"/$(basename \"$YIRANGMQ_MESSAGE\")\"\n"), 0o755)
	env := os.Environ()
	for _, e := range unitValues(service, "Environment") {
		env = append(env, strings.ReplaceAll(e, "%i", "jobs"))
	}
	env = append(env, "YIRANGMQ_MOUNT="+d.Mountpoint, "YIRANGMQ_HANDLER="+handler) // the drop-in
	var argv []string
	for _, w := range strings.Fields(execs[0]) {
		w = strings.ReplaceAll(strings.ReplaceAll(w, "@BINDIR@", filepath.Dir(testenv.Binary(t))), "%i", "jobs")
		if w == "${YIRANGMQ_HANDLER}" {
			w = handler
		}
		argv = append(argv, w)
	}

	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, inbox, unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_ATTRIB|unix.IN_CREATE|unix.IN_MOVED_TO|
		unix.IN_CLOSE_WRITE|unix.IN_DELETE|unix.IN_MOVED_FROM); err != nil {
		t.Fatal(err)
	}
	var starts atomic.Int32
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		drainEvents := func() {
			for {
				if _, err := unix.Read(fd, buf); err != nil {
					return
				}
			}
		}
		notEmpty := func() bool {
			ents, err := os.ReadDir(inbox)
			return err == nil && len(ents) > 0
		}
		trigger := notEmpty() // DirectoryNotEmpty= at the start
		for {
			if trigger {
				starts.Add(1)
				cmd := exec.Command(argv[0], argv[1:]...)
				cmd.Env = env
				if b, err := cmd.CombinedOutput(); err != nil {
					done <- errors.New("the consumer service failed: " + err.Error() + "\n" + string(b))
					return
				}
				drainEvents()        // events while it ran started nothing
				trigger = notEmpty() // DirectoryNotEmpty= once it stopped
				continue
			}
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if n, _ := unix.Poll(fds, 100); n > 0 {
				drainEvents()
				trigger = true // PathChanged=: any event
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	testenv.MustSh(t, d.Path("jobs"), `echo a > inbox/a && echo b > inbox/b`)
	// A message that waits a second in delayed/ first: its create raises
	// IN_CREATE in inbox/, and the consumer waits for it (--drain).
	f, err := os.Create(d.Path("jobs", "inbox", "later"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsetxattr(int(f.Fd()), "user.yirangmq.delay_sec", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	f.WriteString("c\n")
	f.Close()
	testenv.MustRetryUntil(t, 30*time.Second, "every message handled by the unit's command", func() bool {
		for _, n := range []string{"a", "b", "later"} {
			if _, err := os.Stat(filepath.Join(out, n)); err != nil {
				return false
			}
		}
		return true
	})
	testenv.MustSh(t, d.Path("jobs"), `echo d > inbox/d`)
	if !testenv.RetryUntil(30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(out, "d"))
		return err == nil
	}) {
		t.Fatalf("a message published after the consumer exited was not handled: %d starts, stats %+v, inbox %v", starts.Load(), queueStats(t, d, "jobs"), testenv.MustSh(t, d.Path("jobs"), "ls -la inbox delayed processing"))
	}
	testenv.MustRetryUntil(t, 10*time.Second, "the queue worked off", func() bool {
		s := queueStats(t, d, "jobs")
		return s.Ready+s.Inflight+s.Delayed == 0 && s.AckedTotal == 4
	})
	if n := starts.Load(); n < 2 {
		t.Errorf("the consumer service started %d times, want once per burst of work (2 or more)", n)
	}
}
