package sqlite

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// envMillion runs TestMillionMessages, which takes a minute or more.
const envMillion = "YIRANGMQ_SQLITE_1M"

// rssKiB reads a field of /proc/self/status (VmRSS, VmHWM) in KiB.
func rssKiB(t testing.TB, field string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("parse %s: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// TestMillionMessages: a queue of 1,000,000 messages keeps the process
// under 64 MiB of RSS while it is filled, listed, counted and searched,
// and a lookup or the first of a List stays fast.
//
//	YIRANGMQ_SQLITE_1M=1 go test -run TestMillionMessages -v -timeout 30m ./backends/sqlite
func TestMillionMessages(t *testing.T) {
	if os.Getenv(envMillion) == "" {
		t.Skipf("set %s=1 to run", envMillion)
	}
	const n, batch = 1_000_000, 2000
	const limitKiB = 64 << 10
	ctx := context.Background()
	s := newTestStore(t, queuecore.SyncNormal, "big")
	body := make([]byte, 256)
	ops := make([]queuecore.Op, 0, batch)
	start := time.Now()
	for i := 1; i <= n; i++ {
		m := benchMessage(uint64(i), queuecore.StateReady)
		m.Queue, m.Size = "big", int64(len(body))
		ops = append(ops, queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: body})
		if len(ops) == batch {
			if err := s.Apply(ctx, ops); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	t.Logf("inserted %d messages in %v; RSS %d KiB", n, time.Since(start).Round(time.Millisecond), rssKiB(t, "VmRSS"))

	start = time.Now()
	seen := 0
	if err := s.List(ctx, "big", queuecore.StateReady, func(queuecore.Message) bool { seen++; return true }); err != nil {
		t.Fatal(err)
	}
	if seen != n {
		t.Errorf("List saw %d messages, want %d", seen, n)
	}
	t.Logf("listed %d in %v; RSS %d KiB", seen, time.Since(start).Round(time.Millisecond), rssKiB(t, "VmRSS"))

	start = time.Now()
	c, err := s.Counts(ctx)
	if err != nil || c["big"][queuecore.StateReady].N != n {
		t.Errorf("Counts = %v, %v", c, err)
	}
	t.Logf("counted in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if id, err := s.MaxID(ctx); err != nil || id != n {
		t.Errorf("MaxID = %d, %v; want %d", id, err, n)
	}
	t.Logf("MaxID in %v", time.Since(start).Round(time.Millisecond))

	for _, c := range []struct {
		name string
		read func(i int) error
	}{
		{"Lookup", func(i int) error {
			_, err := s.Lookup(ctx, "big", fmt.Sprintf("msg-%012d", i*7919%n+1), false)
			return err
		}},
		{"List first", func(int) error {
			return s.List(ctx, "big", queuecore.StateReady, func(queuecore.Message) bool { return false })
		}},
	} {
		const reads = 10000
		start := time.Now()
		for i := range reads {
			if err := c.read(i); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
		per := time.Since(start) / reads
		t.Logf("%s: %v per read", c.name, per)
		if per > time.Millisecond {
			t.Errorf("%s takes %v in a queue of %d: want an index search", c.name, per, n)
		}
	}

	runtime.GC()
	debug.FreeOSMemory()
	peak := rssKiB(t, "VmHWM")
	t.Logf("peak RSS %d KiB (limit %d KiB)", peak, limitKiB)
	if peak > limitKiB {
		t.Errorf("peak RSS %d KiB over %d KiB", peak, limitKiB)
	}
}
