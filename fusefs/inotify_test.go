package fusefs_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// TestInotifyEvents checks the inotify table of docs/contract.md §3: the
// kernel raises events for what local processes do through the mount, and
// none for the moves the daemon makes by itself (it never notifies the
// kernel of them: see docs/fusefs.md).
func TestInotifyEvents(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"retry": {"limit": 5, "backoff": "fixed", "initialDelaySec": 1, "maxDelaySec": 1}}`)
		inbox := filepath.Join(q, "inbox")
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		mask := uint32(unix.IN_CREATE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE)
		if _, err := unix.InotifyAddWatch(fd, inbox, mask); err != nil {
			t.Fatal(err)
		}
		step := func(what string, want string, do func()) {
			t.Helper()
			do()
			if got := inotifyEvents(t, fd, 300*time.Millisecond); got != want {
				t.Errorf("%s: inotify events %q, want %q", what, got, want)
			}
		}
		step("publish", "CREATE m,MODIFY m,CLOSE_WRITE m", func() {
			must(t, os.WriteFile(filepath.Join(inbox, "m"), []byte("x"), 0o644))
		})
		step("rename within inbox/", "MOVED_FROM m,MOVED_TO job", func() {
			must(t, os.Rename(filepath.Join(inbox, "m"), filepath.Join(inbox, "job")))
		})
		step("lease", "MOVED_FROM job", func() {
			must(t, os.Rename(filepath.Join(inbox, "job"), filepath.Join(q, "processing", "job")))
		})
		step("nack (the message waits in delayed/)", "MOVED_TO job", func() {
			must(t, os.Rename(filepath.Join(q, "processing", "job"), filepath.Join(inbox, "job")))
		})
		wantNames(t, "delayed/ after the nack", ls(t, filepath.Join(q, "delayed")), "job")
		// The backoff ends: the message is ready again, and nothing says so.
		testenv.RetryUntil(10*time.Second, func() bool { return len(ls(t, inbox)) != 0 })
		wantNames(t, "inbox/ after the backoff", ls(t, inbox), "job")
		if got := inotifyEvents(t, fd, 300*time.Millisecond); got != "" {
			t.Errorf("end of a backoff: inotify events %q, want none", got)
		}
		step(".next lease", "", func() {
			if got := readFile(t, filepath.Join(q, ".next")); got != "processing/job\n" {
				t.Fatalf(".next = %q", got)
			}
		})
		step("ack", "", func() { must(t, os.Remove(filepath.Join(q, "processing", "job"))) })
	})
}

// inotifyEvents reads what arrives within wait: "KIND name" joined by commas.
func inotifyEvents(t *testing.T, fd int, wait time.Duration) string {
	t.Helper()
	names := map[uint32]string{unix.IN_CREATE: "CREATE", unix.IN_MODIFY: "MODIFY", unix.IN_CLOSE_WRITE: "CLOSE_WRITE",
		unix.IN_MOVED_FROM: "MOVED_FROM", unix.IN_MOVED_TO: "MOVED_TO", unix.IN_DELETE: "DELETE"}
	var out []string
	buf := make([]byte, 64*1024)
	end := time.Now().Add(wait)
	for time.Now().Before(end) {
		n, err := unix.Read(fd, buf)
		if err == unix.EAGAIN || n <= 0 {
			// Wait for the next event or the end of the window.
			if ms := int(time.Until(end) / time.Millisecond); ms > 0 {
				unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			kind := names[ev.Mask&^unix.IN_ISDIR]
			if kind == "" {
				kind = "0x" + strconv.FormatUint(uint64(ev.Mask), 16)
			}
			out = append(out, kind+" "+name)
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
	return strings.Join(out, ",")
}
