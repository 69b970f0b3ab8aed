package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"yirangmq/testenv"
)

// A daemon killed with SIGKILL leaves its mount behind; the next mount on
// that mountpoint detaches (or aborts) it and mounts afresh, with one log
// line saying so, and the messages committed before the kill are there.
func TestMountRecoversAfterKill9(t *testing.T) {
	dir := deadMountDir(t)
	store, mp := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	os.Mkdir(mp, 0o755)
	t.Cleanup(func() { testenv.Unmount(mp) })
	bin := testenv.Binary(t)
	logFile := filepath.Join(dir, "daemon.log")
	mount := func() {
		t.Helper()
		out, err := exec.Command(bin, "mount", "--daemon", "--store", store, "--log-file", logFile, mp).CombinedOutput()
		if err != nil {
			b, _ := os.ReadFile(logFile)
			t.Fatalf("mount: %v\n%s\n%s", err, out, b)
		}
	}
	mount()
	testenv.MustSh(t, mp, `mkdir q && echo kept > q/inbox/m && mv q/inbox/m q/processing/ && echo other > q/inbox/n`)
	b, _ := os.ReadFile(logFile)
	m := regexp.MustCompile(`msg=mounted .* pid=(\d+)`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("no pid in the log:\n%s", b)
	}
	pid, _ := strconv.Atoi(m[1])
	syscall.Kill(pid, syscall.SIGKILL)
	if !testenv.RetryUntil(10*time.Second, func() bool {
		_, err := os.Stat("/proc/" + m[1] + "/status")
		return os.IsNotExist(err)
	}) {
		t.Fatalf("daemon %d did not exit after SIGKILL", pid)
	}
	// Opening the directory (what ls does) needs the daemon's answer; a
	// stat may be answered from the root's cached attributes for up to
	// the attribute timeout, so it cannot tell a dead mount. The daemon
	// took the default transport, auto: io_uring when the kernel offers it.
	if err := testenv.DeadMountAnswers(mp, 10*time.Second, true); err != nil {
		t.Fatal(err)
	}
	mount()
	b, _ = os.ReadFile(logFile)
	if !strings.Contains(string(b), "detached a dead mount left by a crashed daemon") {
		t.Errorf("no log line about the dead mount:\n%s", b)
	}
	// The lease survived: the consumer that leased before the kill acks.
	testenv.MustSh(t, mp, `test "$(cat q/inbox/n)" = other && rm q/processing/m && test -f q/archive/m`)
	// A live mount is not mounted over.
	out, err := exec.Command(bin, "mount", "--store", filepath.Join(dir, "other"), mp).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "already a yirangmq mount") {
		t.Fatalf("mount over a live mount: %v %s", err, out)
	}
	if err := syscall.Unmount(mp, 0); err != nil {
		t.Fatal(err)
	}
}

// deadMountDir is a directory for a test that leaves a dead mount behind
// on purpose, outside $TMPDIR: the mounting test packages that go test
// runs beside this one detach dead yirangmq mounts under $TMPDIR when they
// start (testenv.CleanLeftoverMounts), and one that did so between the
// kill and the check made the mountpoint the plain directory under it
// (open and stat then succeed). It is removed when the test ends.
func deadMountDir(t *testing.T) string {
	t.Helper()
	base := "/var/tmp/yirangmq-cmd-tests"
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(base, strings.ReplaceAll(t.Name(), "/", "_")+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
