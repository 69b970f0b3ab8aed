package torture

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"yirangmq/testenv/pgtest"
)

// From the command line:
//
//	go test ./testenv/torture -run TestKillNineTorture -v -kills=50
var (
	flagKills     = flag.Int("kills", 20, "SIGKILLs of the daemon per store and sync mode")
	flagProducers = flag.Int("producers", 3, "concurrent producers")
	flagConsumers = flag.Int("consumers", 3, "concurrent consumers")
	flagSeed      = flag.Uint64("seed", 0, "random seed (0: from the clock)")
	flagStores    = flag.String("stores", "sqlite,fs", "stores to torture, comma-separated")
	flagSyncs     = flag.String("syncs", "full,normal", "sync modes to torture, comma-separated")
	// The producers' big messages (1 in 20, up to 96 KiB) are past 16K
	// five times in six: both of the sqlite store's places for a body
	// meet the kills.
	flagSqliteFileBodies = flag.String("sqlite-file-bodies", "16K", "the sqlite store's --sqlite-file-bodies (\"\": its default, 256K)")
	flagKeep             = flag.Bool("keep", false, "keep the history and final state of every run, not only of failed ones")
	flagDuration         = flag.Duration("duration", 0, "keep killing for this long per store and sync mode instead of stopping after -kills (make torture DURATION=30m)")
)

// keepDir is where histories are kept: out of the run's own temporary
// directory, which goes when the run passes.
var keepDir string

// TestMain moves this process's temporary directories, and so its
// mounts, to a directory of its own: testenv.CleanLeftoverMounts, which
// mounting test packages run at start, detaches every yirangmq mount
// under their $TMPDIR, live ones too, so a package started by the same
// `go test ./...` would otherwise pull this run's mount away. What runs
// of dead processes left behind is cleaned up here instead.
func TestMain(m *testing.M) {
	base := os.Getenv("YIRANGMQ_TORTURE_TMPDIR")
	if base == "" {
		base = "/var/tmp/yirangmq-torture"
	}
	cleanStaleRuns(base)
	keepDir = base
	dir := filepath.Join(base, strconv.Itoa(os.Getpid()))
	// Traversable by others: the PostgreSQL server of the shared-store
	// runs (pgtest) runs as the postgres user in a directory under it.
	os.MkdirAll(dir, 0o711)
	os.Chmod(base, 0o711)
	if err := os.Chmod(dir, 0o711); err == nil {
		os.Setenv("TMPDIR", dir)
	} else {
		fmt.Fprintf(os.Stderr, "torture: keeping TMPDIR: %v\n", err)
	}
	code := m.Run()
	if code == 0 {
		os.RemoveAll(dir) // the daemon binary; kept histories only exist on failure
	}
	os.Exit(code)
}

// TestKillNineTorture is issue 4's torture: for each store and sync mode,
// producers and consumers work through a real mount while the daemon is
// killed with SIGKILL at random moments; no committed message may be
// lost and no delivery may carry wrong bytes.
func TestKillNineTorture(t *testing.T) {
	for _, store := range strings.Split(*flagStores, ",") {
		for _, sync := range strings.Split(*flagSyncs, ",") {
			t.Run(store+"/"+sync, func(t *testing.T) {
				if testing.Short() && sync != "full" {
					t.Skip("-short: --sync full only")
				}
				opts := Options{
					Backend: store, Sync: sync, Kills: *flagKills, KeepDir: keepDir,
					Producers: *flagProducers, Consumers: *flagConsumers, Seed: *flagSeed,
				}
				if store == "sqlite" && *flagSqliteFileBodies != "" {
					opts.DaemonArgs = []string{"--sqlite-file-bodies", *flagSqliteFileBodies}
				}
				if *flagDuration > 0 {
					// A long run builds a backlog whenever consumers fall
					// behind producers; give the drain time to eat it.
					opts.Kills, opts.Duration = 1<<30, *flagDuration
					opts.DrainTimeout = max(30*time.Second, *flagDuration/3)
				}
				res := Run(t, opts)
				r := res.Report
				t.Logf("%s/%s in %v: %s", store, sync, res.Runtime.Round(100*time.Millisecond), r.Summary())
				t.Logf("kill phase %v, drain %v, restarts: %s", res.KillPhase.Round(100*time.Millisecond),
					res.Drain.Round(100*time.Millisecond), restartStats(res.Restarts))
				res.logKills(t)
				if *flagKeep {
					if dir, err := res.Save(keepDir); err == nil {
						t.Logf("history and final state kept in %s", dir)
					}
				}
				if len(res.DaemonErrors) > 0 {
					t.Logf("daemon errors: %s", FormatUnexpected(res.DaemonErrors))
				}
				if len(res.Unexpected) > 0 {
					t.Logf("errors from a live mount that are no refusal: %s", FormatUnexpected(res.Unexpected))
				}
				if res.Undrained > 0 {
					t.Errorf("%d messages still live after the drain: a lease that never expires, or a wedged consumer", res.Undrained)
				}
				if r.Kills < *flagKills {
					t.Errorf("only %d kills (wanted at least %d) within the time limit", r.Kills, *flagKills)
				}
				if n := len(r.RenameAnomalies); n > 0 {
					t.Errorf("%d leases granted by rename(2) to a message already leased (the kernel's same-inode rename shortcut, see doc.go); first: %s", n, r.RenameAnomalies[0])
				}
				for i, e := range r.Errors {
					if i == 20 {
						t.Errorf("… and %d more violations", len(r.Errors)-i)
						break
					}
					t.Error(e)
				}
				if len(r.Lost) > 0 || len(r.BadBytes) > 0 {
					t.Errorf("lost %d, wrong bytes %d", len(r.Lost), len(r.BadBytes))
				}
			})
		}
	}
}

// logKills logs what the kills did to the daemons and their clients, and
// fails t for a daemon or a client call stuck past StuckAfter (the kill
// itself already failed it), for each one it lists.
func (res *Result) logKills(t *testing.T) {
	t.Helper()
	t.Logf("kills %d: stuck daemons %d, stuck clients %d, dead mounts not answering ENOTCONN %d, wedged mounts the next daemon had to abort %d, lost %d, duplicates %d",
		res.Report.Kills, res.StuckDaemons, len(res.StuckClients), len(res.DeadMountErrors), res.Rescued, len(res.Report.Lost), res.Report.Duplicates)
	t.Logf("exit after SIGKILL: %s; SIGKILL to serving again: %s", durationStats(res.Exits), durationStats(res.Serving))
	for _, s := range res.StuckClients {
		t.Errorf("a client call stayed blocked past %v: %s", StuckAfter, s)
	}
}

// durationStats renders p50 and max of d.
func durationStats(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	s := append([]time.Duration(nil), d...)
	slices.Sort(s)
	return fmt.Sprintf("p50 %v, max %v (n=%d)", s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}

func restartStats(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	var sum, worst time.Duration
	for _, x := range d {
		sum += x
		worst = max(worst, x)
	}
	return "mean " + (sum / time.Duration(len(d))).Round(time.Millisecond).String() + ", worst " + worst.Round(time.Millisecond).String()
}

// TestKillNineTortureShared is issue 7's torture: two daemons mount one
// PostgreSQL store, producers on one and consumers on the other (and the
// other way round), while the daemon that holds the duty (lease expiry,
// backoff, retention) is killed again and again: nothing committed may be
// lost, and the other daemon must take the duty over every time.
func TestKillNineTortureShared(t *testing.T) {
	pg := pgtest.Start(t)
	res := runShared(t, pg, Options{Kills: *flagKills, KillDutyHolder: true})
	if len(res.Takeovers) != res.PhaseKills {
		t.Errorf("duty taken over %d times for %d kills of its holder", len(res.Takeovers), res.PhaseKills)
	}
	if *flagDuration == 0 && res.PhaseKills < *flagKills {
		t.Errorf("only %d kills (wanted %d) within the time limit", res.PhaseKills, *flagKills)
	}
	t.Logf("duty takeovers: %s", restartStats(res.Takeovers))
}

// TestStoreRestartUnderLoad restarts the PostgreSQL server under two
// daemons in the middle of a load: the daemons reconnect by themselves and
// nothing committed is lost.
func TestStoreRestartUnderLoad(t *testing.T) {
	pg := pgtest.Start(t)
	res := runShared(t, pg, Options{Kills: 6, DBRestarts: 3, RestartStore: func() error {
		if err := pg.Stop(); err != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond) // clients meet a dead database
		return pg.Start()
	}})
	if res.DBRestarts != 3 {
		t.Errorf("%d database restarts, want 3", res.DBRestarts)
	}
}

func runShared(t *testing.T, pg *pgtest.Server, opts Options) *Result {
	t.Helper()
	opts.Backend, opts.Sync, opts.Daemons = "postgres", "full", 2
	opts.Store = pg.CreateDB(t, "torture")
	opts.KeepDir, opts.Producers, opts.Consumers, opts.Seed = keepDir, *flagProducers, *flagConsumers, *flagSeed
	// A kill of the duty holder waits for the takeover (about a second),
	// and the consumers of a shared store are slower than its producers:
	// more kills need more time, and a longer drain.
	opts.Duration = max(2*time.Minute, time.Duration(opts.Kills)*4*time.Second)
	opts.DrainTimeout = max(30*time.Second, time.Duration(opts.Kills)*time.Second)
	if *flagDuration > 0 && opts.RestartStore == nil {
		opts.Kills, opts.Duration = 1<<30, *flagDuration
		opts.DrainTimeout = max(30*time.Second, *flagDuration/3)
	}
	res := Run(t, opts)
	r := res.Report
	t.Logf("postgres, 2 daemons, in %v: %s", res.Runtime.Round(100*time.Millisecond), r.Summary())
	t.Logf("kill phase %v, drain %v, restarts: %s, database restarts %d", res.KillPhase.Round(100*time.Millisecond),
		res.Drain.Round(100*time.Millisecond), restartStats(res.Restarts), res.DBRestarts)
	res.logKills(t)
	if len(res.Unexpected) > 0 {
		t.Logf("errors from a live mount that are no refusal: %s", FormatUnexpected(res.Unexpected))
	}
	if res.Undrained > 0 {
		t.Errorf("%d messages still live after the drain", res.Undrained)
	}
	if n := len(r.RenameAnomalies); n > 0 {
		t.Errorf("%d leases granted by rename(2) to a message already leased; first: %s", n, r.RenameAnomalies[0])
	}
	for i, e := range r.Errors {
		if i == 20 {
			t.Errorf("… and %d more violations", len(r.Errors)-i)
			break
		}
		t.Error(e)
	}
	if len(r.Lost) > 0 || len(r.BadBytes) > 0 {
		t.Errorf("lost %d, wrong bytes %d", len(r.Lost), len(r.BadBytes))
	}
	return res
}
