package membound

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"yirangmq/fusefs"
	"yirangmq/testenv"
)

var (
	flagMessages = flag.Int("messages", 20000, "messages published per store")
	flagStores   = flag.String("stores", "sqlite,fs", "stores to run, comma-separated")
	flagLimit    = flag.Int64("limit-mib", 64, "memory limit of the daemon's cgroup, MiB")
	flagSoak     = flag.Duration("soak", 0, "run TestSoakBacklog for this long (0: skip it)")
)

// fsMaxMessages is the fs store's default --fs-max-messages.
const fsMaxMessages = 100_000

const (
	bodySize  = 200
	producers = 4
	mib       = 1 << 20
)

// TestBacklogInMemoryCgroup runs the daemon in a memory cgroup, publishes
// -messages through the mount with no consumer (a backlog), and checks
// that the daemon is still there, that its RSS stayed under the limit and
// that the OOM killer never ran; then it leases and acknowledges every
// message that was accepted, and checks that each one was there exactly
// once. Near its budget the daemon may refuse new messages with ENOSPC;
// the producer then waits and tries again, and stops after 10 s of
// refusals: the messages accepted until then are the backlog. The sqlite
// store must take them all; the fs store, which keeps every message in
// its index, takes them up to its limit (--fs-max-messages, 100,000 by
// default) and refuses the rest with EDQUOT.
func TestBacklogInMemoryCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, mounts)")
	}
	for _, store := range strings.Split(*flagStores, ",") {
		t.Run(store, func(t *testing.T) { runBacklog(t, store, *flagMessages) })
	}
}

func runBacklog(t *testing.T, store string, total int) {
	limit := *flagLimit * mib
	cg, err := NewCgroup(fmt.Sprintf("yirangmq-membound-%d-%s", os.Getpid(), store), limit)
	if err != nil {
		t.Skipf("no memory cgroup: %v", err)
	}
	defer cg.Remove()
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: store, Sync: "normal", Wrap: cg.Wrap()})
	t.Cleanup(func() { _ = d.Stop() }) // before cg.Remove
	pid := d.Pid()
	if err := os.Mkdir(d.Path("q"), 0o755); err != nil {
		t.Fatal(err)
	}
	report := func(label string, n int) {
		rss, hwm := ProcMemory(pid)
		t.Logf("%s %s: %d messages: RSS %.1f MiB (peak %.1f MiB), cgroup peak %.1f MiB",
			store, label, n, float64(rss)/mib, float64(hwm)/mib, float64(cg.Peak())/mib)
	}
	report("publish", 0)
	marks := map[int]bool{total / 10: true, total / 2: true, total: true}
	if total >= 1_000_000 {
		marks = map[int]bool{100_000: true, 500_000: true, total: true}
	}

	// Publish: open/write/close of inbox/mNNNNNNN by producers workers.
	body := []byte(strings.Repeat("x", bodySize-1) + "\n")
	var next, accepted, refused atomic.Int64
	var lastOK atomic.Int64
	lastOK.Store(time.Now().UnixNano())
	var stop atomic.Bool
	var mu sync.Mutex
	published := make([]bool, total)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for w := 0; w < producers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				path := d.Path("q", "inbox", fmt.Sprintf("m%07d", i))
				for {
					err := os.WriteFile(path, body, 0o644)
					if err == nil {
						mu.Lock()
						published[i] = true
						mu.Unlock()
						lastOK.Store(time.Now().UnixNano())
						if n := accepted.Add(1); marks[int(n)] {
							report("publish", int(n))
						}
						break
					}
					if store == "fs" && errors.Is(err, syscall.EDQUOT) {
						stop.Store(true) // the fs store is at its limit: the backlog is full
						return
					}
					if !errors.Is(err, syscall.ENOSPC) {
						firstErr.CompareAndSwap(nil, err)
						stop.Store(true)
						return
					}
					refused.Add(1)
					if time.Since(time.Unix(0, lastOK.Load())) > 10*time.Second {
						stop.Store(true) // the daemon stays at its budget
						return
					}
					time.Sleep(100 * time.Millisecond) // a refused producer's pacing
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		t.Fatalf("publish: %v (after %d messages)\n%s", err, accepted.Load(), d.Log())
	}
	n := int(accepted.Load())
	t.Logf("%s: %d of %d messages accepted in %v (%.0f/s), %d publishes refused with ENOSPC",
		store, n, total, time.Since(start).Round(time.Millisecond), float64(n)/time.Since(start).Seconds(), refused.Load())
	report("backlog", n)
	checkAlive(t, d, cg, limit)
	// The daemon holds a node per message inode the kernel keeps; without
	// the pruner that is every message published (and the OOM killer ended
	// the daemon at about 54,000 of them in 64 MiB).
	inodes := waitMessageInodes(t, d, maxMessageInodes)
	t.Logf("%s: %d message inodes held after the publish (limit %d)", store, inodes, maxMessageInodes)
	want := total
	if store == "fs" {
		want = min(total, fsMaxMessages)
	}
	if n != want {
		t.Errorf("%s: %d of %d messages accepted, want %d: the store's memory does not grow past its budget with its backlog, it should take them all (the fs store up to its limit)", store, n, total, want)
	}
	if got := stat(t, d)["ready"]; got != int64(n) {
		t.Errorf(".stats ready = %d, want %d", got, n)
	}

	// Drain: lease (mv inbox/X processing/) and ack (rm) every accepted message.
	start = time.Now()
	var drained, failed atomic.Int64
	next.Store(0)
	for w := 0; w < producers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				if !published[i] {
					continue
				}
				name := fmt.Sprintf("m%07d", i)
				err := os.Rename(d.Path("q", "inbox", name), d.Path("q", "processing", name))
				if err == nil {
					err = os.Remove(d.Path("q", "processing", name))
				}
				if err != nil {
					if failed.Add(1) <= 5 {
						t.Errorf("drain %s: %v", name, err)
					}
					continue
				}
				if m := drained.Add(1); marks[int(m)] {
					report("drain", int(m))
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%s: %d messages drained in %v", store, drained.Load(), time.Since(start).Round(time.Millisecond))
	report("drained", int(drained.Load()))
	checkAlive(t, d, cg, limit)
	if drained.Load() != int64(n) {
		t.Errorf("drained %d messages, %d were accepted (%d failed)", drained.Load(), n, failed.Load())
	}
	s := stat(t, d)
	if s["ready"] != 0 || s["inflight"] != 0 || s["delayed"] != 0 || s["dlq"] != 0 {
		t.Errorf("after the drain .stats says %v, want an empty queue", s)
	}
}

// checkAlive fails the test if the daemon exited, was OOM-killed or
// reached the cgroup's limit with its RSS.
func checkAlive(t *testing.T, d *testenv.Daemon, cg *Cgroup, limit int64) {
	t.Helper()
	if err := syscall.Kill(d.Pid(), 0); err != nil {
		t.Fatalf("daemon gone: %v\n%s", err, d.Log())
	}
	if k := cg.OOMKills(); k != 0 {
		t.Fatalf("the OOM killer ran %d times in the daemon's cgroup\n%s", k, d.Log())
	}
	if _, hwm := ProcMemory(d.Pid()); hwm == 0 || hwm >= limit {
		t.Fatalf("daemon peak RSS %d bytes, limit %d", hwm, limit)
	}
	if _, err := os.ReadDir(d.Path("q")); err != nil {
		t.Fatalf("mount unusable: %v", err)
	}
}

// maxMessageInodes is the daemon's default --max-message-inodes.
const maxMessageInodes = fusefs.DefaultMaxMessageInodes

// waitMessageInodes waits up to 15 s for the daemon to hold at most limit
// message inodes (MOUNT/.metrics), and returns how many it holds.
func waitMessageInodes(t *testing.T, d *testenv.Daemon, limit int64) int64 {
	t.Helper()
	var got int64
	if !testenv.RetryUntil(15*time.Second, func() bool {
		b, err := os.ReadFile(d.Path(".metrics"))
		if err != nil {
			t.Fatal(err)
		}
		got = -1
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "yirangmq_message_inodes "); ok {
				got, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if got < 0 {
			t.Fatal("no yirangmq_message_inodes in .metrics")
		}
		return got <= limit
	}) {
		t.Fatalf("the daemon holds %d message inodes 15 s after the publish, limit %d", got, limit)
	}
	return got
}

func stat(t *testing.T, d *testenv.Daemon) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(d.Path("q", ".stats"))
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf(".stats: %v: %s", err, b)
	}
	out := map[string]int64{}
	for k, v := range raw {
		if f, ok := v.(float64); ok {
			out[k] = int64(f)
		}
	}
	return out
}

// TestSoakBacklog runs 2 producers and 2 consumers for -soak against the
// daemon in a memory cgroup; consumers take two of every three messages,
// so the backlog grows all along. It reports the daemon's RSS at the
// start and the end and checks that it is alive, under the limit, and
// that every message was seen once.
func TestSoakBacklog(t *testing.T) {
	if *flagSoak <= 0 {
		t.Skip("run with -soak DURATION (make mem-soak)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, mounts)")
	}
	store := strings.Split(*flagStores, ",")[0]
	limit := *flagLimit * mib
	cg, err := NewCgroup(fmt.Sprintf("yirangmq-soak-%d", os.Getpid()), limit)
	if err != nil {
		t.Skipf("no memory cgroup: %v", err)
	}
	defer cg.Remove()
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: store, Sync: "normal", Wrap: cg.Wrap()})
	t.Cleanup(func() { _ = d.Stop() })
	if err := os.Mkdir(d.Path("q"), 0o755); err != nil {
		t.Fatal(err)
	}
	body := []byte(strings.Repeat("y", bodySize-1) + "\n")
	names := make(chan string, 1<<16)
	var seq, published, acked, errs atomic.Int64
	deadline := time.Now().Add(*flagSoak)
	rss0, _ := ProcMemory(d.Pid())
	t.Logf("soak %s: start RSS %.1f MiB", store, float64(rss0)/mib)
	var pw, cw sync.WaitGroup
	for p := 0; p < 2; p++ {
		pw.Add(1)
		go func() {
			defer pw.Done()
			for time.Now().Before(deadline) {
				i := seq.Add(1)
				name := fmt.Sprintf("s%09d", i)
				if err := os.WriteFile(d.Path("q", "inbox", name), body, 0o644); err != nil {
					if errs.Add(1) <= 5 {
						t.Errorf("publish %s: %v", name, err)
					}
					continue
				}
				published.Add(1)
				if i%3 != 0 {
					select {
					case names <- name:
					default: // consumers far behind: the message joins the backlog
					}
				}
			}
		}()
	}
	for c := 0; c < 2; c++ {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for name := range names {
				err := os.Rename(d.Path("q", "inbox", name), d.Path("q", "processing", name))
				if err == nil {
					err = os.Remove(d.Path("q", "processing", name))
				}
				if err != nil {
					if errs.Add(1) <= 5 {
						t.Errorf("consume %s: %v", name, err)
					}
					continue
				}
				acked.Add(1)
			}
		}()
	}
	tick := time.NewTicker(time.Minute)
	go func() {
		for range tick.C {
			rss, _ := ProcMemory(d.Pid())
			t.Logf("soak %s: RSS %.1f MiB, %d published, %d acked", store, float64(rss)/mib, published.Load(), acked.Load())
		}
	}()
	pw.Wait()
	close(names)
	cw.Wait()
	tick.Stop()
	rss1, hwm := ProcMemory(d.Pid())
	backlog := published.Load() - acked.Load()
	t.Logf("soak %s: %v, %d published, %d acked, backlog %d: RSS start %.1f MiB, end %.1f MiB, peak %.1f MiB",
		store, *flagSoak, published.Load(), acked.Load(), backlog, float64(rss0)/mib, float64(rss1)/mib, float64(hwm)/mib)
	checkAlive(t, d, cg, limit)
	if got := stat(t, d)["ready"]; got != backlog {
		t.Errorf(".stats ready = %d, want the backlog %d", got, backlog)
	}
	if n, _ := filepath.Glob(d.Path("q", "processing", "*")); len(n) != 0 {
		t.Errorf("%d messages left in processing/", len(n))
	}
}
