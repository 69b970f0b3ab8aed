// Package multihost tests several daemons mounting one PostgreSQL store,
// as several gateways sharing one set of queues would (issue 7): each
// daemon is its own process with its own mount, as on its own host, and
// they meet only in the database.
package multihost

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
	"yirangmq/testenv/pgtest"
)

func TestMain(m *testing.M) {
	testenv.CleanLeftoverMounts()
	os.Exit(m.Run())
}

// pair is two daemons on one database.
type pair struct {
	pg   *pgtest.Server
	url  string
	a, b *testenv.Daemon
}

func startPair(t *testing.T, args ...string) *pair {
	t.Helper()
	pg := pgtest.Start(t)
	url := pg.CreateDB(t, "mh")
	p := &pair{pg: pg, url: url}
	opts := testenv.DaemonOptions{Backend: "postgres", Store: url, Sync: "full", Args: args}
	p.a = testenv.StartDaemon(t, opts)
	p.b = testenv.StartDaemon(t, opts)
	return p
}

// mkqueue creates a queue on d with a policy, and waits until other sees it.
func mkqueue(t *testing.T, d, other *testenv.Daemon, name, policy string) {
	t.Helper()
	if err := os.Mkdir(d.Path(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if policy != "" {
		if err := os.WriteFile(d.Path(name, ".policy"), []byte(policy), 0o644); err != nil {
			t.Fatalf("write policy: %v", err)
		}
	}
	if !testenv.RetryUntil(5*time.Second, func() bool {
		data, err := os.ReadFile(other.Path(name, ".policy"))
		return err == nil && (policy == "" || samePolicy(data, []byte(policy)))
	}) {
		t.Fatalf("queue %s (with its policy) not seen by the other daemon within 5 s", name)
	}
}

// samePolicy reports whether every field of want has its value in got.
func samePolicy(got, want []byte) bool {
	var g, w map[string]any
	if json.Unmarshal(got, &g) != nil || json.Unmarshal(want, &w) != nil {
		return false
	}
	for k, v := range w {
		if fmt.Sprint(g[k]) != fmt.Sprint(v) {
			return false
		}
	}
	return true
}

func publish(t *testing.T, d *testenv.Daemon, queue, name, body string) {
	t.Helper()
	if err := os.WriteFile(d.Path(queue, "inbox", name), []byte(body), 0o644); err != nil {
		t.Fatalf("publish %s: %v", name, err)
	}
}

// next leases through .next and returns the message's name, or "" on
// EAGAIN.
func next(d *testenv.Daemon, queue string, nonblock bool) (string, error) {
	flags := os.O_RDONLY
	if nonblock {
		flags |= syscall.O_NONBLOCK
	}
	f, err := os.OpenFile(d.Path(queue, ".next"), flags, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, 512)
	n, err := syscall.Read(int(f.Fd()), buf)
	for errors.Is(err, syscall.EINTR) {
		// A signal (Go's own SIGURG) ended the wait; no lease was taken.
		n, err = syscall.Read(int(f.Fd()), buf)
	}
	if errors.Is(err, syscall.EAGAIN) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(strings.TrimSpace(string(buf[:n])), "processing/"), nil
}

func attempts(t *testing.T, path string) int {
	t.Helper()
	buf := make([]byte, 32)
	n, err := unix.Getxattr(path, "user.yirangmq.attempts", buf)
	if err != nil {
		t.Fatalf("getxattr %s: %v", path, err)
	}
	v, err := strconv.Atoi(string(buf[:n]))
	if err != nil {
		t.Fatalf("attempts of %s: %q", path, buf[:n])
	}
	return v
}

// duty reads the "duty" field of a daemon's root .stats.
func duty(d *testenv.Daemon) (bool, error) {
	data, err := os.ReadFile(d.Path(".stats"))
	if err != nil {
		return false, err
	}
	var s struct {
		Duty *bool `json:"duty"`
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return false, err
	}
	if s.Duty == nil {
		return false, fmt.Errorf("no duty field in .stats: %s", data)
	}
	return *s.Duty, nil
}

// dutyHolder waits until exactly one of ds holds the duty and returns it.
func dutyHolder(t *testing.T, within time.Duration, ds ...*testenv.Daemon) *testenv.Daemon {
	t.Helper()
	var holder *testenv.Daemon
	if !testenv.RetryUntil(within, func() bool {
		holder = nil
		n := 0
		for _, d := range ds {
			if ok, err := duty(d); err == nil && ok {
				holder = d
				n++
			}
		}
		return n == 1
	}) {
		t.Fatalf("no single duty holder among %d daemons within %v", len(ds), within)
	}
	return holder
}

// TestProducersOnOneConsumersOnTheOther: what A publishes, B consumes,
// each message once, with the bytes A wrote; consumers on both hosts
// racing for the same messages never lease one twice.
func TestProducersOnOneConsumersOnTheOther(t *testing.T) {
	p := startPair(t)
	mkqueue(t, p.a, p.b, "jobs", `{"visibilityTimeoutSec": 300}`)
	const n = 300
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 3 {
				publish(t, p.a, "jobs", fmt.Sprintf("m%04d", i), fmt.Sprintf("body of %d", i))
			}
		}()
	}
	var mu sync.Mutex
	got := map[string]int{}
	errs := make(chan error, 16)
	consume := func(d *testenv.Daemon, viaRename bool) {
		defer wg.Done()
		idle := 0
		for idle < 20 {
			var name string
			if viaRename {
				ents, err := os.ReadDir(d.Path("jobs", "inbox"))
				if err != nil {
					errs <- err
					return
				}
				for _, e := range ents {
					if err := os.Rename(d.Path("jobs", "inbox", e.Name()), d.Path("jobs", "processing", e.Name())); err == nil {
						name = e.Name()
						break
					} else if !errors.Is(err, syscall.ENOENT) {
						errs <- fmt.Errorf("rename %s: %w", e.Name(), err)
						return
					}
				}
			} else {
				var err error
				if name, err = next(d, "jobs", true); err != nil {
					errs <- fmt.Errorf(".next: %w", err)
					return
				}
			}
			if name == "" {
				idle++
				time.Sleep(50 * time.Millisecond) // an idle consumer's pacing
				continue
			}
			idle = 0
			body, err := os.ReadFile(d.Path("jobs", "processing", name))
			if err != nil {
				errs <- fmt.Errorf("read leased %s: %w", name, err)
				return
			}
			i, _ := strconv.Atoi(strings.TrimPrefix(name, "m"))
			if want := fmt.Sprintf("body of %d", i); string(body) != want {
				errs <- fmt.Errorf("%s: body %q, want %q", name, body, want)
			}
			if err := os.Remove(d.Path("jobs", "processing", name)); err != nil {
				errs <- fmt.Errorf("ack %s: %w", name, err)
				return
			}
			mu.Lock()
			got[name]++
			mu.Unlock()
		}
	}
	for _, c := range []struct {
		d      *testenv.Daemon
		rename bool
	}{{p.b, false}, {p.b, true}, {p.a, false}, {p.b, false}} {
		wg.Add(1)
		go consume(c.d, c.rename)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("m%04d", i)
		if got[name] != 1 {
			t.Errorf("%s consumed %d times, want once", name, got[name])
		}
	}
	for _, d := range []*testenv.Daemon{p.a, p.b} {
		for _, s := range []string{"inbox", "processing"} {
			if ents, _ := os.ReadDir(d.Path("jobs", s)); len(ents) != 0 {
				t.Errorf("%s still holds %d messages", s, len(ents))
			}
		}
	}
}

// TestStaleEntryAcrossHosts: a message leased on B leaves A's inbox/ (ls
// and stat) within a bounded time, and a rename of A's stale name fails
// with ENOENT: no second lease.
func TestStaleEntryAcrossHosts(t *testing.T) {
	// The daemons send the kernel no entry invalidations (one can keep a
	// killed daemon from exiting): A's ls sees the move at once, A's stat
	// within the kernel cache's timeout.
	const cache = time.Second
	p := startPair(t, "--cache-timeout", cache.String())
	mkqueue(t, p.a, p.b, "q", "")
	var worstStat, worstLs time.Duration
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("x%d", i)
		publish(t, p.a, "q", name, "hello")
		inA := p.a.Path("q", "inbox", name)
		if _, err := os.Stat(inA); err != nil { // now cached by A's kernel
			t.Fatal(err)
		}
		leased := time.Now()
		if err := os.Rename(p.b.Path("q", "inbox", name), p.b.Path("q", "processing", name)); err != nil {
			t.Fatalf("lease on B: %v", err)
		}
		var gone, listed time.Duration
		ok := testenv.RetryUntil(5*time.Second, func() bool {
			if gone == 0 {
				if _, err := os.Stat(inA); errors.Is(err, syscall.ENOENT) {
					gone = time.Since(leased)
				}
			}
			if listed == 0 {
				ents, err := os.ReadDir(p.a.Path("q", "inbox"))
				if err == nil && !hasName(ents, name) {
					listed = time.Since(leased)
				}
			}
			return gone > 0 && listed > 0
		})
		if !ok {
			t.Fatalf("%s leased on B still in A's inbox/ after 5 s (stat gone %v, ls gone %v)", name, gone, listed)
		}
		worstStat, worstLs = max(worstStat, gone), max(worstLs, listed)
		err := os.Rename(inA, p.a.Path("q", "processing", name))
		if !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("rename of the stale name on A: %v, want ENOENT", err)
		}
		if err := os.Remove(p.a.Path("q", "processing", name)); err != nil {
			t.Fatalf("ack on A of what B leased: %v", err)
		}
	}
	t.Logf("a lease on B left A's stat within %v and A's ls within %v (worst of 5; kernel cache %v)", worstStat, worstLs, cache)
}

func hasName(ents []os.DirEntry, name string) bool {
	for _, e := range ents {
		if e.Name() == name {
			return true
		}
	}
	return false
}

// TestNextWakesAcrossHosts: a .next read blocked on A returns the message
// B publishes.
func TestNextWakesAcrossHosts(t *testing.T) {
	p := startPair(t)
	mkqueue(t, p.a, p.b, "q", "")
	var lat []time.Duration
	for i := 0; i < 20; i++ {
		type res struct {
			name string
			err  error
			at   time.Time
		}
		ch := make(chan res, 1)
		go func() {
			n, err := next(p.a, "q", false)
			ch <- res{n, err, time.Now()}
		}()
		time.Sleep(100 * time.Millisecond) // let it block
		name := fmt.Sprintf("w%d", i)
		sent := time.Now()
		publish(t, p.b, "q", name, "wake")
		select {
		case r := <-ch:
			if r.err != nil || r.name != name {
				t.Fatalf(".next on A: %q, %v; want %q", r.name, r.err, name)
			}
			lat = append(lat, r.at.Sub(sent))
		case <-time.After(10 * time.Second):
			t.Fatal(".next on A did not return within 10 s of a publish on B")
		}
		if err := os.Remove(p.a.Path("q", "processing", name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("cross-host .next wake-up (publish on B to .next on A): %s", summarize(lat))
}

func summarize(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	s := append([]time.Duration(nil), d...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return fmt.Sprintf("p50 %v, max %v over %d", s[len(s)/2].Round(10*time.Microsecond), s[len(s)-1].Round(10*time.Microsecond), len(s))
}

// TestExpiryOnceAndDutyTakeover: with two daemons up, an expired lease
// comes back once (attempts 1, not 2); when the duty holder is killed,
// the other takes the duty over and expires leases in its place.
func TestExpiryOnceAndDutyTakeover(t *testing.T) {
	p := startPair(t)
	mkqueue(t, p.a, p.b, "q", `{"visibilityTimeoutSec": 1, "retry": {"limit": 5, "backoff": "fixed", "initialDelaySec": 0, "maxDelaySec": 0}}`)
	holder := dutyHolder(t, 10*time.Second, p.a, p.b)
	other := p.a
	if holder == p.a {
		other = p.b
	}
	for _, d := range []*testenv.Daemon{p.a, p.b} {
		name := "e-" + filepath.Base(d.Mountpoint) + strconv.Itoa(d.Pid())
		publish(t, d, "q", name, "x")
		if err := os.Rename(d.Path("q", "inbox", name), d.Path("q", "processing", name)); err != nil {
			t.Fatal(err)
		}
		if !testenv.RetryUntil(8*time.Second, func() bool {
			_, err := os.Stat(d.Path("q", "inbox", name))
			return err == nil
		}) {
			t.Fatalf("lease taken on %s did not expire back to inbox/ within 8 s", d.Mountpoint)
		}
		time.Sleep(300 * time.Millisecond) // a second expiry would show by now
		if n := attempts(t, d.Path("q", "inbox", name)); n != 1 {
			t.Errorf("attempts after one expiry: %d, want 1 (expired once, by one daemon)", n)
		}
		if err := os.Remove(d.Path("q", "inbox", name)); err != nil {
			t.Fatal(err)
		}
	}

	// Kill the duty holder; the survivor must take over.
	killed := time.Now()
	if err := holder.Kill(); err != nil {
		t.Fatal(err)
	}
	if dutyHolder(t, 15*time.Second, other) != other {
		t.Fatal("survivor did not take the duty")
	}
	t.Logf("duty taken over %v after the holder was killed", time.Since(killed).Round(time.Millisecond))
	publish(t, other, "q", "after", "x")
	if err := os.Rename(other.Path("q", "inbox", "after"), other.Path("q", "processing", "after")); err != nil {
		t.Fatal(err)
	}
	if !testenv.RetryUntil(8*time.Second, func() bool {
		_, err := os.Stat(other.Path("q", "inbox", "after"))
		return err == nil
	}) {
		t.Fatal("after the takeover, an expired lease did not come back within 8 s")
	}
	// The killed one comes back and does not take the duty from the holder.
	holder.Restart(t)
	time.Sleep(2 * time.Second) // a wrong takeover of the duty would show by now
	if ok, err := duty(holder); err != nil || ok {
		t.Errorf("restarted daemon: duty %v, %v; want false while the other holds it", ok, err)
	}
}

// TestDatabaseUnreachable: while the database is down, operations fail
// with EIO and the daemon says so in its log; when it is back, the daemon
// works again by itself and nothing committed is lost.
func TestDatabaseUnreachable(t *testing.T) {
	p := startPair(t)
	mkqueue(t, p.a, p.b, "q", "")
	publish(t, p.a, "q", "before", "committed before the outage")
	if err := p.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	err := os.WriteFile(p.a.Path("q", "inbox", "during"), []byte("x"), 0o644)
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("publish with the database down: %v, want EIO", err)
	}
	if _, err := os.ReadDir(p.b.Path("q", "inbox")); !errors.Is(err, syscall.EIO) {
		t.Errorf("ls with the database down: %v, want EIO", err)
	}
	if err := p.pg.Start(); err != nil {
		t.Fatal(err)
	}
	if !testenv.RetryUntil(20*time.Second, func() bool {
		return os.WriteFile(p.a.Path("q", "inbox", "after"), []byte("y"), 0o644) == nil
	}) {
		t.Fatal("daemon A did not work again within 20 s of the database coming back")
	}
	for _, name := range []string{"before", "after"} {
		if !testenv.RetryUntil(10*time.Second, func() bool {
			b, err := os.ReadFile(p.b.Path("q", "inbox", name))
			return err == nil && len(b) > 0
		}) {
			t.Errorf("%s not readable on B after the outage", name)
		}
	}
	if !strings.Contains(p.a.Log()+p.b.Log(), "level=ERROR") && !strings.Contains(p.a.Log()+p.b.Log(), "level=WARN") {
		t.Errorf("no log line about the outage:\nA:\n%s\nB:\n%s", p.a.Log(), p.b.Log())
	}
}
