package fusefs

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"yirangmq/queuecore"
)

// FuzzErrnoOf: whatever a store or the core wraps, and however deep, an
// error never reaches the kernel as 0 (success), a sentinel keeps its
// errno through %w chains, and the errno of the store's filesystem (a full
// disk) is what close(2) returns when nothing more specific is in the chain;
// any other errno (a database socket's ENOENT) is EIO, never passed on.
func FuzzErrnoOf(f *testing.F) {
	f.Add(uint8(0), uint8(1), uint16(28))
	f.Add(uint8(12), uint8(3), uint16(5))
	f.Add(uint8(13), uint8(0), uint16(0))
	causes := []struct {
		err  error
		want syscall.Errno // 0: the errno of the fuzzed syscall.Errno
	}{
		{queuecore.ErrNotFound, syscall.ENOENT},
		{queuecore.ErrExists, syscall.EEXIST},
		{queuecore.ErrImmutable, syscall.EPERM},
		{queuecore.ErrNotAllowed, syscall.EPERM},
		{queuecore.ErrNotEmpty, syscall.ENOTEMPTY},
		{queuecore.ErrQueueFull, syscall.EDQUOT},
		{queuecore.ErrTooLarge, syscall.EFBIG},
		{queuecore.ErrPaused, syscall.EAGAIN},
		{queuecore.ErrEmpty, syscall.EAGAIN},
		{queuecore.ErrLocked, syscall.EBUSY},
		{&queuecore.InputError{Field: "name", Msg: "bad", Err: queuecore.ErrInvalidName}, syscall.EINVAL},
		{&queuecore.ValidationError{Queue: "q", Name: "m", Reason: "not JSON", Kept: true}, syscall.EINVAL},
		{context.Canceled, syscall.EINTR},
		{context.DeadlineExceeded, syscall.EIO}, // a store's timeout
		{fmt.Errorf("dial unix /tmp/.s.PGSQL.5432: %w", syscall.ENOENT), syscall.EIO},
		{nil, 0}, // a bare syscall.Errno
		{errors.New("opaque"), syscall.EIO},
	}
	f.Fuzz(func(t *testing.T, which, depth uint8, errno uint16) {
		c := causes[int(which)%len(causes)]
		err := c.err
		want := c.want
		if err == nil {
			e := syscall.Errno(errno)
			if e == 0 {
				e = syscall.ENOSPC
			}
			err, want = e, syscall.EIO
			if storeErrno(e) {
				want = e // a full disk, a read-only store: what close(2) says
			}
		}
		for i := 0; i < int(depth%8); i++ {
			if i%2 == 0 {
				err = fmt.Errorf("layer %d: %w", i, err)
			} else {
				err = &fmtWrapped{err}
			}
		}
		got := errnoOf(err)
		if got == 0 {
			t.Fatalf("errnoOf(%v) = 0: an error answered as success", err)
		}
		if got != want {
			t.Fatalf("errnoOf(%v) = %v, want %v", err, got, want)
		}
		if errnoOf(nil) != 0 {
			t.Fatal("errnoOf(nil) != 0")
		}
	})
}

// fmtWrapped is a store's own error type around a cause.
type fmtWrapped struct{ err error }

func (e *fmtWrapped) Error() string { return "store: " + e.err.Error() }
func (e *fmtWrapped) Unwrap() error { return e.err }

// FuzzNameTooLong: the Lookup guard agrees with NAME_MAX and with the
// core's own limit on message names.
func FuzzNameTooLong(f *testing.F) {
	f.Add(254)
	f.Add(255)
	f.Add(256)
	f.Fuzz(func(t *testing.T, n int) {
		n = min(max(n, 0), 1<<16)
		name := string(make([]byte, n))
		if nameTooLong(name) != (n > 255) {
			t.Fatalf("nameTooLong of %d bytes = %v", n, nameTooLong(name))
		}
		if n > queuecore.MaxMessageName && !nameTooLong(name) {
			t.Fatalf("a name of %d bytes passes Lookup but no message can have it", n)
		}
	})
}
