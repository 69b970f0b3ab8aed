package fusefs

import (
	"context"
	"errors"
	"syscall"

	"yirangmq/queuecore"
)

// errDraftsFull refuses a write past the bounds on uncommitted bytes
// (Options.MaxDraftBytes, MaxDraftBytesPerUID): the mount's own quota,
// not a queue's.
var errDraftsFull = errors.New("too many uncommitted bytes")

// errMemoryFull refuses a new message while the daemon is at its memory
// budget (Options.MemoryBudget, memory.go): like a full disk, ENOSPC.
var errMemoryFull = errors.New("the daemon is at its memory budget")

// errnoOf is the one mapping from the core's errors (and errDraftsFull,
// errMemoryFull) to errnos.
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var ie *queuecore.InputError
	var ve *queuecore.ValidationError
	var errno syscall.Errno
	switch {
	case errors.As(err, &ie), errors.As(err, &ve), errors.Is(err, queuecore.ErrInvalidName):
		return syscall.EINVAL
	case errors.Is(err, queuecore.ErrNotFound):
		return syscall.ENOENT
	case errors.Is(err, queuecore.ErrExists):
		return syscall.EEXIST
	case errors.Is(err, queuecore.ErrImmutable), errors.Is(err, queuecore.ErrNotAllowed):
		return syscall.EPERM
	case errors.Is(err, queuecore.ErrNotEmpty):
		return syscall.ENOTEMPTY
	case errors.Is(err, queuecore.ErrQueueFull), errors.Is(err, queuecore.ErrStoreFull), errors.Is(err, errDraftsFull):
		return syscall.EDQUOT
	case errors.Is(err, queuecore.ErrDiskLow), errors.Is(err, errMemoryFull):
		// The device, not the queue, is full: ENOSPC, as a write to a
		// full disk gets, and unlike maxReady's EDQUOT (docs/reliability.md).
		return syscall.ENOSPC
	case errors.Is(err, queuecore.ErrTooLarge):
		return syscall.EFBIG
	case errors.Is(err, queuecore.ErrPaused), errors.Is(err, queuecore.ErrEmpty):
		return syscall.EAGAIN
	case errors.Is(err, queuecore.ErrPolicyBroken), errors.Is(err, queuecore.ErrClosed):
		return syscall.EIO
	case errors.Is(err, queuecore.ErrLocked):
		return syscall.EBUSY
	case errors.Is(err, context.Canceled):
		return syscall.EINTR // a signal ended a wait (.next)
	case errors.As(err, &errno) && storeErrno(errno):
		return errno // ENOSPC, EDQUOT, EROFS… from the store's filesystem
	}
	// Anything else is the store failing: a timeout, an errno that means
	// something else here (a database socket's ENOENT or ECONNREFUSED).
	return syscall.EIO
}

// storeErrno reports whether an errno of the store's own filesystem means
// the same to the caller of a mount and passes through.
func storeErrno(e syscall.Errno) bool {
	switch e {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EIO, syscall.EROFS, syscall.EFBIG, syscall.ENOMEM:
		return true
	}
	return false
}
