package postgres

import (
	"context"
	"net/url"
	"testing"

	"yirangmq/backends"

	"yirangmq/backends/backendtest"
	"yirangmq/queuecore"
	"yirangmq/testenv/pgtest"
)

func TestConformance(t *testing.T) {
	srv := pgtest.Start(t)
	backendtest.Run(t, suiteOpener(srv))
}

func TestShared(t *testing.T) {
	srv := pgtest.Start(t)
	backendtest.RunShared(t, sharedOpener(srv))
}

// TestCrash kills a child process that commits batches and checks the
// store it leaves (the child is this test, run again, on this test's
// server through pgtest.Export). Over PostgreSQL, kill -9 of a client
// is the loss of a connection: the server rolls back what was not
// committed; the suite checks that nothing committed is lost and nothing
// half done is left.
func TestCrash(t *testing.T) {
	srv := pgtest.Start(t) // in the child: the parent's server
	srv.Export(t)
	backendtest.RunCrash(t, suiteOpener(srv))
}

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
