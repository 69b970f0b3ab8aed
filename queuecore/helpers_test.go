package queuecore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"sync"
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

// stores are the stores every queuecore test runs on.
var stores = []struct {
	name string
	open func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error)
}{
	{"sqlite", func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
		return sqlite.Open(ctx, dir, backends.Options{Sync: sync})
	}},
	{"fs", func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
		return fs.Open(ctx, dir, backends.Options{Sync: sync})
	}},
	{"postgres", func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
		if pg == nil {
			return nil, errNoPostgres
		}
		// The same directory, the same schema: a reopen finds its data.
		sum := sha256.Sum256([]byte(dir))
		u, err := pg.SchemaURL(ctx, "queuecore", "q_"+hex.EncodeToString(sum[:10]))
		if err != nil {
			return nil, err
		}
		return postgres.Open(ctx, u, backends.Options{Sync: sync})
	}},
}

// pg is the PostgreSQL server of the postgres store's runs, started by the
// first of them (so that a fuzzing worker, which runs this binary too,
// never starts one) and stopped by TestMain.
var (
	pgOnce        sync.Once
	pg            *pgtest.Server
	pgStop        = func() {}
	pgErr         error
	errNoPostgres = errors.New("no PostgreSQL server")
)

// postgresServer returns the server, or skips t (fails it when required).
func postgresServer(t *testing.T) *pgtest.Server {
	t.Helper()
	pgOnce.Do(func() { pg, pgStop, pgErr = pgtest.StartMain() })
	switch {
	case pgErr == nil:
		return pg
	case errors.Is(pgErr, pgtest.ErrNoPostgres) && os.Getenv(pgtest.EnvRequire) != "1":
		t.Skipf("no PostgreSQL server here: %v", pgErr)
	default:
		t.Fatalf("PostgreSQL server: %v", pgErr)
	}
	return nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	pgStop()
	os.Exit(code)
}

var t0 = time.Date(2026, 1, 13, 10, 0, 0, 0, time.UTC)

// env is one core on one store with a fake clock.
type env struct {
	t     *testing.T
	ctx   context.Context
	dir   string
	open  func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error)
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
			if s.name == "postgres" {
				postgresServer(t)
			}
			f(t, newEnv(t, s.open))
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
	postgresServer(t)
	open := stores[2].open
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
