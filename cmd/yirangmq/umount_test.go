package main

import (
	"fmt"
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

// mountDaemon mounts a new store at a new mountpoint with --daemon and
// returns the mountpoint and the daemon's pid; the test's end kills what
// is left of it.
func mountDaemon(t *testing.T) (string, int) {
	t.Helper()
	dir := t.TempDir()
	mp := filepath.Join(dir, "mnt")
	os.Mkdir(mp, 0o755)
	out, err := exec.Command(testenv.Binary(t), "mount", "--daemon", "--store", filepath.Join(dir, "store"), mp).CombinedOutput()
	if err != nil {
		t.Fatalf("mount --daemon: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`daemon pid (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("mount --daemon said %q, want the daemon's pid", out)
	}
	pid, _ := strconv.Atoi(string(m[1]))
	t.Cleanup(func() {
		if running(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		testenv.Unmount(mp)
	})
	return mp, pid
}

// running reports whether process pid exists and has not exited (a
// zombie has).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// umount returns once the daemon has exited, not merely once the mount
// is gone from this namespace.
func TestUmountWaitsForTheDaemon(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to mount")
	}
	mp, pid := mountDaemon(t)
	testenv.MustSh(t, mp, `mkdir q && echo m > q/inbox/m`)
	if r := cli(t, "", "umount", mp); r.code != 0 {
		t.Fatalf("umount: exit %d: %s", r.code, r.stderr)
	}
	if running(pid) {
		t.Fatalf("umount returned while the daemon (pid %d) still runs", pid)
	}
	if testenv.IsMounted(mp) {
		t.Fatalf("%s is still mounted", mp)
	}
}

// A copy of the mount held in another mount namespace (unshare -m here;
// a container or a service with PrivateTmp= alike) keeps the kernel's
// connection, and so the daemon, alive after the unmount: umount says so,
// names the holder and how to finish (issue 40: it returned 0 while the
// daemon kept running). Doing what it says lets the daemon exit.
func TestUmountExplainsAMountHeldInAnotherNamespace(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to mount and unshare")
	}
	for _, tool := range []string{"unshare", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s (util-linux)", tool)
		}
	}
	mp, pid := mountDaemon(t)
	holder := exec.Command("unshare", "-m", "--propagation", "private", "sleep", "600")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	ours, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	testenv.MustRetryUntil(t, 10*time.Second, "the holder's namespace has the mount", func() bool {
		// Until unshare has run, the holder is still in this namespace,
		// whose mountinfo has the mount too.
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", holder.Process.Pid)); err != nil || ns == ours {
			return false
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", holder.Process.Pid))
		return strings.Contains(string(b), " "+mp+" ") && strings.Contains(string(b), "fuse.yirangmq")
	})
	r := cli(t, "", "umount", "--timeout", "30s", mp)
	if r.code != 1 {
		t.Fatalf("umount of a mount held elsewhere: exit %d, stderr %q; want 1", r.code, r.stderr)
	}
	for _, want := range []string{
		"keeps serving", "other mount namespace",
		fmt.Sprintf("pid %d (sleep) has it at %s", holder.Process.Pid, mp),
		fmt.Sprintf("nsenter -t %d -m umount %s", holder.Process.Pid, mp),
		fmt.Sprintf("daemon (pid %d)", pid),
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("umount said %q, want it to say %q", r.stderr, want)
		}
	}
	if !running(pid) {
		t.Fatalf("the daemon exited although another namespace holds its mount")
	}
	if testenv.IsMounted(mp) {
		t.Errorf("%s is still mounted here", mp)
	}
	// What it says to do.
	if out, err := exec.Command("nsenter", "-t", strconv.Itoa(holder.Process.Pid), "-m", "umount", mp).CombinedOutput(); err != nil {
		t.Fatalf("nsenter ... umount: %v\n%s", err, out)
	}
	testenv.MustRetryUntil(t, 30*time.Second, "the daemon exits once no namespace holds the mount", func() bool { return !running(pid) })
}
