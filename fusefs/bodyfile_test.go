package fusefs_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// bigBody is n bytes that differ per message (seed) and per position.
func bigBody(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i/4096) ^ byte(i) ^ seed
	}
	return b
}

// TestBigBodies reads messages of a few MiB through the mount: whole, by
// another user of an allow_other mount, from descriptors opened before the
// message was leased, acked and its name taken by a new message, and from
// two descriptors at once (both stores hand their body files to the
// kernel, see docs/performance-history.md).
func TestBigBodies(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Args: []string{"-o", "allow_other"}}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "big", `{"maxMessageBytes": 8388608}`)
		first, second := bigBody(1, 3<<20+123), bigBody(2, 3<<20+123)
		path := filepath.Join(q, "inbox", "m")
		if err := os.WriteFile(path, first, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, first) {
			t.Fatalf("read back: %d bytes, err %v; want the %d bytes written", len(got), err, len(first))
		}

		if os.Getuid() == 0 {
			openPath(t, d)
			out := sharedDir(t)
			if err := os.Chmod(out, 0o777); err != nil {
				t.Fatal(err)
			}
			if r := asUser(t, nobody, q, "cat inbox/m > "+out+"/copy"); r.Code != 0 {
				t.Fatalf("cat as uid %d: %d %s", nobody, r.Code, r.Stderr)
			}
			if got, err := os.ReadFile(filepath.Join(out, "copy")); err != nil || !bytes.Equal(got, first) {
				t.Fatalf("cat as uid %d: %d bytes, err %v; want the %d bytes written", nobody, len(got), err, len(first))
			}
			// Writing stays refused to anyone, through any open.
			if r := asUser(t, nobody, q, "printf x >> inbox/m"); r.Code == 0 {
				t.Fatalf("uid %d appended to a committed message", nobody)
			}
		}

		// Two descriptors at once, both before the message moves on.
		a, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if _, err := a.WriteAt([]byte("x"), 0); err == nil {
			t.Fatal("a write through a read-only descriptor succeeded")
		}
		testenv.MustSh(t, q, "mv inbox/m processing/ && rm processing/m")
		if err := os.WriteFile(path, second, 0o644); err != nil {
			t.Fatal(err)
		}
		for i, f := range []*os.File{a, b} {
			got := make([]byte, len(first)+10)
			n, err := f.ReadAt(got, 0)
			if n != len(first) || !bytes.Equal(got[:n], first) {
				t.Fatalf("descriptor %d opened before the ack: read %d bytes (err %v), want the %d bytes of the acked message", i, n, err, len(first))
			}
		}
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, second) {
			t.Fatalf("new message of the same name: %d bytes, err %v; want its own %d bytes", len(got), err, len(second))
		}
		// mmap reads the same bytes.
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		m, err := unix.Mmap(int(f.Fd()), 0, len(second), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatalf("mmap of a message: %v", err)
		}
		defer unix.Munmap(m)
		if !bytes.Equal(m, second) {
			t.Fatal("mmap of a message shows other bytes than it holds")
		}
	})
}

// TestBodyPassthrough: a big message opened for reading is read by the
// kernel from the store's body file without the daemon (FUSE passthrough):
// reads succeed while the daemon is stopped. The fs store keeps every body
// in a file, the sqlite store those of 256 KiB or more. Kernels before 6.9
// have no passthrough; there the reads go through the daemon.
func TestBodyPassthrough(t *testing.T) {
	needPassthrough(t)
	for _, backend := range []string{"fs", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: backend})
			q := mkq(t, d, "big", `{"maxMessageBytes": 8388608}`)
			body := bigBody(3, 2<<20)
			path := filepath.Join(q, "inbox", "m")
			if err := os.WriteFile(path, body, 0o644); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				// The fs store writes the body file just after the
				// commit; until then an open is served from memory. The
				// sqlite store writes it before the commit.
				f, err := os.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				passed := readStopped(t, d, f, body)
				f.Close()
				if passed {
					return
				}
				if backend == "sqlite" {
					t.Fatal("the first open of a committed message was not read by the kernel alone: no passthrough")
				}
				if time.Now().After(deadline) {
					t.Fatal("no open of the message was read by the kernel alone within 5 s: no passthrough")
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// readStopped reads f whole with the daemon stopped (SIGSTOP) and reports
// whether that finished within a second; the daemon is continued either
// way, and what was read must be want.
func readStopped(t *testing.T, d *testenv.Daemon, f *os.File, want []byte) bool {
	t.Helper()
	// Pages a previous read left would answer without the daemon too.
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(d.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	done := make(chan []byte, 1)
	go func() {
		got := make([]byte, len(want)+1)
		n, _ := f.ReadAt(got, 0)
		done <- got[:n]
	}()
	var got []byte
	stopped := true
	select {
	case got = <-done:
	case <-time.After(time.Second):
		stopped = false
	}
	if err := syscall.Kill(d.Pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !stopped {
		got = <-done
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want the %d bytes written", len(got), len(want))
	}
	return stopped
}

// needPassthrough skips a test that needs FUSE passthrough to happen.
func needPassthrough(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root: the kernel takes backing files from root only")
	}
	if !kernelAtLeast(6, 9) {
		t.Skip("FUSE passthrough needs Linux 6.9")
	}
}

func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var ma, mi int
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		return false
	}
	for _, c := range parts[0] {
		ma = ma*10 + int(c-'0')
	}
	for _, c := range parts[1] {
		if c < '0' || c > '9' {
			break
		}
		mi = mi*10 + int(c-'0')
	}
	return ma > major || ma == major && mi >= minor
}

// TestBodyFileOutOfDescriptors: a client that holds more messages open
// than the daemon has descriptors gets every one (past the bound on body
// files held, from a copy of the body), and the store keeps working (fs
// store, a daemon limited to 96 descriptors).
func TestBodyFileOutOfDescriptors(t *testing.T) {
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "fs", Wrap: []string{"prlimit", "--nofile=96:96", "--"}})
	q := mkq(t, d, "q", "")
	const n = 150
	for i := range n {
		if err := os.WriteFile(filepath.Join(q, "inbox", fmt.Sprint("m", i)), bigBody(byte(i), 5000), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for i := range n {
		f, err := os.Open(filepath.Join(q, "inbox", fmt.Sprint("m", i)))
		if err != nil {
			t.Fatalf("open of message %d with %d open: %v", i, len(files), err)
		}
		files = append(files, f)
	}
	for i, f := range files {
		got := make([]byte, 6000)
		k, _ := f.ReadAt(got, 0)
		if !bytes.Equal(got[:k], bigBody(byte(i), 5000)) {
			t.Fatalf("message %d: read %d bytes, not its body", i, k)
		}
	}
	// The store still has descriptors for its own files.
	later := bigBody(200, 5000)
	if err := os.WriteFile(filepath.Join(q, "inbox", "later"), later, 0o644); err != nil {
		t.Fatalf("publish with %d messages open: %v", len(files), err)
	}
	if got, err := os.ReadFile(filepath.Join(q, "inbox", "later")); err != nil || !bytes.Equal(got, later) {
		t.Fatalf("read with %d messages open: %d bytes, %v", len(files), len(got), err)
	}
}

// TestReadRightAfterPublish reads each message back as soon as its
// close(2) returned, 2,000 times, on the fs store, whose reads are passed
// through to its body files. The RELEASE of the publishing descriptor
// comes after close(2) returns, so it can reach the daemon while the
// reader's OPEN is being answered; go-fuse used to give back the node's
// backing file at any RELEASE, then answered the OPEN with the closed
// backing ID, and the kernel failed the open with EIO (about 1 in 100
// here; see third_party/go-fuse/PATCHES.md).
func TestReadRightAfterPublish(t *testing.T) {
	needPassthrough(t)
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "fs"})
	q := mkq(t, d, "q", "")
	var failed []string
	for i := range 2000 {
		path := filepath.Join(q, "inbox", fmt.Sprintf("m%d", i))
		want := fmt.Sprintf("message %d\n", i)
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(want); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			failed = append(failed, fmt.Sprintf("m%d: %q, %v", i, got, err))
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of 2000 reads right after the publish failed, the first: %s", len(failed), failed[0])
	}
}

// TestPassthroughRefusedOnOverlay: on a store in an overlayfs the kernel
// refuses every backing file (ELOOP: stacked too deep). Messages still
// read whole through the daemon, and the log says once, as a warning,
// that passthrough is off for the mount.
func TestPassthroughRefusedOnOverlay(t *testing.T) {
	needPassthrough(t)
	base := t.TempDir()
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	merged := filepath.Join(base, "merged")
	opts := "lowerdir=" + filepath.Join(base, "lower") + ",upperdir=" + filepath.Join(base, "upper") + ",workdir=" + filepath.Join(base, "work")
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("cannot mount an overlayfs here: %v", err)
	}
	t.Cleanup(func() {
		// After the daemons (cleanups run last first), before TempDir's
		// removal, which must not reach through a mount left behind.
		if err := unix.Unmount(merged, 0); err != nil {
			t.Errorf("unmount the overlayfs: %v", err)
			if err := unix.Unmount(merged, unix.MNT_DETACH); err != nil {
				t.Errorf("detach the overlayfs: %v", err)
			}
		}
	})
	for _, backend := range []string{"fs", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: backend, Store: filepath.Join(merged, backend)})
			q := mkq(t, d, "big", `{"maxMessageBytes": 8388608}`)
			for i := range 3 {
				body := bigBody(byte(i), 1<<20)
				path := filepath.Join(q, "inbox", fmt.Sprint("m", i))
				if err := os.WriteFile(path, body, 0o644); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					got, err := os.ReadFile(path)
					if err != nil || !bytes.Equal(got, body) {
						t.Fatalf("read %s: %d bytes (%v), want the %d written", path, len(got), err, len(body))
					}
				}
			}
			const line = "passthrough off for this mount"
			testenv.MustRetryUntil(t, 5*time.Second, "the log line "+line, func() bool {
				return strings.Contains(d.Log(), line)
			})
			if n := strings.Count(d.Log(), line); n != 1 {
				t.Errorf("%d log lines say %q, want 1", n, line)
			}
			for _, l := range strings.Split(d.Log(), "\n") {
				if strings.Contains(l, line) && (!strings.Contains(l, "level=WARN") || !strings.Contains(l, "too many levels of symbolic links")) {
					t.Errorf("log line %q: want a warning naming the kernel's error", l)
				}
			}
		})
	}
}
