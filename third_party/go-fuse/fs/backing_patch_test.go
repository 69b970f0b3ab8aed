package fs

import (
	"bytes"
	"log"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// backingServer answers RegisterBackingFd with errno, or with ID 7.
type backingServer struct {
	ServerCallbacks
	errno syscall.Errno
	calls int
}

func (s *backingServer) RegisterBackingFd(*fuse.BackingMap) (int32, syscall.Errno) {
	s.calls++
	if s.errno != 0 {
		return 0, s.errno
	}
	return 7, 0
}

func (s *backingServer) UnregisterBackingFd(int32) syscall.Errno { return 0 }

type fdFile struct{}

func (fdFile) PassthroughFd() (int, bool) { return 3, true }

// TestBackingRefusal (patch 3 of PATCHES.md): a refusal for one file or for
// now leaves that open without passthrough and with direct I/O, and the
// next open tries again; only a refusal for good (EPERM, no passthrough in
// the kernel) stops the bridge from trying.
func TestBackingRefusal(t *testing.T) {
	for _, tc := range []struct {
		errno   syscall.Errno
		forGood bool
	}{
		{syscall.ENOMEM, false},
		{syscall.ENOSPC, false},
		{syscall.EBADF, false},
		{syscall.EPERM, true},
		{syscall.ENOTTY, true},
		{syscall.ELOOP, true}, // a store on overlayfs: every file
		{syscall.EINVAL, true},
	} {
		srv := &backingServer{errno: tc.errno}
		var logged bytes.Buffer
		b := &rawBridge{server: srv, options: Options{Logger: log.New(&logged, "", 0)}}
		e := &nodeEntry{}
		fe := &fileEntry{}
		out := fuse.OpenOut{OpenFlags: fuse.FOPEN_KEEP_CACHE}
		b.addBackingID(e, fe, fdFile{}, &out)
		if b.disableBackingFiles != tc.forGood {
			t.Errorf("%v: passthrough disabled for good = %v, want %v", tc.errno, b.disableBackingFiles, tc.forGood)
		}
		if fe.backing || e.backingID != 0 || out.OpenFlags&fuse.FOPEN_PASSTHROUGH != 0 {
			t.Errorf("%v: a refused open took a backing ID: %+v %+v %x", tc.errno, fe, e.backingID, out.OpenFlags)
		}
		if !tc.forGood && (out.OpenFlags&fuse.FOPEN_DIRECT_IO == 0 || out.OpenFlags&fuse.FOPEN_KEEP_CACHE != 0) {
			t.Errorf("%v: open flags %x, want direct I/O and no page cache", tc.errno, out.OpenFlags)
		}
		// One line says what happened.
		want := "open served without passthrough"
		if tc.forGood {
			want = "passthrough off for this mount"
		}
		if lines := strings.Split(strings.TrimSpace(logged.String()), "\n"); len(lines) != 1 || !strings.Contains(lines[0], tc.errno.Error()) || !strings.Contains(lines[0], want) {
			t.Errorf("%v: logged %q, want one line naming the error and %q", tc.errno, logged.String(), want)
		}
		// The next open: registration works now.
		srv.errno = 0
		out = fuse.OpenOut{OpenFlags: fuse.FOPEN_KEEP_CACHE}
		b.addBackingID(e, fe, fdFile{}, &out)
		got := out.OpenFlags&fuse.FOPEN_PASSTHROUGH != 0
		if got == tc.forGood {
			t.Errorf("%v: next open passthrough = %v, want %v", tc.errno, got, !tc.forGood)
		}
	}
}
