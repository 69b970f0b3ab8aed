package fusefs

import (
	"context"
	"errors"
	"syscall"

	"yirangmq/queuecore"
)

// errnoOf is the one mapping from the core's errors to errnos.
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var ie *queuecore.InputError
	var ve *queuecore.ValidationError
	var errno syscall.Errno
	switch {
	case errors.As(err, &ie), errors.As(err, &ve):
		return syscall.EINVAL
	case errors.Is(err, queuecore.ErrNotFound):
		return syscall.ENOENT
	case errors.Is(err, queuecore.ErrExists):
		return syscall.EEXIST
	case errors.Is(err, queuecore.ErrImmutable), errors.Is(err, queuecore.ErrNotAllowed):
		return syscall.EPERM
	case errors.Is(err, queuecore.ErrNotEmpty):
		return syscall.ENOTEMPTY
	case errors.Is(err, queuecore.ErrQueueFull):
		return syscall.EDQUOT
	case errors.Is(err, queuecore.ErrTooLarge):
		return syscall.EFBIG
	case errors.Is(err, queuecore.ErrPaused), errors.Is(err, queuecore.ErrEmpty):
		return syscall.EAGAIN
	case errors.Is(err, queuecore.ErrLocked):
		return syscall.EBUSY
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return syscall.EINTR
	case errors.As(err, &errno):
		return errno // ENOSPC, EIO, EDQUOT from the store's filesystem
	}
	return syscall.EIO
}
