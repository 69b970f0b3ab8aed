package queuecore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"yirangmq/backends"
	"yirangmq/backends/fs"
	"yirangmq/backends/postgres"
	"yirangmq/backends/sqlite"
	"yirangmq/queuecore"
	"yirangmq/testenv"
	"yirangmq/testenv/pgtest"
)

// openStore opens a store in dir (a reopen of dir finds its data).
type openStore = func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error)

// stores are the stores every queuecore test runs on. opener returns the
// function that opens one; it skips tb when the store cannot run here (no
// PostgreSQL server).
var stores = []struct {
	name   string
	opener func(tb testing.TB) openStore
}{
	{"sqlite", func(testing.TB) openStore {
		return func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
			return sqlite.Open(ctx, dir, backends.Options{Sync: sync})
		}
	}},
	{"fs", func(testing.TB) openStore {
		return func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
			return fs.Open(ctx, dir, backends.Options{Sync: sync})
		}
	}},
	{"postgres", postgresOpener},
}

// postgresOpener opens postgres stores, each in a schema of its own (by
// directory) on the package's server; it skips tb without one.
func postgresOpener(tb testing.TB) openStore {
	pg := postgresServer(tb)
	return func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
		// The same directory, the same schema: a reopen finds its data.
		sum := sha256.Sum256([]byte(dir))
		u, err := pg.SchemaURL(ctx, "queuecore", "q_"+hex.EncodeToString(sum[:10]))
		if err != nil {
			return nil, err
		}
		return postgres.Open(ctx, u, backends.Options{Sync: sync})
	}
}

// postgresServer returns the PostgreSQL server of the postgres store's
// runs, or skips tb (fails it when pgtest.EnvRequire=1). It is the one
// that TestMain started for the whole package: pgtest.Start attaches to
// it. A fuzzing worker, which runs this binary too, attaches to the one
// of its parent.
func postgresServer(tb testing.TB) *pgtest.Server {
	tb.Helper()
	return pgtest.Start(tb)
}

// TestMain starts the package's PostgreSQL server (see postgresServer)
// and stops it at the end. Without PostgreSQL binaries the postgres runs
// skip, or fail with pgtest.EnvRequire=1 (pgtest.Start); a server that
// is there but does not start fails the package.
func TestMain(m *testing.M) {
	pg, stop, err := pgtest.StartMain()
	switch {
	case err == nil:
		undo := pg.ExportMain()
		stopServer := stop
		stop = func() { undo(); stopServer() }
	case !errors.Is(err, pgtest.ErrNoPostgres):
		fmt.Fprintf(os.Stderr, "PostgreSQL server: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

var t0 = time.Date(2026, 1, 13, 10, 0, 0, 0, time.UTC)

// env is one core on one store with a fake clock.
type env struct {
	t     *testing.T
	ctx   context.Context
	dir   string
	open  openStore
	store queuecore.Store
	core  *queuecore.Core
	clock *testenv.FakeClock
	notes *notes
}

type notes struct{ ch chan queuecore.Event }

func (n *notes) Notify(e queuecore.Event) {
	select {
	case n.ch <- e:
	default:
	}
}

// eachStore runs f as a subtest on every store.
func eachStore(t *testing.T, f func(t *testing.T, e *env)) {
	t.Helper()
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			f(t, newEnv(t, s.opener(t)))
		})
	}
}

// newEnv starts a core on the store that open opens in a new directory;
// it is stopped when t ends.
func newEnv(t *testing.T, open openStore) *env {
	e := &env{t: t, ctx: context.Background(), dir: t.TempDir(), open: open,
		clock: testenv.NewFakeClock(t0), notes: &notes{ch: make(chan queuecore.Event, 1024)}}
	e.start()
	t.Cleanup(e.stop)
	return e
}

// postgresEnv is newEnv on the postgres store, which wrap may wrap; it
// skips t when there is no PostgreSQL server here.
func postgresEnv(t *testing.T, wrap func(queuecore.Store) queuecore.Store) *env {
	t.Helper()
	open := postgresOpener(t)
	return newEnv(t, func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
		st, err := open(ctx, dir, sync)
		if err != nil {
			return nil, err
		}
		return wrap(st), nil
	})
}

func (e *env) start() {
	e.t.Helper()
	st, err := e.open(e.ctx, e.dir, queuecore.SyncNormal)
	if err != nil {
		e.t.Fatalf("open store: %v", err)
	}
	if ss, ok := st.(queuecore.SharedStore); ok {
		// The timed work of a shared store waits for its duty.
		if !testenv.RetryUntil(10*time.Second, ss.Duty) {
			st.Close()
			e.t.Fatal("the shared store's duty was not taken within 10 s")
		}
	}
	c, err := queuecore.Open(e.ctx, st, queuecore.Options{Clock: e.clock, Notifier: e.notes})
	if err != nil {
		st.Close()
		e.t.Fatalf("open core: %v", err)
	}
	e.store, e.core = st, c
}

func (e *env) stop() {
	if e.core != nil {
		e.core.Close()
		e.store.Close()
		e.core, e.store = nil, nil
	}
}

// restart closes and reopens the core and its store on the same directory.
func (e *env) restart() {
	e.stop()
	e.start()
}

func (e *env) queue(name, policy string) {
	e.t.Helper()
	if err := e.core.CreateQueue(e.ctx, name, 1000, 1000, 0o755); err != nil {
		e.t.Fatalf("create queue %s: %v", name, err)
	}
	if policy != "" {
		if err := e.core.SetPolicy(e.ctx, name, []byte(policy)); err != nil {
			e.t.Fatalf("set policy of %s: %v", name, err)
		}
	}
}

func (e *env) publish(q, name, body string) queuecore.Message {
	e.t.Helper()
	r, err := e.core.Publish(e.ctx, q, name, []byte(body), queuecore.PublishOptions{UID: 1000, GID: 1000})
	if err != nil {
		e.t.Fatalf("publish %s/%s: %v", q, name, err)
	}
	return r.Message
}

// get returns the message name in state s, failing the test if absent.
func (e *env) get(q string, s queuecore.State, name string) queuecore.Message {
	e.t.Helper()
	m, err := e.core.Get(e.ctx, q, s, name)
	if err != nil {
		e.t.Fatalf("get %s/%s/%s: %v", q, s.Dir(), name, err)
	}
	return m
}

// names lists a state's message names in store order.
func (e *env) names(q string, s queuecore.State) []string {
	e.t.Helper()
	var out []string
	if err := e.core.List(e.ctx, q, s, func(m queuecore.Message) bool {
		out = append(out, m.Name)
		return true
	}); err != nil {
		e.t.Fatalf("list %s/%s: %v", q, s.Dir(), err)
	}
	return out
}

func (e *env) stats(q string) queuecore.QueueStats {
	e.t.Helper()
	s, err := e.core.Stats(e.ctx, q)
	if err != nil {
		e.t.Fatalf("stats %s: %v", q, err)
	}
	return s
}

// settledStats is stats with a shared store's gauges read again first
// (queuecore.SettledStats): for polls while the fake clock stands still.
func (e *env) settledStats(q string) queuecore.QueueStats {
	e.t.Helper()
	s, err := queuecore.SettledStats(e.core, e.ctx, q)
	if err != nil {
		e.t.Fatalf("stats %s: %v", q, err)
	}
	return s
}

// waitState waits (in real time) for the scheduler to move a message.
func (e *env) waitState(q string, s queuecore.State, name string) queuecore.Message {
	e.t.Helper()
	var m queuecore.Message
	ok := testenv.RetryUntil(5*time.Second, func() bool {
		var err error
		m, err = e.core.Get(e.ctx, q, s, name)
		return err == nil
	})
	if !ok {
		e.t.Fatalf("%s/%s/%s never appeared", q, s.Dir(), name)
	}
	return m
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got error %v, want %v", err, target)
	}
}

func equal(t *testing.T, what string, got, want any) {
	t.Helper()
	if g, ok := got.(time.Time); ok {
		if w, ok := want.(time.Time); ok && g.Equal(w) {
			return
		}
	}
	if got != want {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func equalNames(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s = %q, want %q", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s = %q, want %q", what, got, want)
		}
	}
}
