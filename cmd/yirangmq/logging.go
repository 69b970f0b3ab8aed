package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"yirangmq/queuecore"
)

// The daemon's log often lives on the disk it watches (with --daemon,
// STORE/yirangmq.log). On a full disk every refused publish is a failure
// worth a line, so a busy client could write the disk full with the log
// alone: lines of one kind are rate-limited (throttleHandler) and the log
// file is rotated at a size (rotatingFile).

// Throttle: a burst of throttleBurst lines of one kind, then one per
// throttleEvery, the next one saying how many were left out.
const (
	throttleBurst = 5
	throttleEvery = 10 * time.Second
	// keySuppressed counts lines of the same kind left out before this one.
	keySuppressed = "suppressed"
)

// throttleHandler rate-limits two kinds of lines:
//
//   - repeated failures: lines that carry an error of a class that repeats
//     for as long as its cause lasts (a full disk, a failing device, a
//     full queue), by kind: level, message and class;
//   - refusals of a user's operations: lines that name the caller's uid
//     (bad input: a name, a policy, a move not in the table), by kind and
//     per uid, so that one user's flood (a stress test opened 14,300 bad
//     files in 3 s, a line each) neither fills the log nor hides another
//     user's refusals.
//
// Every other line passes; the daemon's own lines are few (queuecore
// limits its free-space lines itself). Debug lines (--debug's request
// log) are never held back.
type throttleHandler struct {
	next  slog.Handler
	now   func() time.Time
	state *throttleState
}

type throttleState struct {
	mu    sync.Mutex
	kinds map[string]*throttleKind
}

type throttleKind struct {
	windowStart time.Time // start of the current interval
	n           int       // lines logged in the current interval
	suppressed  int       // lines left out since the last one logged
	last        time.Time // the kind's last line, logged or not
}

func newThrottleHandler(next slog.Handler, now func() time.Time) *throttleHandler {
	return &throttleHandler{next: next, now: now, state: &throttleState{kinds: map[string]*throttleKind{}}}
}

func (h *throttleHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *throttleHandler) Handle(ctx context.Context, r slog.Record) error {
	class, uid := throttleKey(r)
	if r.Level < slog.LevelInfo || class == "" && uid == "" {
		return h.next.Handle(ctx, r)
	}
	key := r.Level.String() + "\x00" + r.Message + "\x00" + class + "\x00" + uid
	now := h.now()
	s := h.state
	s.mu.Lock()
	k := s.kinds[key]
	if k == nil {
		if len(s.kinds) > 1024 {
			s.kinds = map[string]*throttleKind{} // bounded: forget old kinds
		}
		k = &throttleKind{windowStart: now}
		s.kinds[key] = k
	}
	if now.Sub(k.windowStart) >= throttleEvery {
		// A new interval: a burst again if the kind was quiet for a
		// whole interval, else one line.
		if now.Sub(k.last) > throttleEvery {
			k.n = 0
		} else {
			k.n = throttleBurst - 1
		}
		k.windowStart = now
	}
	k.last = now
	if k.n >= throttleBurst {
		k.suppressed++
		s.mu.Unlock()
		return nil
	}
	k.n++
	suppressed := k.suppressed
	k.suppressed = 0
	s.mu.Unlock()
	if suppressed > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int(keySuppressed, suppressed))
	}
	return h.next.Handle(ctx, r)
}

// stormErrors are the errors that repeat on every request while their
// cause lasts.
var stormErrors = []error{syscall.ENOSPC, syscall.EDQUOT, syscall.EIO, syscall.EROFS, queuecore.ErrDiskLow, queuecore.ErrQueueFull}

// logUID is the key under which a line names the user whose operation it
// is about (as fusefs and queuecore name it).
const logUID = "uid"

// throttleKey names the storm error a line carries, or "", and the uid it
// names, or "".
func throttleKey(r slog.Record) (class, uid string) {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == queuecore.LogUID {
			uid = a.Value.String()
			return true
		}
		err, ok := a.Value.Any().(error)
		if !ok || class != "" {
			return true
		}
		for _, s := range stormErrors {
			if errors.Is(err, s) {
				class = s.Error()
				break
			}
		}
		return true
	})
	return class, uid
}

func (h *throttleHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &throttleHandler{next: h.next.WithAttrs(as), now: h.now, state: h.state}
}

func (h *throttleHandler) WithGroup(name string) slog.Handler {
	return &throttleHandler{next: h.next.WithGroup(name), now: h.now, state: h.state}
}

// rotatingFile is an append-only log file that, once it reaches max
// bytes, is renamed to PATH.1 (replacing the one before) and started
// afresh: the log takes at most about twice max on disk. max 0 never
// rotates (for logrotate with copytruncate, or journald).
type rotatingFile struct {
	mu   sync.Mutex
	path string
	max  int64
	f    *os.File
	size int64
}

func openLogFile(path string, max int64) (*rotatingFile, error) {
	r := &rotatingFile{path: path, max: max}
	if err := r.open(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rotatingFile) open() error {
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	r.f, r.size = f, fi.Size()
	return nil
}

func (r *rotatingFile) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.max > 0 && r.size+int64(len(p)) > r.max && r.size > 0 {
		if err := os.Rename(r.path, r.path+".1"); err == nil {
			r.f.Close()
			if err := r.open(); err != nil {
				return 0, err
			}
		}
	}
	n, err := r.f.Write(p)
	r.size += int64(n)
	return n, err
}

func (r *rotatingFile) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.f.Close()
}

// parseSize reads a byte count: digits with an optional K, M or G suffix
// (powers of 1024; KiB, MB and the like are read the same way).
func parseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("want a size such as 4096, 512K, 64M or 1G, not %q", s)
	}
	return n * mult, nil
}

// parseMinFree reads --min-free: "auto" (queuecore's default), 0 or
// "off" for no floor, else a size.
func parseMinFree(s string) (int64, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto", "":
		return 0, nil
	case "off", "none":
		return -1, nil
	}
	n, err := parseSize(s)
	if err != nil {
		return 0, fmt.Errorf("--min-free: %w", err)
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}
