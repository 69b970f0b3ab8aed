package membound

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"yirangmq/testenv"
)

// The memory budget follows a cgroup limit set or lowered while the
// daemon runs (systemctl set-property MemoryMax=): issue 40 saw a daemon
// started without a limit and limited to 64 MiB later keep no budget and
// 1 MiB request buffers, until the OOM killer ended it. Here the limit
// comes, then is lowered under what the daemon will hold: the budget
// follows each step (three quarters of the limit, on the next message),
// the request buffers are trimmed under a small budget, and drafts held
// open are refused with ENOSPC before the OOM killer has anything to do.
// Lifted again, the budget goes.
func TestBudgetFollowsTheCgroupLimit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, mounts)")
	}
	cg, err := NewCgroup(fmt.Sprintf("yirangmq-follow-%d", os.Getpid()), 0)
	if err != nil {
		t.Skipf("no memory cgroup: %v", err)
	}
	defer cg.Remove()
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Sync: "normal", Wrap: cg.Wrap()})
	t.Cleanup(func() { _ = d.Stop() }) // before cg.Remove
	if b := d.Metric(t, "yirangmq_memory_budget_bytes"); b != 0 {
		t.Fatalf("budget %d without a cgroup limit, want none", b)
	}
	q := d.Path("q")
	if err := os.Mkdir(q, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(q, ".policy"), []byte(`{"maxMessageBytes": 4194304}`), 0o644); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i)
	}
	n := 0
	publish := func() error {
		n++
		return os.WriteFile(filepath.Join(q, "inbox", fmt.Sprint("m", n)), big, 0o644)
	}
	if err := publish(); err != nil {
		t.Fatal(err)
	}
	// The budget is asked again at most once a second, at a new message.
	follow := func(limit int64) {
		t.Helper()
		if err := cg.SetLimit(limit); err != nil {
			t.Fatalf("set the cgroup's limit to %d: %v", limit, err)
		}
		want := limit / 4 * 3
		testenv.MustRetryUntil(t, 15*time.Second, fmt.Sprintf("a budget of %d MiB", want>>20), func() bool {
			if err := publish(); err != nil && !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("publish: %v", err)
			}
			return d.Metric(t, "yirangmq_memory_budget_bytes") == want
		})
	}

	follow(96 << 20)
	if d.Metric(t, "yirangmq_write_buffers_trimmed") != 1 {
		t.Errorf("a 72 MiB budget on a mount with 1 MiB requests: request buffers not trimmed")
	}
	if !strings.Contains(d.Log(), "memory budget changed with the cgroup's memory limit") {
		t.Errorf("no log line about the new budget:\n%s", d.Log())
	}

	// Lowered to what the daemon holds now plus 24 MiB: drafts of 4 MiB
	// held open reach the budget's 90% (a quarter of the limit below it).
	rss, _ := ProcMemory(d.Pid())
	limit := max(40<<20, (rss+24<<20+(1<<20-1))&^(1<<20-1))
	follow(limit)
	block := make([]byte, 4<<20)
	for i := range block {
		block[i] = byte(i * 7)
	}
	var refused error
	for i := 0; i < 15 && refused == nil; i++ {
		f, err := os.Create(filepath.Join(q, "inbox", fmt.Sprint("draft", i)))
		if err != nil {
			refused = err
			break
		}
		t.Cleanup(func() { f.Close() })
		if _, err := f.Write(block); err != nil {
			t.Fatalf("draft %d: %v", i, err)
		}
		time.Sleep(600 * time.Millisecond) // the watcher looks every 500 ms
	}
	rss, hwm := ProcMemory(d.Pid())
	t.Logf("cgroup limit %d MiB, budget %d MiB: refused with %v at RSS %.1f MiB (peak %.1f MiB)", limit>>20, limit/4*3>>20, refused, float64(rss)/mib, float64(hwm)/mib)
	if !errors.Is(refused, syscall.ENOSPC) {
		t.Fatalf("creates with drafts past the lowered budget: %v, want ENOSPC", refused)
	}
	if k := cg.OOMKills(); k != 0 {
		t.Fatalf("the OOM killer ran %d times in the daemon's cgroup", k)
	}
	if d.Metric(t, "yirangmq_memory_full") != 1 {
		t.Errorf("yirangmq_memory_full is not 1 at the refusal")
	}

	// The limit lifted: no budget, nothing refused for memory.
	if err := cg.SetLimit(0); err != nil {
		t.Fatal(err)
	}
	testenv.MustRetryUntil(t, 15*time.Second, "no budget once the limit is lifted", func() bool {
		_ = publish()
		return d.Metric(t, "yirangmq_memory_budget_bytes") == 0
	})
	if err := publish(); err != nil {
		t.Errorf("publish with no budget: %v", err)
	}
}
