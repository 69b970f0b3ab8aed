package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// Lines of one kind: a burst, then one per interval with the count of
// those left out; other kinds are not held back by it.
func TestThrottleHandler(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(1_000_000, 0)
	log := slog.New(newThrottleHandler(slog.NewTextHandler(&out, nil), func() time.Time { return now }))
	full := fmt.Errorf("q/m: %w", queuecore.ErrDiskLow)
	for i := 0; i < 100; i++ {
		log.Info("create refused", "name", i, "err", full)
	}
	log.Warn("another kind", "err", syscall.ENOSPC)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != throttleBurst+1 {
		t.Fatalf("100 lines of one kind and 1 of another in one instant gave %d lines, want %d:\n%s", len(lines), throttleBurst+1, out.String())
	}
	out.Reset()
	now = now.Add(throttleEvery)
	for i := 0; i < 100; i++ {
		log.Info("create refused", "name", i, "err", full)
	}
	got := out.String()
	if n := strings.Count(got, "\n"); n != 1 || !strings.Contains(got, keySuppressed+"=95") {
		t.Errorf("next interval: %q, want one line saying 95 were left out", got)
	}
	out.Reset()
	now = now.Add(throttleEvery)
	log.Info("create refused", "name", "x", "err", full)
	if got := out.String(); !strings.Contains(got, keySuppressed+"=99") {
		t.Errorf("third interval: %q, want 99 left out", got)
	}
	// Quiet for a whole interval: a burst again.
	out.Reset()
	now = now.Add(3 * throttleEvery)
	for i := 0; i < 10; i++ {
		log.Info("create refused", "name", i, "err", full)
	}
	if n := strings.Count(out.String(), "\n"); n != throttleBurst {
		t.Errorf("after a quiet interval: %d lines, want a burst of %d", n, throttleBurst)
	}
	// Lines with neither a storm error nor a uid (the daemon's own) pass.
	out.Reset()
	for i := 0; i < 20; i++ {
		log.Info("queue created", "err", errors.New("not a storm"))
	}
	if n := strings.Count(out.String(), "\n"); n != 20 {
		t.Errorf("lines without a storm error or a uid: %d of 20 written", n)
	}
	// Refusals of a user's bad input (a line naming a uid) are held back
	// by kind and per uid: one user's flood does not hide another's.
	out.Reset()
	for i := 0; i < 1000; i++ {
		log.Warn("create refused", "name", i, queuecore.LogUID, 1000, "err", errors.New("invalid name"))
	}
	log.Warn("create refused", "name", "x", queuecore.LogUID, 1001, "err", errors.New("invalid name"))
	log.Warn("rename refused", "name", "x", queuecore.LogUID, 1000)
	got = out.String()
	if n := strings.Count(got, "\n"); n != throttleBurst+2 {
		t.Errorf("1000 refusals of uid 1000, one of uid 1001, one of another kind: %d lines, want %d:\n%s", n, throttleBurst+2, got)
	}
	if !strings.Contains(got, "uid=1001") || !strings.Contains(got, `msg="rename refused"`) {
		t.Errorf("the refusals of another uid or kind were held back:\n%s", got)
	}
	out.Reset()
	now = now.Add(throttleEvery)
	log.Warn("create refused", "name", "y", queuecore.LogUID, 1000, "err", errors.New("invalid name"))
	if got := out.String(); !strings.Contains(got, keySuppressed+"=995") {
		t.Errorf("next interval: %q, want one line saying 995 were left out", got)
	}
	// Debug lines (the request log of --debug) are not throttled.
	out.Reset()
	dlog := slog.New(newThrottleHandler(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}), func() time.Time { return now }))
	for i := 0; i < 20; i++ {
		dlog.Debug("request", "err", syscall.EIO)
	}
	if n := strings.Count(out.String(), "\n"); n != 20 {
		t.Errorf("debug lines: %d of 20 written", n)
	}
}

// The log file is renamed to FILE.1 at the size limit: at most about
// twice the limit on disk.
func TestRotatingLogFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "yirangmq.log")
	f, err := openLogFile(path, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line := []byte(strings.Repeat("x", 99) + "\n")
	for i := 0; i < 55; i++ {
		if _, err := f.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	cur, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	old, err := os.Stat(path + ".1")
	if err != nil {
		t.Fatal(err)
	}
	if cur.Size() > 1000 || old.Size() > 1000 || cur.Size() != 500 {
		t.Errorf("log %d bytes, log.1 %d bytes; want at most 1000 each, the log 500", cur.Size(), old.Size())
	}
	// A reopened file goes on counting from its size.
	f2, err := openLogFile(path, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	for i := 0; i < 6; i++ {
		f2.Write(line)
	}
	if cur, _ := os.Stat(path); cur.Size() != 100 {
		t.Errorf("after reopening and writing past the limit: log is %d bytes, want 100", cur.Size())
	}
}

func TestParseSizes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"4096", 4096, true}, {"512K", 512 << 10, true}, {"64M", 64 << 20, true}, {"64MiB", 64 << 20, true},
		{"1g", 1 << 30, true}, {"0", 0, true}, {"-1", 0, false}, {"lots", 0, false}, {"", 0, false}, {"1T", 0, false},
	} {
		got, err := parseSize(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseSize(%q) = %d, %v", c.in, got, err)
		}
	}
	for in, want := range map[string]int64{"auto": 0, "off": -1, "0": -1, "8M": 8 << 20} {
		if got, err := parseMinFree(in); err != nil || got != want {
			t.Errorf("parseMinFree(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := parseMinFree("much"); err == nil || !strings.Contains(err.Error(), "--min-free") {
		t.Errorf("parseMinFree(much) = %v", err)
	}
}
