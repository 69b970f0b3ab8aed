package postgres

import (
	"context"
	"log/slog"
	"net/url"
	"slices"
	"testing"
	"time"

	"yirangmq/backends"
	"yirangmq/backends/backendtest"
	"yirangmq/queuecore"
	"yirangmq/testenv"
	"yirangmq/testenv/pgtest"
)

// bouncerExecMode is the default_query_exec_mode the store needs through
// PgBouncer 1.18 in transaction mode (Debian 12's), which passes no named
// prepared statement from one transaction to the next: cache_describe
// prepares none and still sends a statement in one round trip.
const bouncerExecMode = "cache_describe"

// bouncedURL is the store string of database db through tx, a PgBouncer in
// transaction mode, with its sessions (listener, duty) at session, a
// connection string of their own.
func bouncedURL(tx *pgtest.Bouncer, db, session string) string {
	return tx.URL(db) + "&default_query_exec_mode=" + bouncerExecMode + "&" + sessionKey + "=" + url.QueryEscape(session)
}

// TestConformanceThroughBouncer: the conformance suite, each store's pool
// through a PgBouncer in transaction mode and its sessions (listener,
// duty) straight to the server. A database per directory: PgBouncer takes
// no search_path at connect (options), so no schema per directory. (The
// suite closes every store it reopens, so unlike suiteOpener's this
// opener has no kill -9 to wait out; and server sessions stay in the
// bouncer's pool after their clients leave.)
func TestConformanceThroughBouncer(t *testing.T) {
	srv := pgtest.Start(t)
	tx := pgtest.StartBouncer(t, srv, pgtest.Transaction)
	backendtest.Run(t, func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
		lock, err := backends.LockStore(dir, "postgres conformance")
		if err != nil {
			return nil, err
		}
		s, err := func() (*Store, error) {
			db := dbName(dir)
			direct, err := srv.EnsureDB(ctx, db)
			if err != nil {
				return nil, err
			}
			return openPlain(ctx, bouncedURL(tx, db, direct), backends.Options{Sync: sync, Holder: db})
		}()
		if err != nil {
			_ = lock.Unlock()
			return nil, err
		}
		return &lockedStore{Store: s, lock: lock}, nil
	})
}

// TestSharedThroughBouncer: the shared-store suite with every connection
// through PgBouncer: the pools through one in transaction mode, the
// sessions (listener, duty) through one in session mode, as a site whose
// daemons reach the database only through its poolers would run them.
func TestSharedThroughBouncer(t *testing.T) {
	srv := pgtest.Start(t)
	tx := pgtest.StartBouncer(t, srv, pgtest.Transaction)
	sess := pgtest.StartBouncer(t, srv, pgtest.Session)
	backendtest.RunShared(t, func(ctx context.Context, dir string) (queuecore.SharedStore, error) {
		db := dbName(dir)
		if _, err := srv.EnsureDB(ctx, db); err != nil {
			return nil, err
		}
		return Open(ctx, bouncedURL(tx, db, sess.URL(db)), backends.Options{})
	})
}

// TestResyncWhileDeaf: a store whose listener cannot reconnect (its
// session bouncer is gone) while its pool works tells its subscribers,
// every resyncWhileDeaf, that anything may have changed, so that the
// core reloads the queues other daemons made; once the listener is back,
// hints flow again.
func TestResyncWhileDeaf(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	tx := pgtest.StartBouncer(t, srv, pgtest.Transaction)
	sess := pgtest.StartBouncer(t, srv, pgtest.Session)
	srv.CreateDB(t, "deaf")
	old := resyncWhileDeaf
	resyncWhileDeaf = 300 * time.Millisecond
	t.Cleanup(func() { resyncWhileDeaf = old })
	var logs logRecorder
	s := open(t, bouncedURL(tx, "deaf", sess.URL("deaf")), backends.Options{Logger: slog.New(&logs)})
	other := open(t, srv.URL("deaf"), backends.Options{})
	var heard changeLog
	s.Subscribe(heard.add)
	if err := sess.Stop(); err != nil {
		t.Fatal(err)
	}
	testenv.MustRetryUntil(t, 10*time.Second, "the listener notices", func() bool { return logs.count("change listener lost") > 0 })
	if err := other.PutQueue(ctx, testQueue("made-meanwhile")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutQueue(ctx, testQueue("mine")); err != nil { // the pool works
		t.Fatalf("PutQueue through the transaction bouncer: %v", err)
	}
	testenv.MustRetryUntil(t, 5*time.Second, "two resyncs while deaf", func() bool {
		heard.mu.Lock()
		defer heard.mu.Unlock()
		return len(heard.cs) >= 2 && slices.Equal(heard.cs[:2], []queuecore.Change{{}, {}})
	})
	if slices.ContainsFunc(heard.get(), func(c queuecore.Change) bool { return c.Queue != "" }) {
		t.Errorf("heard %v with the listener down", heard.get())
	}
	if err := sess.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.MustRetryUntil(t, 10*time.Second, "the listener reconnects", func() bool { return logs.count("change listener reconnected") > 0 })
	if err := other.PutQueue(ctx, testQueue("after")); err != nil {
		t.Fatal(err)
	}
	heard.waitFor(t, queuecore.Change{Queue: "after"})
}
