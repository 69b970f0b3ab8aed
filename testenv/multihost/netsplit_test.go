package multihost

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"yirangmq/testenv"
	"yirangmq/testenv/pgtest"
)

// EnvRequireNetns=1 turns "cannot make a network namespace here" (no ip or
// nsenter, not root) from a skip into a failure.
const EnvRequireNetns = "YIRANGMQ_REQUIRE_NETNS"

// Bounds of the network split test, from backends/postgres: a call gives
// up after 10 s (connecting after 5 s), so an operation fails within
// splitEIO; the server ends the duty session of a holder cut off after
// 10 s without a query (idle_session_timeout), and another daemon takes
// the lock within a second after, so within splitTakeover of the split.
const (
	splitEIO      = 15 * time.Second
	splitTakeover = 15 * time.Second
	splitRecover  = 30 * time.Second
)

// skipNetns skips t because it cannot make a network namespace, or fails
// it when EnvRequireNetns=1.
func skipNetns(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(EnvRequireNetns) == "1" {
		t.Fatalf("%s (and %s=1)", msg, EnvRequireNetns)
	}
	t.Skipf("%s; this test needs root, ip (iproute2) and nsenter (util-linux); set %s=1 to fail instead", msg, EnvRequireNetns)
}

// netns is a network namespace joined to this one by a veth pair: a
// daemon run in it (wrap) reaches the host at hostIP only, as another
// host on a link would, and down cuts that link.
type netns struct {
	name         string // ip netns name; its file is /var/run/netns/NAME
	hostIf, nsIf string // the two ends of the veth pair
	hostIP, nsIP string
	cidr         string // the /30 of both
	hostSide     bool   // down cuts the host's end, not the namespace's
}

// newNetns makes namespace number i of this process and its link, up, or
// skips t when it cannot (fails it when EnvRequireNetns=1). All of it goes
// when t ends.
func newNetns(t *testing.T, i int, hostSide bool) *netns {
	t.Helper()
	skip := func(format string, args ...any) {
		t.Helper()
		skipNetns(t, format, args...)
	}
	cleanLeftoverNetns()
	pid := os.Getpid()
	// A /30 of 10.213.0.0/16 per process id and i < 2: runs at once do
	// not meet.
	x, y := (pid>>5)&255, (pid&31)*8+(i&1)*4
	n := &netns{
		name:     fmt.Sprintf("yq-split-%d-%d", pid, i),
		hostIf:   fmt.Sprintf("yqs%dh%d", pid, i),
		nsIf:     fmt.Sprintf("yqs%dn%d", pid, i),
		hostIP:   fmt.Sprintf("10.213.%d.%d", x, y+1),
		nsIP:     fmt.Sprintf("10.213.%d.%d", x, y+2),
		cidr:     fmt.Sprintf("10.213.%d.%d/30", x, y),
		hostSide: hostSide,
	}
	if out, _ := exec.Command("ip", "-4", "-o", "addr", "show", "to", n.cidr).CombinedOutput(); len(strings.TrimSpace(string(out))) > 0 {
		skip("%s is in use on this host: %s", n.cidr, out)
	}
	if err := n.ip("netns", "add", n.name); err != nil {
		skip("cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() {
		// Deleting the host end deletes the pair; the namespace goes when
		// its last process (daemon B) has.
		_ = n.ip("link", "del", n.hostIf)
		if err := n.ip("netns", "del", n.name); err != nil {
			t.Errorf("remove the network namespace: %v", err)
		}
	})
	for _, args := range [][]string{
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", n.nsIf},
		{"link", "set", n.nsIf, "netns", n.name},
		{"addr", "add", n.hostIP + "/30", "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
		{"-n", n.name, "addr", "add", n.nsIP + "/30", "dev", n.nsIf},
		{"-n", n.name, "link", "set", n.nsIf, "up"},
		{"-n", n.name, "link", "set", "lo", "up"},
	} {
		if err := n.ip(args...); err != nil {
			skip("cannot set up the veth pair: %v", err)
		}
	}
	return n
}

func (n *netns) ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// wrap is the command prefix that runs a daemon in the namespace's network
// (only: it shares this process's mounts, so its FUSE mount is ours too).
func (n *netns) wrap() []string {
	return []string{"nsenter", "--net=/var/run/netns/" + n.name, "--"}
}

// down cuts the link. On the namespace's side, the daemon in it sees its
// link go down: it loses its route to the host, so that a new connection
// fails at once, while what the host sends it is lost without a word (the
// host's end has no carrier). On the host's side, it is the other way
// round: what the daemon sends is lost without a word, a new connection
// fails only when the host's address no longer answers ARP.
func (n *netns) down() error { return n.setLink("down") }
func (n *netns) up() error   { return n.setLink("up") }

func (n *netns) setLink(state string) error {
	if n.hostSide {
		return n.ip("link", "set", n.hostIf, state)
	}
	return n.ip("-n", n.name, "link", "set", n.nsIf, state)
}

// cleanLeftoverNetns deletes the namespaces of test processes that died
// (killed before their cleanup ran). Those of live processes stay.
func cleanLeftoverNetns() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "yq-split-") {
			continue
		}
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(f[0], "yq-split-"), "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); errors.Is(err, os.ErrNotExist) {
			_ = exec.Command("ip", "netns", "del", f[0]).Run()
		}
	}
}

// ledger keeps what the test published and consumed, for the final count:
// every message whose publish (close(2)) returned 0 must be found exactly
// once, consumed or left in the queue.
type ledger struct {
	mu        sync.Mutex
	committed map[string]string // name -> the daemon it was published on
	uncertain map[string]error  // publish failed: committed or not, at most once
	consumed  map[string][]string
}

func newLedger() *ledger {
	return &ledger{committed: map[string]string{}, uncertain: map[string]error{}, consumed: map[string][]string{}}
}

// publish publishes name on d (called who) and records the outcome.
func (l *ledger) publish(d *testenv.Daemon, who, queue, name string) error {
	err := os.WriteFile(d.Path(queue, "inbox", name), []byte("body of "+name), 0o644)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		l.committed[name] = who
	} else {
		l.uncertain[name] = err
	}
	return err
}

// consume leases the next message of queue on d and acks it; name is ""
// when the queue has none ready.
func (l *ledger) consume(d *testenv.Daemon, who, queue string) (string, error) {
	name, err := next(d, queue, true)
	if err != nil || name == "" {
		return "", err
	}
	body, err := os.ReadFile(d.Path(queue, "processing", name))
	if err != nil {
		return name, fmt.Errorf("read leased %s: %w", name, err)
	}
	if want := "body of " + name; string(body) != want {
		return name, fmt.Errorf("%s: body %q, want %q", name, body, want)
	}
	if err := os.Remove(d.Path(queue, "processing", name)); err != nil {
		return name, fmt.Errorf("ack %s: %w", name, err)
	}
	l.mu.Lock()
	l.consumed[name] = append(l.consumed[name], who)
	l.mu.Unlock()
	return name, nil
}

// timed is an operation's outcome.
type timed struct {
	what string
	err  error
	took time.Duration
}

func timeOp(what string, f func() error) timed {
	start := time.Now()
	err := f()
	return timed{what, err, time.Since(start)}
}

// logTime is the time of the first line of log (text format) after offset
// off whose message is msg, and whether there is one.
func logTime(log string, off int, msg string) (time.Time, bool) {
	sc := bufio.NewScanner(strings.NewReader(log[off:]))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="`+msg+`"`) && !strings.Contains(line, "msg="+msg+" ") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		if at, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			return at, true
		}
	}
	return time.Time{}, false
}

// problemLines are the WARN and ERROR lines of log after offset off.
func problemLines(log string, off int) []string {
	var lines []string
	for _, line := range strings.Split(log[off:], "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			lines = append(lines, line)
		}
	}
	return lines
}

// clientsFrom counts the sessions of the server that come from addr.
func clientsFrom(t *testing.T, url, addr string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE client_addr = $1::inet", addr).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkWrapped checks that the process of d, started through nsenter, is
// the daemon itself (so that Stop and Kill reach it) and runs in another
// network namespace.
func checkWrapped(t *testing.T, d *testenv.Daemon) {
	t.Helper()
	exe, err1 := os.Stat(fmt.Sprintf("/proc/%d/exe", d.Pid()))
	bin, err2 := os.Stat(testenv.Binary(t))
	if err1 != nil || err2 != nil || !os.SameFile(exe, bin) {
		t.Fatalf("process %d is not the daemon (%v, %v): nsenter did not exec it", d.Pid(), err1, err2)
	}
	theirs, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", d.Pid()))
	ours, err2 := os.Readlink("/proc/self/ns/net")
	if err1 != nil || err2 != nil || theirs == ours {
		t.Fatalf("the daemon's network namespace %q (%v) is ours %q (%v)", theirs, err1, ours, err2)
	}
}

// TestNetworkSplit: daemon B reaches the database over a link, as from
// another host, and holds the duty; the link goes down. While split, B's
// operations fail with EIO within a bounded time (no hang) and B says so
// in its log, while A keeps publishing and consuming, takes the duty over
// once the server has let B's session go, and expires leases. When the
// link is back, B works again by itself, only A holds the duty, and every
// message whose publish returned 0, on either side, is found exactly once.
//
// The link is cut at either end (subtests): at B's, B's new connections
// fail at once and its open ones wait for an answer that never comes; at
// the host's, everything B sends is lost without a word.
func TestNetworkSplit(t *testing.T) {
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipNetns(t, "no %s in PATH", tool)
		}
	}
	if os.Geteuid() != 0 {
		skipNetns(t, "not root")
	}
	for i, side := range []string{"B-side", "host-side"} {
		if !t.Run(side, func(t *testing.T) { testNetworkSplit(t, i, side == "host-side") }) {
			return
		}
	}
}

func testNetworkSplit(t *testing.T, nsIndex int, hostSide bool) {
	began := time.Now()
	ns := newNetns(t, nsIndex, hostSide)
	pg := pgtest.StartWith(t, pgtest.Options{ListenAddresses: []string{ns.hostIP}, TrustNets: []string{ns.cidr}})
	urlA := pg.CreateDB(t, "mh")
	urlB := pg.TCPURLAt(ns.hostIP, "mh")

	// B first, so that it holds the duty when the link goes down.
	b := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "postgres", Store: urlB, Sync: "full", Wrap: ns.wrap()})
	checkWrapped(t, b)
	dutyHolder(t, 10*time.Second, b)
	a := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "postgres", Store: urlA, Sync: "full"})
	// Cleanups run last first: the link is up again before the daemons
	// stop, whatever failed, so that B unmounts cleanly.
	t.Cleanup(func() { _ = ns.up() })
	if h := dutyHolder(t, 10*time.Second, a, b); h != b {
		t.Fatal("A holds the duty, though B started first")
	}
	if n := clientsFrom(t, urlA, ns.nsIP); n == 0 {
		t.Fatalf("no session of the server comes from %s: daemon B does not go through the link", ns.nsIP)
	}

	const leasePolicy = `{"visibilityTimeoutSec": 1, "retry": {"limit": 5, "backoff": "fixed", "initialDelaySec": 0, "maxDelaySec": 0}}`
	mkqueue(t, a, b, "jobs", "")
	mkqueue(t, a, b, "lease", leasePolicy)
	l := newLedger()
	for i := range 20 {
		for _, d := range []struct {
			d   *testenv.Daemon
			who string
		}{{a, "A"}, {b, "B"}} {
			if err := l.publish(d.d, d.who, "jobs", fmt.Sprintf("pre-%s-%02d", d.who, i)); err != nil {
				t.Fatalf("publish on %s before the split: %v", d.who, err)
			}
		}
	}
	for range 5 {
		if name, err := l.consume(b, "B", "jobs"); err != nil || name == "" {
			t.Fatalf("consume on B before the split: %q, %v", name, err)
		}
	}
	t.Logf("setup: B holds the duty, 40 messages published on A and B, 5 consumed on B (%v)", time.Since(began).Round(time.Millisecond))

	// The split.
	offA, offB := len(a.Log()), len(b.Log())
	if err := ns.down(); err != nil {
		t.Fatal(err)
	}
	split := time.Now()

	// B: a publish after another until told to stop, an ls and a
	// consume, all at once. A: the same, until told to stop. When the test
	// ends early, they stop before the daemons do.
	var bWG, aWG sync.WaitGroup
	var bMu sync.Mutex
	var bOps []timed
	stopB, stopA := make(chan struct{}), make(chan struct{})
	closeB, closeA := sync.OnceFunc(func() { close(stopB) }), sync.OnceFunc(func() { close(stopA) })
	t.Cleanup(func() {
		closeB()
		closeA()
		bWG.Wait()
		aWG.Wait()
	})
	recordB := func(r timed) {
		bMu.Lock()
		bOps = append(bOps, r)
		bMu.Unlock()
	}
	bWG.Add(3)
	go func() {
		defer bWG.Done()
		for i := 0; ; i++ {
			select {
			case <-stopB:
				return
			default:
			}
			recordB(timeOp("publish", func() error {
				return l.publish(b, "B", "jobs", fmt.Sprintf("split-B-%02d", i))
			}))
			time.Sleep(200 * time.Millisecond) // pacing of the load
		}
	}()
	go func() {
		defer bWG.Done()
		// Not inbox/, where the publishes go: the kernel holds a
		// directory's lock through a readdir, so that a publish there
		// would wait for the ls to fail before it starts.
		recordB(timeOp("ls processing/", func() error {
			_, err := os.ReadDir(b.Path("jobs", "processing"))
			return err
		}))
	}()
	go func() {
		defer bWG.Done()
		recordB(timeOp("consume (.next)", func() error {
			_, err := l.consume(b, "B", "jobs")
			return err
		}))
	}()

	var aErrs []error
	var aOps int
	var aWorst time.Duration
	aWG.Add(1)
	go func() {
		defer aWG.Done()
		for i := 0; ; i++ {
			select {
			case <-stopA:
				return
			default:
			}
			r := timeOp("publish", func() error { return l.publish(a, "A", "jobs", fmt.Sprintf("split-A-%03d", i)) })
			if r.err == nil {
				r = timeOp("consume", func() error { _, err := l.consume(a, "A", "jobs"); return err })
			}
			aOps++
			aWorst = max(aWorst, r.took)
			if r.err != nil {
				aErrs = append(aErrs, fmt.Errorf("%s on A during the split: %w", r.what, r.err))
				return
			}
			time.Sleep(50 * time.Millisecond) // pacing of the load
		}
	}()

	// A lease taken on A now expires when A holds the duty, which it
	// cannot before the server lets B's duty session go.
	leaseOnA := func(name string) time.Time {
		t.Helper()
		if err := os.WriteFile(a.Path("lease", "inbox", name), []byte("x"), 0o644); err != nil {
			t.Fatalf("publish %s on A during the split: %v", name, err)
		}
		if err := os.Rename(a.Path("lease", "inbox", name), a.Path("lease", "processing", name)); err != nil {
			t.Fatalf("lease %s on A during the split: %v", name, err)
		}
		return time.Now()
	}
	backInInbox := func(name string, within time.Duration) (time.Time, bool) {
		var at time.Time
		ok := testenv.RetryUntil(within, func() bool {
			_, err := os.Stat(a.Path("lease", "inbox", name))
			at = time.Now()
			return err == nil
		})
		return at, ok
	}
	leaseOnA("early")
	earlyCh := make(chan time.Time, 1) // when it came back; zero: not in time
	aWG.Add(1)
	go func() {
		defer aWG.Done()
		var at time.Time
		testenv.RetryUntil(splitTakeover+10*time.Second, func() bool {
			select {
			case <-stopA: // the test ended early
				return true
			default:
			}
			if _, err := os.Stat(a.Path("lease", "inbox", "early")); err == nil {
				at = time.Now()
			}
			return !at.IsZero()
		})
		earlyCh <- at
	}()

	var takeover time.Duration
	if !testenv.RetryUntil(splitTakeover+5*time.Second, func() bool {
		ok, err := duty(a)
		takeover = time.Since(split)
		return err == nil && ok
	}) {
		t.Fatalf("A did not take the duty within %v of the split (B's log:\n%s)", splitTakeover+5*time.Second, b.Log()[offB:])
	}
	t.Logf("split: A took the duty %v after the split (as seen in A's .stats)", takeover.Round(time.Millisecond))
	if takeover > splitTakeover {
		t.Errorf("A took the duty %v after the split, want within %v", takeover.Round(time.Millisecond), splitTakeover)
	}
	earlyBack := <-earlyCh
	if earlyBack.IsZero() {
		t.Fatalf("a lease taken on A at the split did not come back to inbox/ within %v of the split", splitTakeover+10*time.Second)
	}
	t.Logf("split: a lease taken on A at the split (visibility 1 s) came back %v after the split, %v after A saw the duty",
		earlyBack.Sub(split).Round(time.Millisecond), (earlyBack.Sub(split) - takeover).Round(time.Millisecond))
	if earlyBack.Sub(split) > takeover+8*time.Second {
		t.Errorf("the lease came back %v after A took the duty, want within 8 s", (earlyBack.Sub(split) - takeover).Round(time.Millisecond))
	}
	taken := leaseOnA("late")
	lateBack, ok := backInInbox("late", 8*time.Second)
	if !ok {
		t.Fatalf("a lease taken on A after it took the duty did not come back to inbox/ within 8 s")
	}
	t.Logf("split: a lease taken on A after its takeover (visibility 1 s) came back in %v", lateBack.Sub(taken).Round(time.Millisecond))
	for _, name := range []string{"early", "late"} {
		if n := attempts(t, a.Path("lease", "inbox", name)); n != 1 {
			t.Errorf("lease %s: attempts %d after its expiry, want 1 (expired once)", name, n)
		}
	}

	// B's operations: wait for the ls and the consume, and for two
	// publishes or more; then stop B's publisher.
	if !testenv.RetryUntil(2*splitEIO+5*time.Second, func() bool {
		bMu.Lock()
		defer bMu.Unlock()
		pubs := 0
		for _, r := range bOps {
			if r.what == "publish" {
				pubs++
			}
		}
		return len(bOps)-pubs == 2 && pubs >= 2
	}) {
		bMu.Lock()
		t.Errorf("B's operations did not all return within %v of the split (a hang): %v", 2*splitEIO+5*time.Second, bOps)
		bMu.Unlock()
	}
	closeB()
	bWG.Wait()
	bOpsDone := time.Since(split)
	var worstEIO time.Duration
	var pubTook []time.Duration
	for _, r := range bOps {
		if r.what != "publish" || len(pubTook) == 0 {
			t.Logf("split: B %s: %v after %v", r.what, r.err, r.took.Round(time.Millisecond))
		}
		if r.what == "publish" {
			pubTook = append(pubTook, r.took)
		}
		if !errors.Is(r.err, syscall.EIO) {
			t.Errorf("B %s during the split: %v, want EIO", r.what, r.err)
		}
		if r.took > splitEIO {
			t.Errorf("B %s during the split took %v, want EIO within %v", r.what, r.took.Round(time.Millisecond), splitEIO)
		}
		worstEIO = max(worstEIO, r.took)
	}
	t.Logf("split: B's publishes, one after another, all failed: %s", summarize(pubTook))
	problems := problemLines(b.Log(), offB)
	if len(problems) == 0 {
		t.Errorf("B logged no warning or error during the split:\n%s", b.Log()[offB:])
	} else {
		t.Logf("split: B logged %d warnings and errors, the first: %s", len(problems), problems[0])
	}
	// B stopped its duty before A took it: never two holders.
	lost, ok := logTime(b.Log(), offB, "duty lost")
	if !ok {
		t.Errorf("B did not log that it lost the duty:\n%s", b.Log()[offB:])
	}
	got, ok2 := logTime(a.Log(), offA, "duty taken")
	if !ok2 {
		t.Errorf("A did not log that it took the duty:\n%s", a.Log()[offA:])
	}
	if ok && ok2 {
		t.Logf("split: B logged \"duty lost\" %v after the split, A \"duty taken\" %v after",
			lost.Sub(split).Round(time.Millisecond), got.Sub(split).Round(time.Millisecond))
		if !lost.Before(got) {
			t.Errorf("B lost the duty at %v, after A took it at %v: two holders at once", lost, got)
		}
		if earlyBack.Before(got) {
			t.Errorf("the early lease came back at %v, before A took the duty at %v", earlyBack, got)
		}
	}
	closeA()
	aWG.Wait()
	for _, err := range aErrs {
		t.Error(err)
	}
	t.Logf("split: A published and consumed %d times while split, the slowest operation took %v", aOps, aWorst.Round(time.Millisecond))
	if aOps < 10 {
		t.Errorf("A published and consumed only %d times while split", aOps)
	}

	// The link comes back.
	if err := ns.up(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	t.Logf("heal: the link is up again %v after the split", healed.Sub(split).Round(time.Millisecond))
	var recovered time.Duration
	var failures []timed
	for i := 0; ; i++ {
		r := timeOp("publish", func() error { return l.publish(b, "B", "jobs", fmt.Sprintf("post-B-%02d", i)) })
		if r.err == nil {
			recovered = time.Since(healed)
			break
		}
		failures = append(failures, r)
		if time.Since(healed) > splitRecover {
			t.Fatalf("B did not publish again within %v of the link coming back; failures: %v\nB's log:\n%s", splitRecover, failures, b.Log()[offB:])
		}
		time.Sleep(100 * time.Millisecond) // pacing of the retries, each of which is recorded
	}
	t.Logf("heal: B published again %v after the link came back (%d failed attempts before: %v)", recovered.Round(time.Millisecond), len(failures), failures)
	for i := 100; i < 110; i++ {
		if err := l.publish(b, "B", "jobs", fmt.Sprintf("post-B-%02d", i)); err != nil {
			t.Errorf("publish on B after the heal: %v", err)
		}
	}
	if _, err := os.ReadDir(b.Path("jobs", "inbox")); err != nil {
		t.Errorf("ls on B after the heal: %v", err)
	}
	// Exactly one duty holder, A, for a while.
	if h := dutyHolder(t, 10*time.Second, a, b); h != a {
		t.Error("B holds the duty after the heal; A took it over during the split")
	}
	for range 10 {
		da, errA := duty(a)
		db, errB := duty(b)
		if errA != nil || errB != nil || !da || db {
			t.Errorf("after the heal: duty A %v (%v), B %v (%v); want A alone", da, errA, db, errB)
			break
		}
		time.Sleep(200 * time.Millisecond) // a wrong takeover of the duty would show within these 2 s
	}

	// Drain on A, then count.
	for {
		name, err := l.consume(a, "A", "jobs")
		if err != nil {
			t.Fatalf("drain on A: %v", err)
		}
		if name == "" {
			break
		}
	}
	found := map[string]int{}
	for name, who := range l.consumed {
		found[name] += len(who)
	}
	for _, state := range []string{"inbox", "processing", "delayed", "dlq"} {
		ents, err := os.ReadDir(a.Path("jobs", state))
		if err != nil {
			t.Fatalf("ls %s on A at the end: %v", state, err)
		}
		for _, e := range ents {
			found[e.Name()]++
		}
		entsB, err := os.ReadDir(b.Path("jobs", state))
		if err != nil || len(entsB) != len(ents) {
			t.Errorf("ls %s on B at the end: %d entries, %v; A has %d", state, len(entsB), err, len(ents))
		}
	}
	var lostNames, twice, unknown, lateCommits []string
	for name := range l.committed {
		switch found[name] {
		case 0:
			lostNames = append(lostNames, name)
		case 1:
		default:
			twice = append(twice, fmt.Sprintf("%s (%d: consumed on %v)", name, found[name], l.consumed[name]))
		}
	}
	for name, n := range found {
		if _, ok := l.committed[name]; ok {
			continue
		}
		if _, ok := l.uncertain[name]; !ok {
			unknown = append(unknown, name)
		} else if n > 0 {
			lateCommits = append(lateCommits, name)
			if n > 1 {
				twice = append(twice, fmt.Sprintf("%s (%d)", name, n))
			}
		}
	}
	slices.Sort(lostNames)
	slices.Sort(twice)
	if len(lostNames) > 0 {
		t.Errorf("%d committed messages lost: %v", len(lostNames), lostNames)
	}
	if len(twice) > 0 {
		t.Errorf("messages found more than once: %v", twice)
	}
	if len(unknown) > 0 {
		t.Errorf("messages nobody published: %v", unknown)
	}
	if len(lateCommits) > 0 {
		t.Logf("publishes that failed but committed (allowed: the error said it may have): %v", lateCommits)
	}
	post, postOnA := 0, 0
	for name := range l.committed {
		if strings.HasPrefix(name, "post-B-") {
			post++
			if slices.Equal(l.consumed[name], []string{"A"}) {
				postOnA++
			}
		}
	}
	if postOnA != post {
		t.Errorf("%d of the %d messages B published after the heal were consumed on A, want all", postOnA, post)
	}
	byWho := map[string]int{}
	for _, who := range l.committed {
		byWho[who]++
	}
	t.Logf("end: %d committed messages (%d on A, %d on B): %d lost, %d found twice; %d publishes failed (on B, while split), %d of them committed",
		len(l.committed), byWho["A"], byWho["B"], len(lostNames), len(twice), len(l.uncertain), len(lateCommits))
	t.Logf("B's log since the split:\n%s\nA's:\n%s", b.Log()[offB:], a.Log()[offA:])
	t.Logf("summary: B's EIO within %v (worst of %d), B's operations done %v after the split; duty to A %v after the split; B works again %v after the heal; test %v",
		worstEIO.Round(time.Millisecond), len(bOps), bOpsDone.Round(time.Millisecond), takeover.Round(time.Millisecond),
		recovered.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}
