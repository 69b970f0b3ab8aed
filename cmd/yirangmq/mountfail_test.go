package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"yirangmq/backends/disk"
	"yirangmq/testenv"
)

// A mount that fails says why, through --daemon and through the mount(8)
// helper alike, and leaves nothing in the store (issue 40: all three
// failures printed the same ten old log lines, and a failed mount left a
// 16 MiB space.reserve in a store it never served).
func TestFailedMountSaysWhy(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to mount")
	}
	bin := testenv.Binary(t)
	// mount(8) runs /sbin/mount.fuse.yirangmq; the same binary under that
	// name anywhere is the helper.
	helper := filepath.Join(t.TempDir(), helperName)
	if err := os.Symlink(bin, helper); err != nil {
		t.Fatal(err)
	}
	held := testenv.StartDaemon(t, testenv.DaemonOptions{})
	// The running daemon makes its space reserve in the background, after
	// it is ready: the listing to compare with is the one after that.
	testenv.MustRetryUntil(t, 10*time.Second, "the held store's space reserve", func() bool {
		fi, err := os.Stat(filepath.Join(held.Store, disk.ReserveName))
		return err == nil && fi.Size() > 0
	})
	heldFiles := storeFiles(t, held.Store)
	dir := t.TempDir()
	cases := []struct {
		name      string
		store, mp string
		want      []string
	}{
		{"store in use", held.Store, filepath.Join(dir, "mp1"),
			[]string{"store is in use by another process", "pid " + strconv.Itoa(held.Pid()), held.Mountpoint}},
		{"missing mountpoint", filepath.Join(dir, "new-store-1"), filepath.Join(dir, "no-such-dir"),
			[]string{"mountpoint " + filepath.Join(dir, "no-such-dir") + " does not exist"}},
		{"already mounted", filepath.Join(dir, "new-store-2"), held.Mountpoint,
			[]string{held.Mountpoint + " is already a yirangmq mount"}},
	}
	os.Mkdir(filepath.Join(dir, "mp1"), 0o755)
	t.Cleanup(func() { testenv.Unmount(filepath.Join(dir, "mp1")) })
	for _, c := range cases {
		for _, way := range []string{"--daemon", "helper"} {
			t.Run(c.name+"/"+way, func(t *testing.T) {
				var cmd *exec.Cmd
				if way == "--daemon" {
					cmd = exec.Command(bin, "mount", "--daemon", "--store", c.store, c.mp)
				} else {
					cmd = exec.Command(helper, c.store, c.mp, "-o", "backend=sqlite,nofail")
				}
				out, err := cmd.CombinedOutput()
				if err == nil {
					t.Fatalf("%v succeeded:\n%s", cmd.Args, out)
				}
				got := string(out)
				for _, w := range c.want {
					if !strings.Contains(got, w) {
						t.Errorf("%v: %q, want it to say %q", cmd.Args, got, w)
					}
				}
				if n := strings.Count(strings.TrimSpace(got), "\n"); n != 0 || strings.Contains(got, "msg=") {
					t.Errorf("%v: %q, want the one line of the error, no log lines", cmd.Args, got)
				}
				if c.store == held.Store {
					if now := storeFiles(t, c.store); now != heldFiles {
						t.Errorf("the store in use held %s, and %s after the failed mount", heldFiles, now)
					}
				} else if _, err := os.Lstat(c.store); !os.IsNotExist(err) {
					t.Errorf("the failed mount left its new store %s behind: %s", c.store, storeFiles(t, c.store))
				}
			})
		}
	}
	// The mount in use still serves.
	testenv.MustSh(t, held.Mountpoint, `mkdir -p q && echo ok > q/inbox/m && test "$(cat q/inbox/m)" = ok`)
}

// storeFiles lists the names in a store directory, with the size of the
// space reserve.
func storeFiles(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if n == disk.ReserveName {
			if fi, err := e.Info(); err == nil {
				n += "(" + strconv.FormatInt(fi.Size(), 10) + ")"
			}
		}
		names = append(names, n)
	}
	return strings.Join(names, " ")
}
