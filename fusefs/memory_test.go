package fusefs_test

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"yirangmq/testenv"
)

// The kernel keeps an inode for every message it has seen; past
// --max-message-inodes the daemon asks it to forget the least recently
// used ones, and everything still works through the names.
func TestPrunerBoundsMessageInodes(t *testing.T) {
	const n, limit = 1500, 64
	eachBackend(t, testenv.DaemonOptions{Sync: "normal", Args: []string{"--max-message-inodes", strconv.Itoa(limit)}}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		// Publish with the shell, then read every message back (a LOOKUP
		// and an open of each, after the publish's inodes were pruned).
		got := testenv.MustSh(t, q, `i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do i=$((i+1)); echo "body $i" > inbox/m$i; done; cat inbox/* | wc -l`)
		if strings.TrimSpace(got) != strconv.Itoa(n) {
			t.Fatalf("cat inbox/* | wc -l = %q, want %d", got, n)
		}
		waitInodes(t, d, limit)
		if p := d.Metric(t, "yirangmq_pruned_inodes_total"); p < n-limit {
			t.Errorf("pruned %d inodes, want at least %d", p, n-limit)
		}
		// Every message once more: stat, lease, read, ack.
		testenv.MustSh(t, q, `for f in inbox/*; do test -s "$f" && mv "$f" processing/ || exit 1; done; cat processing/* | wc -l > /dev/null && rm processing/*`)
		if r := stat(t, q, "ready"); r != 0 {
			t.Errorf("ready = %v after the drain, want 0", r)
		}
		if a := stat(t, q, "archived"); int(a) != n {
			t.Errorf("archived = %v, want %d", a, n)
		}
		waitInodes(t, d, limit)
	})
}

// Past the limit the messages published last are forgotten first: a
// queue is consumed oldest first, so the leases of the oldest messages of
// a backlog find the names the kernel kept from their CREATE and cost no
// LOOKUP of their source (memory.go, trackNew). Forgetting the oldest
// first, as plain LRU order does, cost every lease of such a backlog a
// LOOKUP. Counted in the daemon's request log.
func TestPrunerForgetsNewestPublishesFirst(t *testing.T) {
	// The pruner keeps the oldest three quarters of the limit (48) and,
	// after its last run, whatever came since: m101..m110 are forgotten,
	// all but one the kernel still held open when its pass came (the
	// shell's close and the RELEASE race it), which it keeps.
	const n, limit, oldest, later, laterN = 200, 64, 40, 101, 10
	eachBackend(t, testenv.DaemonOptions{Sync: "normal", Args: []string{
		"--max-message-inodes", strconv.Itoa(limit),
		"--cache-timeout", "60s", // only the pruner may make the kernel forget a name
		"--debug",
	}}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		testenv.MustSh(t, q, `i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do i=$((i+1)); echo "body $i" > inbox/m$i; done`)
		waitInodes(t, d, limit)
		logCaughtUp(t, d, q, "published")
		mark := len(d.Log())
		testenv.MustSh(t, q, `i=0; while [ $i -lt `+strconv.Itoa(oldest)+` ]; do i=$((i+1)); mv inbox/m$i processing/; done
			i=`+strconv.Itoa(later)+`; while [ $i -lt `+strconv.Itoa(later+laterN)+` ]; do mv inbox/m$i processing/; i=$((i+1)); done`)
		logCaughtUp(t, d, q, "leased")
		lookups := map[string]int{}
		re := regexp.MustCompile(`rx \d+: LOOKUP n\d+ +"(m\d+)"`)
		for _, m := range re.FindAllStringSubmatch(d.Log()[mark:], -1) {
			lookups[m[1]]++
		}
		// A lease looks its target up (always: a rename target is never
		// taken from the cache), and its source only if it was forgotten.
		for i := 1; i <= oldest; i++ {
			if got := lookups["m"+strconv.Itoa(i)]; got != 1 {
				t.Errorf("mv inbox/m%d processing/: %d LOOKUPs of m%d, want 1 (the target's)", i, got, i)
			}
		}
		forgot := 0
		for i := later; i < later+laterN; i++ {
			switch got := lookups["m"+strconv.Itoa(i)]; got {
			case 2:
				forgot++
			case 1:
			default:
				t.Errorf("mv inbox/m%d processing/: %d LOOKUPs, want 1 or 2", i, got)
			}
		}
		// In least recently used order (the oldest forgotten first) none
		// of them would be.
		if forgot < laterN-2 {
			t.Errorf("mv of m%d..m%d (published later): %d of %d looked their source up, want at least %d (forgotten first)", later, later+laterN-1, forgot, laterN, laterN-2)
		}
		if r := stat(t, q, "inflight"); int(r) != oldest+laterN {
			t.Errorf("inflight = %v, want %d", r, oldest+laterN)
		}
	})
}

// Without a limit the kernel keeps them all, and the daemon a node for
// each: what the pruner is for (and a check that the gauge counts).
func TestNoPrunerKeepsMessageInodes(t *testing.T) {
	const n = 800
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Sync: "normal", Args: []string{"--max-message-inodes", "0"}})
	q := mkq(t, d, "q", "")
	testenv.MustSh(t, q, `i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do i=$((i+1)); echo "body $i" > inbox/m$i; done; cat inbox/* > /dev/null`)
	time.Sleep(1500 * time.Millisecond) // a pruner would have run by now
	if got := d.Metric(t, "yirangmq_message_inodes"); got < n {
		t.Errorf("yirangmq_message_inodes = %d with no limit, want at least %d", got, n)
	}
}

// logCaughtUp makes one more request in queue dir q, a LOOKUP of a name
// no one uses (tag-mark), and waits until the daemon's request log (--debug)
// has it. The log reaches the test through a pipe, some time after the
// requests; a request is logged when it is received, so once this LOOKUP
// is in the log, so is every request that the calls before it made.
func logCaughtUp(t *testing.T, d *testenv.Daemon, q, tag string) {
	t.Helper()
	name := tag + "-mark"
	if _, err := os.Lstat(filepath.Join(q, "inbox", name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lstat inbox/%s: %v, want ENOENT", name, err)
	}
	testenv.MustRetryUntil(t, 5*time.Second, "the LOOKUP of inbox/"+name+" in the request log", func() bool {
		return strings.Contains(d.Log(), `"`+name+`"`)
	})
}

func waitInodes(t *testing.T, d *testenv.Daemon, limit int64) {
	t.Helper()
	var got int64
	if !testenv.RetryUntil(15*time.Second, func() bool {
		got = d.Metric(t, "yirangmq_message_inodes")
		return got <= limit
	}) {
		t.Fatalf("yirangmq_message_inodes = %d after 15 s, limit %d", got, limit)
	}
}

// At its memory budget the daemon refuses new messages with ENOSPC (one
// log line), leaves nothing of them behind, and keeps serving the rest.
func TestMemoryBudgetRefusesNewMessages(t *testing.T) {
	// 16 MiB: less than the daemon needs to start, so it is over at once.
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Args: []string{"--memory-budget", "16MiB"}})
	q := mkq(t, d, "q", "")
	// The watcher looks twice a second: publish until it has seen.
	var err error
	i := 0
	testenv.RetryUntil(10*time.Second, func() bool {
		err = os.WriteFile(filepath.Join(q, "inbox", "m"+strconv.Itoa(i)), []byte("x\n"), 0o644)
		i++
		return err != nil
	})
	if !isErrno(err, syscall.ENOSPC) {
		t.Fatalf("publish at the budget: %v, want ENOSPC", err)
	}
	ready := stat(t, q, "ready")
	for i := 0; i < 3; i++ {
		err := os.WriteFile(filepath.Join(q, "inbox", "late"+strconv.Itoa(i)), []byte("x\n"), 0o644)
		if !isErrno(err, syscall.ENOSPC) {
			t.Errorf("publish %d at the budget: %v, want ENOSPC", i, err)
		}
	}
	if _, err := os.Stat(filepath.Join(q, "inbox", "late0")); !os.IsNotExist(err) {
		t.Errorf("a refused message is visible: stat: %v", err)
	}
	if got := stat(t, q, "ready"); got != ready {
		t.Errorf("ready went from %v to %v with every publish refused", ready, got)
	}
	if d.Metric(t, "yirangmq_memory_full") != 1 {
		t.Error("yirangmq_memory_full is not 1")
	}
	// Reading and consuming still work.
	names := ls(t, filepath.Join(q, "inbox"))
	for _, name := range names {
		if err := os.Rename(filepath.Join(q, "inbox", name), filepath.Join(q, "processing", name)); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(q, "processing", name)); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(d.Log(), "new messages are refused with ENOSPC"); n != 1 {
		t.Errorf("%d log lines about the refusal, want 1:\n%s", n, d.Log())
	}
}

// An idle daemon with a budget does not look at its memory twice a
// second: the watcher parks once calm and steady. A new message wakes it:
// drafts held open then fill the budget, and a create is refused.
func TestMemoryWatcherParksAndWakes(t *testing.T) {
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Args: []string{"--memory-budget", "48MiB"}})
	q := mkq(t, d, "q", `{"maxMessageBytes": 4194304}`)
	if !testenv.RetryUntil(15*time.Second, func() bool { return d.Metric(t, "yirangmq_memory_watch_parked") == 1 }) {
		t.Fatalf("the memory watcher of an idle daemon did not park in 15 s (RSS %d of a 48 MiB budget)", d.Metric(t, "yirangmq_rss_bytes"))
	}
	// Drafts of 4 MiB, held open, until a create is refused: at most 15
	// (60 MiB, under the per-uid draft limit of 64 MiB).
	block := make([]byte, 4<<20)
	for i := range block {
		block[i] = byte(i)
	}
	var refused error
	for i := 0; i < 15 && refused == nil; i++ {
		f, err := os.Create(filepath.Join(q, "inbox", "draft"+strconv.Itoa(i)))
		if err != nil {
			refused = err
			break
		}
		t.Cleanup(func() { f.Close() })
		if _, err := f.Write(block); err != nil {
			t.Fatalf("draft %d: %v", i, err)
		}
		time.Sleep(600 * time.Millisecond) // the woken watcher looks every 500 ms
	}
	if !isErrno(refused, syscall.ENOSPC) {
		t.Fatalf("creates with drafts past the budget: %v, want ENOSPC (RSS %d, parked %d)",
			refused, d.Metric(t, "yirangmq_rss_bytes"), d.Metric(t, "yirangmq_memory_watch_parked"))
	}
	if d.Metric(t, "yirangmq_memory_watch_parked") != 0 {
		t.Error("the memory watcher is parked while the daemon is at its budget")
	}
}

// A parked memory watcher wakes when a file being written grows, not only
// at a create: one draft written to past the budget sets the full level.
func TestMemoryWatcherWakesOnDraftGrowth(t *testing.T) {
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Args: []string{"--memory-budget", "48MiB"}})
	q := mkq(t, d, "q", `{"maxMessageBytes": 62914560}`)
	f, err := os.Create(filepath.Join(q, "inbox", "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !testenv.RetryUntil(15*time.Second, func() bool { return d.Metric(t, "yirangmq_memory_watch_parked") == 1 }) {
		t.Fatalf("the memory watcher of an idle daemon did not park in 15 s (RSS %d of a 48 MiB budget)", d.Metric(t, "yirangmq_rss_bytes"))
	}
	block := make([]byte, 4<<20)
	for i := range block {
		block[i] = byte(i)
	}
	full := false
	for i := 0; i < 14 && !full; i++ { // 56 MiB at most: under the 60 MiB message and the 64 MiB per uid
		if _, err := f.Write(block); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		full = testenv.RetryUntil(600*time.Millisecond, func() bool { return d.Metric(t, "yirangmq_memory_full") == 1 })
	}
	if !full {
		t.Fatalf("a draft grew past the budget and the daemon is not at its full level (RSS %d, parked %d)",
			d.Metric(t, "yirangmq_rss_bytes"), d.Metric(t, "yirangmq_memory_watch_parked"))
	}
}

func isErrno(err error, want syscall.Errno) bool {
	var e syscall.Errno
	for err != nil {
		if x, ok := err.(syscall.Errno); ok {
			e = x
			break
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			break
		}
		err = u.Unwrap()
	}
	return e == want
}

// A small memory budget makes the request buffers small too: max_read
// (which the kernel shows; max_write is the same) is 128 KiB under a
// budget of less than 128 MiB, 1 MiB without one.
func TestMaxWriteFollowsBudget(t *testing.T) {
	for _, c := range []struct {
		budget string
		want   string
	}{{"48MiB", "max_read=131072"}, {"off", "max_read=1048576"}} {
		d := testenv.StartDaemon(t, testenv.DaemonOptions{Args: []string{"--memory-budget", c.budget}})
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		var line string
		for l := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && f[4] == d.Mountpoint {
				line = l
			}
		}
		if !strings.Contains(line, c.want) {
			t.Errorf("--memory-budget %s: mount %q, want %s", c.budget, line, c.want)
		}
		// A message bigger than one WRITE still arrives whole.
		q := mkq(t, d, "q", `{"maxMessageBytes": 1048576}`)
		body := strings.Repeat("0123456789abcdef", 40000) // 640,000 bytes
		if err := os.WriteFile(filepath.Join(q, "inbox", "big"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(q, "inbox", "big")); err != nil || string(got) != body {
			t.Errorf("--memory-budget %s: read back %d bytes (%v), want %d", c.budget, len(got), err, len(body))
		}
	}
}

// TestReadsSendNoFlush: a read-only open asks the kernel for no FLUSH at
// its close (FOPEN_NOFLUSH): a consumer's `cat .next` and `cat
// processing/X`, and reads of .stats and .policy, cost one request less.
// A publish still gets its FLUSH, where it commits.
func TestReadsSendNoFlush(t *testing.T) {
	if !kernelAtLeast(5, 16) {
		t.Skip("FOPEN_NOFLUSH needs Linux 5.16 or later; older kernels ignore it and send the FLUSH")
	}
	eachBackend(t, testenv.DaemonOptions{Sync: "normal", Args: []string{"--debug"}}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		testenv.MustSh(t, q, `echo body > inbox/A && echo big > inbox/B`)
		flushes := regexp.MustCompile(`rx \d+: FLUSH `)
		logCaughtUp(t, d, q, "published") // else the publishes' FLUSHes may come after the mark
		mark := len(d.Log())
		out := testenv.MustSh(t, q, `m=$(cat .next) && cat "$m" && cat inbox/B .stats .policy > /dev/null && rm "$m"`)
		wantOut(t, "cat of the leased message", out, "body")
		// The rm came after every close: once its request is in the log,
		// so is any FLUSH of theirs.
		testenv.MustRetryUntil(t, 5*time.Second, "the UNLINK of the ack in the request log", func() bool {
			return regexp.MustCompile(`rx \d+: UNLINK `).MatchString(d.Log()[mark:])
		})
		if got := flushes.FindAllString(d.Log()[mark:], -1); len(got) != 0 {
			t.Errorf("read-only opens and closes made %d FLUSH requests, want 0", len(got))
		}
		mark = len(d.Log())
		testenv.MustSh(t, q, `echo again > inbox/C`)
		testenv.MustRetryUntil(t, 5*time.Second, "the FLUSH of a publish in the request log", func() bool {
			return flushes.MatchString(d.Log()[mark:])
		})
		wantOut(t, "the published message", testenv.MustSh(t, q, `cat inbox/C`), "again")
	})
}
