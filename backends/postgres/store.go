package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	neturl "net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// errClosed is returned by the methods of a closed store.
var errClosed = errors.New("postgres store is closed")

// Store is a queuecore.SharedStore kept in a PostgreSQL database.
type Store struct {
	pool *pgxpool.Pool
	// session is the configuration of the listener's and the duty's
	// connections, which need a session of their own (sessionKey).
	session *pgx.ConnConfig
	log     *slog.Logger
	origin  string // random, in every notification this store sends
	// txSettings is the statement that starts every write transaction
	// (see txSettings).
	txSettings string
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
	down atomic.Bool // the last call failed to reach the database (noteOutage)

	stop      context.CancelFunc // stops the listener and duty goroutines
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// sessionKey is the setting of the store string that names where the
// listener of change hints and the duty connect: a connection string of
// its own, in either form (by default the store string itself). LISTEN
// and the duty's session advisory lock need a session of their own,
// which a pooler in transaction mode (PgBouncer's pool_mode=transaction)
// does not give: through one, name the server itself or a database of
// the pooler in session mode (docs/multihost.md). It is taken out of the
// store string before pgx reads it; the server never sees it.
const sessionKey = "session_url"

// idleInTxTimeout is how long the server keeps a session idle in a
// transaction of this store before it ends it (see txSettings), unless
// the store string sets idle_in_transaction_session_timeout.
const idleInTxTimeout = "15s"

// Open connects to the database at url (a postgres:// URL or a key=value
// DSN, as libpq takes them; pgx's and pgxpool's settings, such as
// pool_max_conns or default_query_exec_mode, and session_url may be
// added) and creates the schema if it is missing. It starts the listener
// of change hints and the duty goroutine.
func Open(ctx context.Context, url string, opts backends.Options) (*Store, error) {
	cfg, session, err := storeConfig(url, opts.Holder)
	if err != nil {
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	cc := cfg.ConnConfig
	origin := make([]byte, 8)
	_, _ = rand.Read(origin) // never fails (crypto/rand)
	s := &Store{
		session: session,
		log:     opts.Log().With("store", "postgres"),
		origin:  hex.EncodeToString(origin),
	}
	_, setsIdle := cc.RuntimeParams["idle_in_transaction_session_timeout"]
	s.txSettings = txSettings(opts.Sync, !setsIdle)

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
		return fail("listen for changes (on "+describe(session)+")", err)
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

// storeConfig reads a store string: the pool's configuration and the
// session connection's (the listener and the duty lock; the pool's own
// unless session_url names another, as behind PgBouncer), both with a
// bounded connect timeout and an application_name that names the holder.
func storeConfig(url, holder string) (*pgxpool.Config, *pgx.ConnConfig, error) {
	cfg, err := parseConfig(url)
	if err != nil {
		return nil, nil, err
	}
	cc := cfg.ConnConfig
	session := cc.Copy()
	if su, ok := cc.RuntimeParams[sessionKey]; ok {
		delete(cc.RuntimeParams, sessionKey)
		sc, err := parseConfig(su)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", sessionKey, err)
		}
		if _, nested := sc.ConnConfig.RuntimeParams[sessionKey]; nested {
			return nil, nil, fmt.Errorf("%s: it has a %s of its own", sessionKey, sessionKey)
		}
		session = sc.ConnConfig
	}
	delete(session.RuntimeParams, sessionKey)
	for _, c := range []*pgx.ConnConfig{cc, session} {
		if c.ConnectTimeout == 0 || c.ConnectTimeout > connectTimeout {
			c.ConnectTimeout = connectTimeout
		}
		if _, ok := c.RuntimeParams["application_name"]; !ok {
			name := "yirangmq"
			if holder != "" {
				name += ": " + holder
			}
			c.RuntimeParams["application_name"] = truncate(name, 63)
		}
	}
	if !hasSetting(url, "pool_max_conns") {
		cfg.MaxConns = defaultMaxConns
	}
	return cfg, session, nil
}

// parseConfig reads a store string as pgxpool does, and says what is
// wrong with one it cannot read without quoting it (it may hold a
// password).
func parseConfig(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err == nil {
		return cfg, nil
	}
	// pgx's own text quotes the connection string; say it redacted.
	msg := "invalid connection string"
	if inner := errors.Unwrap(err); inner != nil {
		msg = inner.Error()
	}
	var ue *neturl.Error // its text quotes the URL, password and all
	if errors.As(err, &ue) {
		msg = ue.Err.Error()
	}
	return nil, fmt.Errorf("cannot parse %s: %s", Redact(url), msg)
}

// hasSetting reports whether the store string sets key (the URL's query
// or a key=value pair), so that a default of pgxpool's can be told from
// a value the user gave.
func hasSetting(conn, key string) bool {
	found := false
	walkSettings(conn, func(k, _ string) {
		found = found || k == key
	})
	return found
}

// txSettings is the statement that opens every write transaction of the
// store: the settings it needs, made local to the transaction. They are
// not session settings (startup parameters or SET), because a pooler in
// transaction mode hands each transaction to any of its server sessions:
// PgBouncer refuses unknown startup parameters, and a SET would stay on
// the server session for the next client. Per transaction they hold
// whatever sits between the store and the server, and cost one more
// statement in a round trip that is sent anyway.
//
//   - synchronous_commit: a commit is on stable storage (full, normal)
//     or only written (off: it survives a crash of yirangmq, which is all
//     off promises, but not one of the database server).
//   - idle_in_transaction_session_timeout: a daemon cut off in the middle
//     of a transaction (LeaseNext holds a row lock between its two round
//     trips) must not keep its locks until the server's TCP keepalive
//     notices, hours later by default: the server ends the session once
//     it is idle in the transaction for 15 s (unless the store string
//     sets it).
func txSettings(sync queuecore.SyncMode, idle bool) string {
	commit := "on"
	if sync == queuecore.SyncOff {
		commit = "off"
	}
	q := "SELECT set_config('synchronous_commit', '" + commit + "', true)"
	if idle {
		q += ", set_config('idle_in_transaction_session_timeout', '" + idleInTxTimeout + "', true)"
	}
	return q
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

// connect opens a session of its own (listener, duty), outside the pool,
// where session_url says.
func (s *Store) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	return pgx.ConnectConfig(ctx, s.session)
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// noteOutage logs, once per outage, that the database cannot be reached
// (every operation through the mount fails with EIO meanwhile), and when
// it can again. err is the result of a call; a refusal by a live server
// (a conflict, a missing row) says nothing either way.
func (s *Store) noteOutage(err error) {
	if err != nil && !unreachable(err) {
		return
	}
	down := err != nil
	if s.down.Swap(down) == down {
		return
	}
	if down {
		s.log.Error("database unreachable: operations through the mount fail with EIO until it is back", queuecore.LogErr, err)
	} else {
		s.log.Info("database reachable again")
	}
}

// codeDiskFull is PostgreSQL's disk_full: the server could not extend a
// table, an index or its WAL.
const codeDiskFull = "53100"

// diskFull gives a write that failed on the server's full disk the errno
// a full local disk gives (ENOSPC, which fusefs passes to the caller) and
// one log line; the transaction was rolled back whole, and the next write
// after the server has room again succeeds, without a restart.
func (s *Store) diskFull(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) || pgErr.Code != codeDiskFull {
		return err
	}
	s.log.Error("the database server's disk is full: writes fail with ENOSPC until it has room", queuecore.LogErr, pgErr.Message)
	return fmt.Errorf("%w (%w)", err, syscall.ENOSPC)
}

// unreachable reports whether err says that the database could not be
// reached or went away, rather than refused a statement.
func unreachable(err error) bool {
	for _, sentinel := range []error{queuecore.ErrNotFound, queuecore.ErrExists, queuecore.ErrEmpty, queuecore.ErrNotEmpty, errClosed} {
		if errors.Is(err, sentinel) {
			return false
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// admin_shutdown, crash_shutdown, cannot_connect_now: a server
		// going down or starting.
		return pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	return true
}
