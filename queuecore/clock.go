package queuecore

import "time"

// Clock is the time source of the core: expiry, backoff and retention take
// their time from it, so tests can run hours of queue life in milliseconds.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	Stop() bool
}

// SystemClock is the real clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time                            { return time.Now() }
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
