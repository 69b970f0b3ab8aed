package queuecore

import (
	"errors"
	"strconv"
)

// Sentinel errors of the queue core. fusefs maps each to one errno in one
// place; callers test them with errors.Is.
var (
	ErrNotFound    = errors.New("not found")                            // ENOENT
	ErrExists      = errors.New("already exists")                       // EEXIST
	ErrImmutable   = errors.New("committed messages cannot be changed") // EPERM
	ErrNotAllowed  = errors.New("operation not allowed")                // EPERM: a transition not in the table
	ErrNotEmpty    = errors.New("queue is not empty")                   // ENOTEMPTY
	ErrQueueFull   = errors.New("queue holds maxReady ready messages")  // EDQUOT
	ErrTooLarge    = errors.New("message larger than maxMessageBytes")  // EFBIG
	ErrPaused      = errors.New("queue is paused")                      // EAGAIN
	ErrEmpty       = errors.New("no message is ready")                  // EAGAIN (non-blocking receive)
	ErrLocked      = errors.New("store is in use by another process")   // EBUSY
	ErrClosed      = errors.New("queue core is closed")                 // EIO
	ErrInvalidName = errors.New("invalid name")                         // EINVAL
	// ErrDiskLow refuses a publish while the store's filesystem has less
	// free space than the floor (space.go).
	ErrDiskLow = errors.New("free space under the store is below the floor (--min-free)") // ENOSPC
	// ErrPolicyBroken: the queue's stored policy cannot be loaded, so the
	// queue is closed until a valid policy is written to its .policy.
	ErrPolicyBroken = errors.New("the queue's stored policy cannot be loaded; write a valid .policy") // EIO
	// ErrStoreFull: the store holds as many messages as it may keep (the
	// fs store's --fs-max-messages), so it takes no new one.
	ErrStoreFull = errors.New("the store holds as many messages as it may keep") // EDQUOT
)

// InputError is bad input from a user: an invalid name, policy or flag.
// It wraps ErrInvalid-like causes and maps to EINVAL.
type InputError struct {
	Field string // what was wrong: "name", "policy.retry.limit", ...
	Msg   string
	Err   error // optional cause
}

func (e *InputError) Error() string {
	s := "invalid " + e.Field + ": " + e.Msg
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *InputError) Unwrap() error { return e.Err }

// ValidationError is a message that the queue's format or schema rejected.
// The message itself has been kept in dlq/ with reason VALIDATION_ERROR
// unless Kept is false (its name was taken, or the store failed).
type ValidationError struct {
	Queue, Name string
	Reason      string
	Kept        bool
}

func (e *ValidationError) Error() string {
	s := "message " + quote(e.Name) + " rejected by queue " + quote(e.Queue) + ": " + e.Reason
	if e.Kept {
		s += " (kept in dlq/ with reason " + ReasonValidation + ")"
	}
	return s
}

func quote(s string) string { return strconv.Quote(s) }

// Reason codes recorded on dead letters and failures (user.yirangmq.reason).
const (
	ReasonManual        = "MANUAL"           // moved to dlq/ by hand
	ReasonLeaseExpired  = "LEASE_EXPIRED"    // lease ran out with the retry limit spent
	ReasonValidation    = "VALIDATION_ERROR" // the queue's format or schema rejected it
	ReasonNacked        = "NACKED"           // returned by its consumer with the retry limit spent
	ReasonHandlerFailed = "HANDLER_FAILED"   // yirangmq consume: the handler exited non-zero
)
