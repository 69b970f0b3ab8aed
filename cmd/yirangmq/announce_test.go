package main

import (
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// TestAnnounce: with yirangmq announce running, a message that becomes
// ready by itself (the end of a nack's backoff) raises an inotify event in
// inbox/, which it does not without it (fusefs TestInotifyEvents); and the
// helper changes nothing in the queue.
func TestAnnounce(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", `{"retry": {"limit": 5, "backoff": "fixed", "initialDelaySec": 1, "maxDelaySec": 1}}`)
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	inbox := d.Path("jobs", "inbox")
	if _, err := unix.InotifyAddWatch(fd, inbox, unix.IN_ATTRIB|unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	name := publishN(t, d, "jobs", "work")[0]
	if err := os.Rename(msgPath(d, "jobs", "inbox", name), msgPath(d, "jobs", "processing", name)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(msgPath(d, "jobs", "processing", name), msgPath(d, "jobs", "inbox", name)); err != nil {
		t.Fatal(err)
	}
	if got := names(t, d, "jobs", "delayed"); len(got) != 1 {
		t.Fatalf("delayed holds %q after the nack", got)
	}
	inotifyNames(fd) // the nack's own IN_MOVED_TO, and anything before
	// The helper starts now, so that every event from here on is its own
	// (the message may be ready before its first look: it is announced then).
	c := startChild(t, nil, "announce", "--mount", d.Mountpoint, "--queue", "jobs", "--interval", "100ms")
	// The backoff ends by itself: the helper must make inbox/ say so.
	var got []string
	testenv.MustRetryUntil(t, 10*time.Second, "no event when the message became ready by itself", func() bool {
		got = append(got, inotifyNames(fd)...)
		return len(got) > 0
	})
	if got[0] != "ATTRIB "+name {
		t.Errorf("events %q, want ATTRIB %s", got, name)
	}
	if v := xattr(t, msgPath(d, "jobs", "inbox", name), "attempts"); v != "1" {
		t.Errorf("attempts %q, want 1 (the nack only)", v)
	}
	c.stop(t)
}

// inotifyNames returns the events waiting on fd, as "KIND name".
func inotifyNames(fd int) []string {
	var out []string
	buf := make([]byte, 16*1024)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil || n <= 0 {
			return out
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			kind := "OTHER"
			switch {
			case ev.Mask&unix.IN_ATTRIB != 0:
				kind = "ATTRIB"
			case ev.Mask&unix.IN_CREATE != 0:
				kind = "CREATE"
			case ev.Mask&unix.IN_MOVED_TO != 0:
				kind = "MOVED_TO"
			}
			out = append(out, kind+" "+name)
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}
