package multihost

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"yirangmq/testenv"
	"yirangmq/testenv/pgtest"
)

// bounced is two daemons on one database: direct straight to the server,
// bounced behind PgBouncer, its pool through a bouncer in transaction
// mode (tx) and its sessions, the hint listener's and the duty's, through
// one in session mode (sess), as a site whose gateways reach the database
// only through its poolers would mount it.
type bounced struct {
	pg             *pgtest.Server
	tx, sess       *pgtest.Bouncer
	url            string // the database, straight
	direct, behind *testenv.Daemon
}

// bouncedStore is the store string of db through tx, its sessions
// through sess: what docs/multihost.md tells users to write.
func bouncedStore(tx, sess *pgtest.Bouncer, db string) string {
	return tx.URL(db) + "&default_query_exec_mode=cache_describe&session_url=" + url.QueryEscape(sess.URL(db))
}

// startBounced starts both daemons, the one behind PgBouncer first when
// behindFirst (so that it takes the duty).
func startBounced(t *testing.T, behindFirst bool) *bounced {
	t.Helper()
	pg := pgtest.Start(t)
	b := &bounced{pg: pg, url: pg.CreateDB(t, "mhb")}
	b.tx = pgtest.StartBouncer(t, pg, pgtest.Transaction)
	b.sess = pgtest.StartBouncer(t, pg, pgtest.Session)
	direct := testenv.DaemonOptions{Backend: "postgres", Store: b.url, Sync: "full"}
	behind := testenv.DaemonOptions{Backend: "postgres", Store: bouncedStore(b.tx, b.sess, "mhb"), Sync: "full"}
	if behindFirst {
		b.behind = testenv.StartDaemon(t, behind)
		dutyHolder(t, 10*time.Second, b.behind)
		b.direct = testenv.StartDaemon(t, direct)
	} else {
		b.direct = testenv.StartDaemon(t, direct)
		dutyHolder(t, 10*time.Second, b.direct)
		b.behind = testenv.StartDaemon(t, behind)
	}
	return b
}

// dutyLocks counts the sessions of the server that hold an advisory lock
// of the database (the duty's is the only one the store keeps).
func dutyLocks(t *testing.T, dbURL string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBouncerPublishConsume: a daemon behind PgBouncer in transaction mode
// and one straight on the server share the queues: what one publishes
// the other consumes, with the bytes written, each message once, a
// .next blocked on one wakes on the other's publish, and a queue made on
// one shows on the other.
func TestBouncerPublishConsume(t *testing.T) {
	b := startBounced(t, false)
	mkqueue(t, b.direct, b.behind, "q", "")
	mkqueue(t, b.behind, b.direct, "r", "")
	for _, c := range []struct {
		from, to *testenv.Daemon
		queue    string
	}{{b.direct, b.behind, "q"}, {b.behind, b.direct, "r"}} {
		want := map[string]string{}
		for i := range 20 {
			name := fmt.Sprintf("m%02d", i)
			want[name] = strings.Repeat(name, i+1)
			publish(t, c.from, c.queue, name, want[name])
		}
		for len(want) > 0 {
			name, err := next(c.to, c.queue, true)
			if err != nil {
				t.Fatalf("%s/.next: %v", c.queue, err)
			}
			if name == "" {
				t.Fatalf("%s/.next: EAGAIN with %d messages not consumed", c.queue, len(want))
			}
			body, ok := want[name]
			if !ok {
				t.Fatalf("%s/.next gave %q, not published or given before", c.queue, name)
			}
			got, err := os.ReadFile(c.to.Path(c.queue, "processing", name))
			if err != nil || string(got) != body {
				t.Fatalf("%s/processing/%s: %q, %v; want %q", c.queue, name, got, err, body)
			}
			if err := os.Remove(c.to.Path(c.queue, "processing", name)); err != nil {
				t.Fatal(err)
			}
			delete(want, name)
		}
		for _, d := range []*testenv.Daemon{c.from, c.to} {
			if ents, err := os.ReadDir(d.Path(c.queue, "inbox")); err != nil || len(ents) != 0 {
				t.Errorf("%s/inbox on %s after every ack: %d entries, %v", c.queue, d.Mountpoint, len(ents), err)
			}
		}
	}
	// A .next blocked behind the bouncer wakes on a publish on the other.
	lat := wakeLatencies(t, b.direct, b.behind, "q", 5, 0)
	t.Logf(".next behind PgBouncer woken by a publish straight on the server: %s", summarize(lat))
}

// wakeLatencies publishes n messages on from, one at a time, each while a
// read of .next blocks on to (for 150 ms plus up to spread, at random),
// and returns how long after each publish began the read returned it.
func wakeLatencies(t *testing.T, from, to *testenv.Daemon, queue string, n int, spread time.Duration) []time.Duration {
	t.Helper()
	var lat []time.Duration
	for i := range n {
		type res struct {
			name string
			err  error
			at   time.Time
		}
		ch := make(chan res, 1)
		go func() {
			name, err := next(to, queue, false)
			ch <- res{name, err, time.Now()}
		}()
		wait := 150 * time.Millisecond // let it block
		if spread > 0 {
			wait += rand.N(spread)
		}
		time.Sleep(wait)
		name := fmt.Sprintf("w%d-%d", time.Now().UnixNano(), i)
		sent := time.Now()
		publish(t, from, queue, name, "wake")
		select {
		case r := <-ch:
			if r.err != nil || r.name != name {
				t.Fatalf(".next on %s: %q, %v; want %q", to.Mountpoint, r.name, r.err, name)
			}
			lat = append(lat, r.at.Sub(sent))
		case <-time.After(10 * time.Second):
			t.Fatalf(".next on %s did not return within 10 s of a publish on %s", to.Mountpoint, from.Mountpoint)
		}
		if err := os.Remove(to.Path(queue, "processing", name)); err != nil {
			t.Fatal(err)
		}
	}
	return lat
}

// TestBouncerDutyHolderKilled: the daemon behind PgBouncer holds the duty
// (its advisory lock on a session of the session-mode bouncer) and is
// killed with SIGKILL: the bouncer resets that session, the daemon
// straight on the server takes the duty over and expires leases, and
// after the killed one is back, exactly one daemon holds the duty, and
// the server exactly one advisory lock, for as long as we look.
func TestBouncerDutyHolderKilled(t *testing.T) {
	b := startBounced(t, true)
	mkqueue(t, b.behind, b.direct, "q", `{"visibilityTimeoutSec": 1, "retry": {"limit": 5, "backoff": "fixed", "initialDelaySec": 0, "maxDelaySec": 0}}`)
	if n := dutyLocks(t, b.url); n != 1 {
		t.Errorf("%d advisory locks held with the duty behind PgBouncer, want 1", n)
	}
	killed := time.Now()
	if err := b.behind.Kill(); err != nil {
		t.Fatal(err)
	}
	if dutyHolder(t, 15*time.Second, b.direct) != b.direct {
		t.Fatal("the daemon on the server did not take the duty")
	}
	t.Logf("duty taken over %v after the holder behind PgBouncer was killed", time.Since(killed).Round(time.Millisecond))
	publish(t, b.direct, "q", "after", "x")
	if err := os.Rename(b.direct.Path("q", "inbox", "after"), b.direct.Path("q", "processing", "after")); err != nil {
		t.Fatal(err)
	}
	if !testenv.RetryUntil(8*time.Second, func() bool {
		_, err := os.Stat(b.direct.Path("q", "inbox", "after"))
		return err == nil
	}) {
		t.Fatal("after the takeover, an expired lease did not come back within 8 s")
	}

	b.behind.Restart(t)
	// The restarted daemon serves (through the bouncer) before we look.
	mkqueue(t, b.behind, b.direct, "r", "")
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		d1, err1 := duty(b.direct)
		d2, err2 := duty(b.behind)
		if err1 != nil || err2 != nil || !d1 || d2 {
			t.Fatalf("after the restart: duty on the server's daemon %v (%v), behind PgBouncer %v (%v); want the first alone", d1, err1, d2, err2)
		}
		if n := dutyLocks(t, b.url); n != 1 {
			t.Fatalf("after the restart: %d advisory locks held, want 1", n)
		}
	}
}

// TestNextWakesWithoutHints: with its session bouncer gone, the daemon
// behind PgBouncer hears no change hints (its listener cannot reconnect)
// and still leases what the other publishes: a blocked .next falls back
// to looking at the database by itself. It logs how late that is, beside
// the wake-up with hints.
func TestNextWakesWithoutHints(t *testing.T) {
	b := startBounced(t, false)
	mkqueue(t, b.direct, b.behind, "q", "")
	with := wakeLatencies(t, b.direct, b.behind, "q", 10, 0)
	if err := b.sess.Stop(); err != nil {
		t.Fatal(err)
	}
	// Wait until the daemon knows its listener is gone (it logs it), so
	// that no resync on reconnecting wakes the readers below.
	if !testenv.RetryUntil(10*time.Second, func() bool {
		return strings.Contains(b.behind.Log(), "change listener lost its connection")
	}) {
		t.Fatalf("the daemon did not notice its listener's connection go:\n%s", b.behind.Log())
	}
	// A blocked .next looks again a second after its last look: how late
	// it is depends on when in that second the message comes, so the
	// publishes come at random times.
	without := wakeLatencies(t, b.direct, b.behind, "q", 20, time.Second)
	if slices.Max(without) < 50*time.Millisecond {
		t.Errorf("without hints every wake-up took under 50 ms (%s): were hints heard after all?", summarize(without))
	}
	t.Logf("cross-host .next wake-up with hints: %s; without (polling): %s", summarize(with), summarize(without))
}
