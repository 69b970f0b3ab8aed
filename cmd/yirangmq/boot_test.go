package main

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"yirangmq/testenv"
)

// mountWorks publishes and reads back a message through mp.
func mountWorks(t *testing.T, mp string) {
	t.Helper()
	testenv.MustSh(t, mp, `mkdir -p boot && echo hi > boot/inbox/m && test "$(cat boot/inbox/m)" = hi`)
}

// waitStopped waits until the daemon whose log this is has exited (its
// pid is in the "mounted" line).
func waitStopped(t *testing.T, logFile string) {
	t.Helper()
	b, _ := os.ReadFile(logFile)
	m := regexp.MustCompile(`msg=mounted .* pid=(\d+)`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("no mounted line with a pid in the log:\n%s", b)
	}
	ok := testenv.RetryUntil(10*time.Second, func() bool {
		_, err := os.Stat("/proc/" + m[1])
		return os.IsNotExist(err)
	})
	if !ok {
		b, _ := os.ReadFile(logFile)
		t.Fatalf("daemon %s did not exit after umount:\n%s", m[1], b)
	}
}

// An /etc/fstab line and mount -t fuse.yirangmq, through the helper link
// that make install puts in /sbin, as at boot.
func TestMountAtBootThroughMount8(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("mount"); err != nil {
		t.Skip("no mount(8)")
	}
	link := "/sbin/" + helperName
	if _, err := os.Lstat(link); err == nil {
		t.Skipf("%s exists: not replacing an installed helper", link)
	}
	if err := os.Symlink(testenv.Binary(t), link); err != nil {
		t.Skipf("cannot install the helper link: %v", err)
	}
	t.Cleanup(func() { os.Remove(link) })

	for _, c := range []struct{ name, backend string }{{"fstab", "sqlite"}, {"mount-t", "fs"}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			store, mp := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
			os.Mkdir(mp, 0o755)
			t.Cleanup(func() { testenv.Unmount(mp) })
			var cmd *exec.Cmd
			if c.name == "fstab" {
				fstab := filepath.Join(dir, "fstab")
				line := store + " " + mp + " fuse.yirangmq backend=" + c.backend + ",allow_other,nofail 0 0\n"
				os.WriteFile(fstab, []byte(line), 0o644)
				cmd = exec.Command("mount", "--fstab", fstab, mp)
			} else {
				cmd = exec.Command("mount", "-t", "fuse.yirangmq", store, mp, "-o", "backend="+c.backend)
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
			}
			// mount returned: the mount must already serve.
			mountWorks(t, mp)
			mounts, _ := os.ReadFile("/proc/self/mounts")
			if !strings.Contains(string(mounts), mp+" fuse.yirangmq") {
				t.Fatalf("%s is not a fuse.yirangmq mount:\n%s", mp, mounts)
			}
			if c.name == "fstab" && !strings.Contains(string(mounts), "allow_other") {
				t.Errorf("allow_other from the fstab line is not in effect")
			}
			if out, err := exec.Command("umount", mp).CombinedOutput(); err != nil {
				t.Fatalf("umount: %v\n%s", err, out)
			}
			waitStopped(t, filepath.Join(store, "yirangmq.log"))
			if testenv.IsMounted(mp) {
				t.Fatal("still mounted after umount")
			}
		})
	}
}

// mount.fuse3 runs `yirangmq STORE MOUNTPOINT -o OPTIONS` and waits for it
// to return.
func TestHelperCallConvention(t *testing.T) {
	dir := t.TempDir()
	store, mp := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	os.Mkdir(mp, 0o755)
	t.Cleanup(func() { testenv.Unmount(mp) })
	out, err := exec.Command(testenv.Binary(t), store, mp, "-o", "rw,dev,suid,backend=fs,sync=normal", "-n").CombinedOutput()
	if err != nil {
		t.Fatalf("helper call: %v\n%s", err, out)
	}
	mountWorks(t, mp)
	if b, _ := os.ReadFile(filepath.Join(store, "yirangmq.log")); !strings.Contains(string(b), "backend=fs") || !strings.Contains(string(b), "sync=normal") {
		t.Errorf("options not taken:\n%s", b)
	}
	if err := syscall.Unmount(mp, 0); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, filepath.Join(store, "yirangmq.log"))
	// A bad option fails the mount with a clear message.
	out, err = exec.Command(testenv.Binary(t), store, mp, "-o", "colour=blue").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `unknown mount option "colour=blue"`) {
		t.Fatalf("bad option: %v %s", err, out)
	}
}

// The systemd notify protocol: READY=1 only once the mount serves,
// STOPPING=1 on SIGTERM, then a clean unmount.
func TestSystemdNotify(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mp := filepath.Join(dir, "mnt")
	os.Mkdir(mp, 0o755)
	t.Cleanup(func() { testenv.Unmount(mp) })
	cmd := exec.Command(testenv.Binary(t), "mount", "--store", filepath.Join(dir, "store"), mp)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	logs := &strings.Builder{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	read := func(want string) string {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		buf := make([]byte, 4096)
		n, _, err := conn.ReadFromUnix(buf)
		if err != nil {
			t.Fatalf("waiting for %s: %v\n%s", want, err, logs)
		}
		msg := string(buf[:n])
		if !strings.Contains(msg, want) {
			t.Fatalf("notify message %q, want %s", msg, want)
		}
		return msg
	}
	msg := read("READY=1")
	// READY=1 came after the mount serves: it works right now.
	if _, err := os.Stat(filepath.Join(mp, ".stats")); err != nil {
		t.Fatalf("READY=1 (%q) before the mount serves: %v", msg, err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	read("STOPPING=1")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("daemon exit: %v\n%s", err, logs)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("daemon did not exit after SIGTERM")
	}
	if testenv.IsMounted(mp) {
		t.Fatal("still mounted after SIGTERM")
	}
}

// make install puts the binary, the helper link and the unit under DESTDIR.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dest := t.TempDir()
	cmd := exec.Command("make", "install", "DESTDIR="+dest, "PREFIX=/usr")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	if fi, err := os.Stat(filepath.Join(dest, "usr/bin/yirangmq")); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("binary not installed: %v", err)
	}
	if target, err := os.Readlink(filepath.Join(dest, "sbin", helperName)); err != nil || target != "/usr/bin/yirangmq" {
		t.Fatalf("helper link: %q, %v", target, err)
	}
	f, err := os.Open(filepath.Join(dest, "etc/systemd/system/yirangmq.service"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var unit []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			unit = append(unit, l)
		}
	}
	text := strings.Join(unit, "\n")
	for _, want := range []string{"Type=notify", "ExecStart=/usr/bin/yirangmq mount", "Restart=on-failure", "WantedBy=multi-user.target"} {
		if !strings.Contains(text, want) {
			t.Errorf("unit lacks %q", want)
		}
	}
	for _, bad := range []string{"PrivateMounts", "PrivateTmp", "ProtectSystem", "ProtectHome", "@BINDIR@"} {
		if strings.Contains(text, bad) {
			t.Errorf("unit has %q, which would hide the mount or is unsubstituted", bad)
		}
	}
}
