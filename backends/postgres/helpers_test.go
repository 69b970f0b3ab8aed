package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"yirangmq/backends"
	"yirangmq/backends/backendtest"
	"yirangmq/queuecore"
	"yirangmq/testenv"
	"yirangmq/testenv/pgtest"
)

// dbName maps a suite directory to a database: the same directory, the
// same database, so that the suite's reopen of a directory finds its data.
func dbName(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return "yq_" + hex.EncodeToString(sum[:12])
}

// lockedStore is a plain store with the directory lock of the suite.
type lockedStore struct {
	*Store
	lock *backends.Lock
}

func (l *lockedStore) Close() error {
	err := l.Store.Close()
	if uerr := l.lock.Unlock(); err == nil {
		err = uerr
	}
	return err
}

// suiteOpener opens plain stores for backendtest.Run and RunCrash, each
// directory a schema of one database (creating a database per directory
// would cost some 200ms each, the schema some 50ms). The suite's
// one-process-per-store check (testLock) is a property of a store in a
// directory; a database is shared by design, so the opener takes the
// directory lock of backends.LockStore itself, as a daemon's mount would.
func suiteOpener(srv *pgtest.Server) backendtest.Opener {
	return func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
		lock, err := backends.LockStore(dir, "postgres conformance")
		if err != nil {
			return nil, err
		}
		s, err := func() (*Store, error) {
			schema := dbName(dir)
			url, err := schemaURL(ctx, srv, "conformance", schema)
			if err != nil {
				return nil, err
			}
			if err := waitIdle(ctx, url, schema); err != nil {
				return nil, err
			}
			return openPlain(ctx, url, backends.Options{Sync: sync, Holder: schema})
		}()
		if err != nil {
			_ = lock.Unlock()
			return nil, err
		}
		return &lockedStore{Store: s, lock: lock}, nil
	}
}

// schemaURL creates database db and schema in it, if need be, and returns
// a URL whose search_path is that schema.
func schemaURL(ctx context.Context, srv *pgtest.Server, db, schema string) (string, error) {
	return srv.SchemaURL(ctx, db, schema)
}

// waitIdle waits until no store of holder is connected to the database
// of u. After a kill -9 of a crash child, its backends may still be
// finishing a transaction that they had received whole: the recovered
// store must be read after it commits or aborts, not before.
func waitIdle(ctx context.Context, u, holder string) error {
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	var n int
	var qerr error
	if testenv.RetryUntil(20*time.Second, func() bool {
		qerr = c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, "yirangmq: "+holder).Scan(&n)
		return qerr != nil || n == 0
	}) {
		return qerr
	}
	return fmt.Errorf("%d sessions of %s still connected after 20s", n, holder)
}

// sharedOpener opens checked stores for backendtest.RunShared.
func sharedOpener(srv *pgtest.Server) backendtest.SharedOpener {
	return func(ctx context.Context, dir string) (queuecore.SharedStore, error) {
		url, err := srv.EnsureDB(ctx, dbName(dir))
		if err != nil {
			return nil, err
		}
		return Open(ctx, url, backends.Options{})
	}
}

// open opens a checked store on url, closed at the end of the test.
func open(t testing.TB, url string, opts backends.Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), url, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// logRecorder is a slog handler that keeps the messages logged.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	r.mu.Lock()
	r.lines = append(r.lines, b.String())
	r.mu.Unlock()
	return nil
}

func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

func (r *logRecorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

// count is the number of lines holding s.
func (r *logRecorder) count(s string) int {
	n := 0
	for _, l := range r.get() {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}
