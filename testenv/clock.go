// Package testenv holds what tests need beyond the standard library: a
// clock that tests move by hand, and (as the filesystem layer arrives)
// helpers that mount a real filesystem, spawn and kill the daemon, and
// check histories.
package testenv

import (
	"sort"
	"sync"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// FakeClock is a queuecore.Clock that only moves when told to, so tests of
// expiry, backoff and retention run in milliseconds.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

var _ queuecore.Clock = (*FakeClock)(nil)

type fakeTimer struct {
	c       *FakeClock
	at      time.Time
	f       func()
	stopped bool
}

// NewFakeClock starts at t.
func NewFakeClock(t time.Time) *FakeClock { return &FakeClock{now: t} }

func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *FakeClock) AfterFunc(d time.Duration, f func()) queuecore.Timer {
	c.mu.Lock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	fire := d <= 0
	if !fire {
		c.timers = append(c.timers, t)
	}
	c.mu.Unlock()
	if fire {
		go f()
	}
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// Advance moves the clock by d and fires the timers that came due, in
// order, each in its own goroutine as time.AfterFunc does.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due, keep []*fakeTimer
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			due = append(due, t)
		default:
			keep = append(keep, t)
		}
	}
	c.timers = keep
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		go t.f()
	}
}

// Pending is the number of armed timers (for tests that check the core
// does not poll when nothing is due).
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped {
			n++
		}
	}
	return n
}

// RetryUntil polls cond until it is true or timeout passes; it reports
// whether cond became true. It is the one polling loop of the tests. It
// polls every millisecond at first and backs off to every 20 ms, so that
// a condition that holds soon is seen at once and a long wait (a read of
// the mount or of a log file each time) costs a loaded machine little.
func RetryUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	interval := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
		interval = min(2*interval, 20*time.Millisecond)
	}
}

// MustRetryUntil is RetryUntil that fails the test, saying what it waited
// for, when cond does not become true within timeout.
func MustRetryUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !RetryUntil(timeout, cond) {
		t.Fatalf("timed out after %s waiting for: %s", timeout, what)
	}
}
