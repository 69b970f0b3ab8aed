package fusefs_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// smallFS mounts a tmpfs of the given size (mount(8) syntax: 2m) in a new
// temporary directory and unmounts it when the test ends, after the daemon
// that uses it (cleanups run last first: call this before StartDaemon).
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID, "size="+size); err != nil {
		t.Skipf("mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := testenv.Unmount(dir); err != nil {
			t.Errorf("unmount the small tmpfs: %v", err)
		}
	})
	return dir
}

// A store on a full filesystem: the commit that does not fit fails its
// close(2) with ENOSPC (docs/contract.md §2), nothing is half visible, the daemon
// lives on, and once there is room again publishing works and the store
// survives a restart whole.
func TestDiskFull(t *testing.T) {
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			backend, args := name, []string{"--min-free", "0"}
			small := smallFS(t, "2m")
			// No floor: this is about the store itself meeting a full disk
			// (TestDiskFloorDrain has the floor).
			d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: backend, Sync: "full", Store: filepath.Join(small, "store"),
				Args: args})
			q := mkq(t, d, "q", `{"maxMessageBytes": 1048576}`)
			inbox := filepath.Join(q, "inbox")
			body := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("%06d ", i)), 32<<10/7) }

			// Publish until the filesystem is full.
			want := map[string][]byte{} // what must be in inbox/, name → body
			var failed []string
			full := ""
			for i := 0; i < 400 && full == ""; i++ {
				name := fmt.Sprintf("m%04d", i)
				o, w, c := rawPublish(filepath.Join(inbox, name), body(i))
				switch {
				case o+w+c == "OKOKOK":
					want[name] = body(i)
				case o == "OK" && w == "OK":
					full = c
					failed = append(failed, name)
				default:
					t.Fatalf("publish %s: open=%s write=%s close=%s", name, o, w, c)
				}
			}
			t.Logf("%s store: %d messages of %d KiB fit in 2 MiB; then close(2) = %s", backend, len(want), len(body(0))>>10, full)
			if full != "ENOSPC" {
				t.Fatalf("close(2) on a full filesystem = %q, want ENOSPC", full)
			}
			if err := syscall.Kill(d.Pid(), 0); err != nil {
				t.Fatalf("daemon died on a full filesystem: %v", err)
			}
			// Still full: more publishes fail the same way, and none is half there.
			for i := 0; i < 3; i++ {
				name := fmt.Sprintf("again%d", i)
				if o, w, c := rawPublish(filepath.Join(inbox, name), body(1000+i)); o+w+c != "OKOK"+full {
					t.Errorf("publish %s while full: open=%s write=%s close=%s, want close=%s", name, o, w, c, full)
				}
				failed = append(failed, name)
			}
			checkStore := func(when string) {
				t.Helper()
				got := ls(t, inbox)
				if len(got) != len(want) {
					t.Errorf("%s: inbox/ lists %d messages, want %d", when, len(got), len(want))
				}
				for name := range want {
					if _, err := os.Stat(filepath.Join(inbox, name)); err != nil {
						t.Errorf("%s: inbox/%s: %v", when, name, err)
					}
				}
				for _, name := range got {
					b, err := os.ReadFile(filepath.Join(inbox, name))
					if err != nil || !bytes.Equal(b, want[name]) {
						t.Errorf("%s: inbox/%s reads %d bytes (%v), want the %d published", when, name, len(b), err, len(want[name]))
					}
				}
				for _, dir := range allDirs {
					for _, name := range ls(t, filepath.Join(q, dir)) {
						for _, f := range failed {
							if name == f {
								t.Errorf("%s: %s/%s is listed, but its close failed", when, dir, name)
							}
						}
					}
				}
				if n := stat(t, q, "ready"); n != float64(len(want)) {
					t.Errorf("%s: .stats ready = %v, want %d", when, n, len(want))
				}
			}
			checkStore("full")

			// Make room: delete messages (they may need room to be deleted),
			// then grow the filesystem.
			removed := 0
			for name := range want {
				if removed == 8 {
					break
				}
				err := unix.Unlink(filepath.Join(inbox, name))
				t.Logf("rm inbox/%s on a full filesystem: %s", name, errName(err))
				if err != nil {
					break
				}
				delete(want, name)
				removed++
			}
			o, w, c := rawPublish(filepath.Join(inbox, "after-rm"), body(2000))
			t.Logf("publish after removing %d messages: open=%s write=%s close=%s", removed, o, w, c)
			if o+w+c == "OKOKOK" {
				want["after-rm"] = body(2000)
			} else {
				failed = append(failed, "after-rm")
			}
			if err := unix.Mount("tmpfs", small, "tmpfs", unix.MS_REMOUNT|unix.MS_NODEV|unix.MS_NOSUID, "size=8m"); err != nil {
				t.Fatalf("grow the tmpfs: %v", err)
			}
			o, w, c = rawPublish(filepath.Join(inbox, "after-grow"), body(3000))
			t.Logf("publish after growing the filesystem: open=%s write=%s close=%s", o, w, c)
			if o+w+c != "OKOKOK" {
				t.Errorf("publish after growing the filesystem: open=%s write=%s close=%s, want OK", o, w, c)
				failed = append(failed, "after-grow")
			} else {
				want["after-grow"] = body(3000)
			}
			checkStore("after making room")
			// A lease and an ack work too.
			acked := testenv.MustSh(t, q, `m=$(cat .next) && rm "$m" && echo "${m#processing/}"`)
			delete(want, strings.TrimSpace(acked))

			// The store survives a restart intact.
			if err := d.Stop(); err != nil {
				t.Fatal(err)
			}
			d.Restart(t)
			checkStore("after a restart")
			if o, w, c := rawPublish(filepath.Join(inbox, "after-restart"), body(4000)); o+w+c != "OKOKOK" {
				t.Errorf("publish after the restart: open=%s write=%s close=%s", o, w, c)
			}
		})
	}
}

// The space runs out because of someone else (a file beside the store):
// the store may have room left in what it preallocated, so the failure can
// come after the commit point. Whatever happens, the daemon lives, what is
// listed reads back whole, and once the space comes back publishing works
// without a restart and nothing listed was lost.
func TestDiskFullFromOutside(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			small := smallFS(t, "4m")
			d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: backend, Sync: "full", Store: filepath.Join(small, "store"),
				Args: []string{"--min-free", "0"}})
			q := mkq(t, d, "q", "")
			inbox := filepath.Join(q, "inbox")
			body := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("%06d ", i)), 16<<10/7) }
			want := map[string][]byte{}
			publish := func(name string, i int) string {
				o, w, c := rawPublish(filepath.Join(inbox, name), body(i))
				if o+w+c == "OKOKOK" {
					want[name] = body(i)
					return "OK"
				}
				return fmt.Sprintf("open=%s write=%s close=%s", o, w, c)
			}
			if got := publish("first", 0); got != "OK" {
				t.Fatal(got)
			}
			filler := filepath.Join(small, "filler")
			testenv.FillDisk(t, filler)
			var results []string
			for i := 1; i <= 3; i++ {
				results = append(results, publish(fmt.Sprintf("full%d", i), i))
			}
			t.Logf("%s store, filesystem filled from outside: publishes %q", backend, results)
			if err := syscall.Kill(d.Pid(), 0); err != nil {
				t.Fatalf("daemon died: %v", err)
			}
			check := func(when string) {
				t.Helper()
				got := ls(t, inbox)
				if !sameSet(got, keys(want)) {
					t.Errorf("%s: inbox/ lists %q, want %q", when, sorted(got), sorted(keys(want)))
				}
				for _, name := range got {
					if b, err := os.ReadFile(filepath.Join(inbox, name)); err != nil || !bytes.Equal(b, want[name]) {
						t.Errorf("%s: inbox/%s reads %d bytes (%v)", when, name, len(b), err)
					}
				}
			}
			check("full")
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			// Both stores come back without a restart: what the full disk
			// stopped (the fs store's body files) was put off, not failed.
			var after string
			testenv.RetryUntil(20*time.Second, func() bool {
				after = publish("after-free", 10)
				return after == "OK"
			})
			t.Logf("%s store, publish once the space is back: %s", backend, after)
			if after != "OK" {
				t.Errorf("publish once the space is back: %s, want OK without a restart", after)
			}
			check("space back")
			if err := d.Stop(); err != nil {
				t.Fatal(err)
			}
			d.Restart(t)
			check("after a restart")
			if got := publish("after-restart", 11); got != "OK" {
				t.Errorf("publish after the restart: %s", got)
			}
		})
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// On an fs store whose disk is full, a publish fails at close(2) with
// ENOSPC and leaves nothing behind, while a lease of a message already
// there and a read of its body go on at once: a move takes no new space.
func TestFullDiskLeaseAndRead(t *testing.T) {
	small := smallFS(t, "4m")
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "fs", Sync: "full", Store: filepath.Join(small, "store"),
		Args: []string{"--min-free", "0"}})
	q := mkq(t, d, "q", "")
	inbox := filepath.Join(q, "inbox")
	body := bytes.Repeat([]byte("older message "), 16<<10/14)
	if o, w, c := rawPublish(filepath.Join(inbox, "old"), body); o+w+c != "OKOKOK" {
		t.Fatalf("publish: open=%s write=%s close=%s", o, w, c)
	}
	filler := filepath.Join(small, "filler")
	testenv.FillDisk(t, filler)
	defer os.Remove(filler)
	for i := range 3 {
		o, w, c := rawPublish(filepath.Join(inbox, fmt.Sprintf("new%d", i)), body)
		if c == "OK" || w+c == "OKOK" {
			t.Errorf("publish new%d on the full disk: open=%s write=%s close=%s, want ENOSPC", i, o, w, c)
		}
	}
	if names := ls(t, inbox); len(names) != 1 || names[0] != "old" {
		t.Errorf("inbox/ after the refused publishes: %v, want [old]", names)
	}
	if out, err := exec.Command("mv", filepath.Join(inbox, "old"), filepath.Join(q, "processing")+"/").CombinedOutput(); err != nil {
		t.Fatalf("mv inbox/old processing/: %v: %s", err, out)
	}
	out, err := exec.Command("timeout", "10", "cat", filepath.Join(q, "processing", "old")).Output()
	if err != nil || !bytes.Equal(out, body) {
		t.Fatalf("cat processing/old on the full disk: %d bytes, %v; want its %d bytes at once", len(out), err, len(body))
	}
}
