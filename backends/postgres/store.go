package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

var _ queuecore.SharedStore = (*Store)(nil)

// Time limits. A FUSE request must not hang on a database that is gone:
// connecting gives up after connectTimeout, a call after callTimeout.
const (
	connectTimeout = 5 * time.Second
	callTimeout    = 10 * time.Second
	// scanTimeout bounds the calls that read every message (Counts, MaxID),
	// which the core makes once at start.
	scanTimeout = 2 * time.Minute
	// defaultMaxConns is the pool size unless the URL sets pool_max_conns:
	// pgxpool's default (the number of CPUs, at least 4) is small for a
	// daemon whose calls mostly wait on the network.
	defaultMaxConns = 16
)

// Log keys.
const (
	logErr   = "err"
	logQueue = "queue"
)

// errClosed is returned by the methods of a closed store.
var errClosed = errors.New("postgres store is closed")

// Store is a queuecore.SharedStore kept in a PostgreSQL database.
type Store struct {
	pool   *pgxpool.Pool
	conf   *pgx.ConnConfig // for the dedicated connections of the listener and duty
	log    *slog.Logger
	origin string // random, in every notification this store sends
	// channel and dutyKey depend on the schema of the tables (storeNames).
	channel string
	dutyKey int64
	// plain turns the revision checks off (updates and deletes apply
	// whatever the stored revision, and store Msg.Rev as given): the plain
	// Store contract, for the conformance suite (see export_test.go).
	plain bool

	// mu is held shared by every call for its duration and exclusively by
	// Close, which so waits for the calls in progress.
	mu     sync.RWMutex
	closed bool

	subMu sync.Mutex
	subs  []func(queuecore.Change)

	duty atomic.Bool

	stop      context.CancelFunc // stops the listener and duty goroutines
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// Open connects to the database at url (a postgres:// URL or a key=value
// DSN, as libpq takes them; pool_max_conns and the other pgxpool settings
// may be added) and creates the schema if it is missing. It starts the
// listener of change hints and the duty goroutine.
func Open(ctx context.Context, url string, opts backends.Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("open postgres store: parse %s: %w", redact(url), err)
	}
	cc := cfg.ConnConfig
	if cc.ConnectTimeout == 0 || cc.ConnectTimeout > connectTimeout {
		cc.ConnectTimeout = connectTimeout
	}
	// synchronous_commit: a commit is on stable storage (full, normal)
	// or only written (off: it survives a crash of yirangmq, which is all
	// off promises, but not one of the database server).
	cc.RuntimeParams["synchronous_commit"] = "on"
	if opts.Sync == queuecore.SyncOff {
		cc.RuntimeParams["synchronous_commit"] = "off"
	}
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		name := "yirangmq"
		if opts.Holder != "" {
			name += ": " + opts.Holder
		}
		cc.RuntimeParams["application_name"] = truncate(name, 63)
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = defaultMaxConns
	}
	origin := make([]byte, 8)
	_, _ = rand.Read(origin) // never fails (crypto/rand)
	s := &Store{
		conf:   cc.Copy(),
		log:    opts.Log().With("store", "postgres"),
		origin: hex.EncodeToString(origin),
	}

	openCtx, cancel := context.WithTimeout(ctx, 2*connectTimeout)
	defer cancel()
	s.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	fail := func(what string, err error) (*Store, error) {
		s.pool.Close()
		return nil, fmt.Errorf("open postgres store %s: %s: %w", describe(cc), what, err)
	}
	c, err := s.pool.Acquire(openCtx)
	if err != nil {
		return fail("connect", err)
	}
	schemaName, err := migrate(openCtx, c.Conn())
	c.Release()
	if err != nil {
		return fail("schema", err)
	}
	s.channel, s.dutyKey = storeNames(schemaName)
	// The listener's first LISTEN is made before Open returns: whatever
	// other daemons commit after Open reaches Subscribe.
	lc, err := s.connectListener(openCtx)
	if err != nil {
		return fail("listen for changes", err)
	}
	bg, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.listenLoop(bg, lc)
	}()
	go func() {
		defer s.wg.Done()
		s.dutyLoop(bg)
	}()
	return s, nil
}

// Close stops the listener and the duty goroutine (releasing duty), waits
// for the calls in progress and closes every connection.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.stop()
		s.wg.Wait()
		s.pool.Close()
	})
	return nil
}

// enter starts a call: it fails once the store is closed, and Close waits
// for the calls that entered. The caller must call the returned function.
func (s *Store) enter() (func(), error) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return nil, errClosed
	}
	return s.mu.RUnlock, nil
}

// writeCtx is the context of a write: not cancelled with the caller's (a
// FUSE request interrupted by a signal must not make a commit fail after
// or while it is made), bounded by callTimeout.
func writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
}

// readCtx is the context of a read: like a write's, not cancelled with
// the caller's (a FUSE request is interrupted by any signal to its caller,
// Go's SIGURG among them, and a read must not fail for that), bounded by d.
// The core watches the caller's context itself where it waits.
func readCtx(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// connect opens a dedicated connection (listener, duty), outside the pool.
func (s *Store) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	return pgx.ConnectConfig(ctx, s.conf)
}

// closeConn closes a dedicated connection without waiting long for a
// server that is gone.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// describe names the database of cc for error messages, without password.
func describe(cc *pgx.ConnConfig) string {
	return fmt.Sprintf("%s@%s:%d/%s", cc.User, cc.Host, cc.Port, cc.Database)
}

// redact hides the password of a URL or DSN in an error message.
func redact(url string) string {
	if i := strings.Index(url, "://"); i >= 0 {
		rest := url[i+3:]
		if at := strings.LastIndex(strings.SplitN(rest, "/", 2)[0], "@"); at >= 0 {
			if colon := strings.Index(rest[:at], ":"); colon >= 0 {
				return url[:i+3] + rest[:colon] + ":xxx" + rest[at:]
			}
		}
		return url
	}
	if strings.Contains(url, "password") {
		return "(a DSN with a password)"
	}
	return url
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
