package fusefs_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"yirangmq/testenv"
)

// nobody is the uid and gid that plays "another user" in these tests.
const nobody = 65534

// asUser runs a shell script as uid:gid with no supplementary groups.
func asUser(t *testing.T, uid int, dir, script string) testenv.Result {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to run commands as another user")
	}
	u := strconv.Itoa(uid)
	return testenv.Sh(t, dir, "setpriv --reuid="+u+" --regid="+u+" --clear-groups sh -c '"+strings.ReplaceAll(script, "'", `'\''`)+"'")
}

// openPath lets every user walk down to the mountpoint: t.TempDir() makes
// its top directory 0700, which would give EACCES for the wrong reason.
func openPath(t *testing.T, d *testenv.Daemon) {
	t.Helper()
	for dir := filepath.Dir(d.Mountpoint); dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if r := asUser(t, nobody, "/", "test -x "+filepath.Dir(d.Mountpoint)); r.Code != 0 {
		t.Fatalf("uid %d cannot reach the mountpoint's parent: %s", nobody, r.Stderr)
	}
}

func ownerMode(t *testing.T, path string) (uid, gid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode()
}

// The mount is always nodev, nosuid, noexec.
func TestMountOptions(t *testing.T) {
	for _, opts := range []testenv.DaemonOptions{{}, {Args: []string{"-o", "allow_other"}}} {
		eachBackend(t, opts, func(t *testing.T, d *testenv.Daemon) {
			b, err := os.ReadFile("/proc/mounts")
			if err != nil {
				t.Fatal(err)
			}
			var line string
			for _, l := range strings.Split(string(b), "\n") {
				if f := strings.Fields(l); len(f) > 3 && f[1] == d.Mountpoint {
					line = l
				}
			}
			if line == "" {
				t.Fatalf("%s not in /proc/mounts", d.Mountpoint)
			}
			f := strings.Fields(line)
			mopts := "," + f[3] + ","
			for _, o := range []string{"nodev", "nosuid", "noexec"} {
				if !strings.Contains(mopts, ","+o+",") {
					t.Errorf("mount options %s lack %s", f[3], o)
				}
			}
			if f[2] != "fuse.yirangmq" {
				t.Errorf("filesystem type %s, want fuse.yirangmq", f[2])
			}
			allow := strings.Contains(mopts, ",allow_other,")
			if allow != (len(opts.Args) > 0) {
				t.Errorf("mount options %s: allow_other %v, want %v", f[3], allow, len(opts.Args) > 0)
			}
			if allow && !strings.Contains(mopts, ",default_permissions,") {
				t.Errorf("allow_other without default_permissions: %s", f[3])
			}
		})
	}
}

// Without -o allow_other only the mounting user sees the mount.
func TestWithoutAllowOther(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		openPath(t, d)
		q := mkq(t, d, "q", "")
		os.Chmod(q, 0o777)
		r := asUser(t, nobody, "/", "stat "+d.Mountpoint)
		if r.Code == 0 || !strings.Contains(r.Stderr, "Permission denied") {
			t.Errorf("stat of the mount root by uid %d: exit %d, %q; want Permission denied", nobody, r.Code, r.Stderr)
		}
		r = asUser(t, nobody, "/", "echo x > "+filepath.Join(q, "inbox", "m"))
		if r.Code == 0 || !strings.Contains(r.Stderr, "Permission denied") {
			t.Errorf("publish by uid %d: exit %d, %q; want Permission denied", nobody, r.Code, r.Stderr)
		}
		wantNames(t, "inbox", ls(t, filepath.Join(q, "inbox")))
	})
}

// With -o allow_other the kernel checks permissions: chmod and chown of a
// queue directory persist across a restart, its state directories follow,
// and a 0700 queue is closed to other users while a 0777 one is open.
func TestAllowOtherPermissions(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Args: []string{"-o", "allow_other"}}, func(t *testing.T, d *testenv.Daemon) {
		openPath(t, d)
		private := mkq(t, d, "private", "")
		open := mkq(t, d, "open", "")
		owned := mkq(t, d, "owned", "")
		testenv.MustSh(t, d.Mountpoint, `
			echo secret > private/inbox/s
			chmod 0700 private
			chmod 0777 open
			chown 65534:65534 owned && chmod 0700 owned
			chmod 0750 owned
		`)
		check := func(when string) {
			t.Helper()
			for _, c := range []struct {
				dir      string
				uid, gid uint32
				mode     os.FileMode
			}{
				{private, 0, 0, 0o700},
				{open, 0, 0, 0o777},
				{owned, nobody, nobody, 0o750},
			} {
				for _, sub := range []string{"", "inbox", "processing", "delayed", "dlq", "archive"} {
					uid, gid, mode := ownerMode(t, filepath.Join(c.dir, sub))
					if uid != c.uid || gid != c.gid || mode != os.ModeDir|c.mode {
						t.Errorf("%s: %s/%s is %d:%d %v, want %d:%d %v", when, filepath.Base(c.dir), sub, uid, gid, mode, c.uid, c.gid, os.ModeDir|c.mode)
					}
				}
			}
		}
		check("before restart")
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		d.Restart(t)
		check("after restart")

		// 0700 root's: another user can neither list nor publish nor read.
		for _, script := range []string{
			"ls private/inbox",
			"echo x > private/inbox/intruder",
			"cat private/inbox/s",
			"cat private/.stats",
		} {
			r := asUser(t, nobody, d.Mountpoint, script)
			if r.Code == 0 || !strings.Contains(r.Stderr, "Permission denied") {
				t.Errorf("uid %d: %s: exit %d, %q; want Permission denied", nobody, script, r.Code, r.Stderr)
			}
		}
		wantNames(t, "private/inbox", ls(t, filepath.Join(private, "inbox")), "s")

		// 0777: another user publishes, and owns the message file.
		r := asUser(t, nobody, d.Mountpoint, `echo hello > open/inbox/m && cat open/inbox/m && mv open/inbox/m open/processing/ && rm open/processing/m`)
		if r.Code != 0 || strings.TrimSpace(r.Stdout) != "hello" {
			t.Fatalf("uid %d in a 0777 queue: exit %d, %q %q", nobody, r.Code, r.Stdout, r.Stderr)
		}
		if uid, gid, mode := ownerMode(t, filepath.Join(open, "archive", "m")); uid != nobody || gid != nobody || mode != 0o644 {
			t.Errorf("archive/m is %d:%d %v, want %d:%d -rw-r--r--", uid, gid, mode, nobody, nobody)
		}
		testenv.MustSh(t, open, `echo root > inbox/byroot`)
		if uid, _, _ := ownerMode(t, filepath.Join(open, "inbox", "byroot")); uid != 0 {
			t.Errorf("inbox/byroot owned by %d, want 0", uid)
		}

		// A queue chowned to a user is that user's: it can publish, others
		// (here uid 65533) cannot.
		if r := asUser(t, nobody, d.Mountpoint, `echo mine > owned/inbox/m && test "$(cat owned/inbox/m)" = mine`); r.Code != 0 {
			t.Errorf("owner of a 0750 queue cannot publish: %s", r.Stderr)
		}
		if r := asUser(t, nobody-1, d.Mountpoint, `echo x > owned/inbox/x`); r.Code == 0 || !strings.Contains(r.Stderr, "Permission denied") {
			t.Errorf("uid %d in another user's 0750 queue: exit %d, %q; want Permission denied", nobody-1, r.Code, r.Stderr)
		}
		// Only the owner (or root) may chmod a queue.
		if r := asUser(t, nobody-1, d.Mountpoint, `chmod 0777 owned`); r.Code == 0 || !strings.Contains(r.Stderr, "not permitted") {
			t.Errorf("chmod by a stranger: exit %d, %q", r.Code, r.Stderr)
		}
		if r := asUser(t, nobody, d.Mountpoint, `chmod 0700 owned`); r.Code != 0 {
			t.Errorf("chmod by the owner: %s", r.Stderr)
		}
		if _, _, mode := ownerMode(t, filepath.Join(owned, "inbox")); mode != os.ModeDir|0o700 {
			t.Errorf("owned/inbox mode %v after chmod 0700 by the owner", mode)
		}
	})
}
