package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

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
	// a daemon's calls mostly wait on the network, so it has more
	// connections than CPUs.
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
	pool   *pool
	conf   *pgconn.Config // for the dedicated connections of the listener and duty
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
	down atomic.Bool // the last call failed to reach the database (noteOutage)

	stop      context.CancelFunc // stops the listener and duty goroutines
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// sessionSettings are set on every connection of the pool (see Open).
var sessionSettings = map[string]string{
	"idle_in_transaction_session_timeout": "15s",
	"tcp_keepalives_idle":                 "5",
	"tcp_keepalives_interval":             "2",
	"tcp_keepalives_count":                "3",
}

// Open connects to the database at url (a postgres:// URL or a key=value
// DSN, as libpq takes them; pool_max_conns may be added) and creates the
// schema if it is missing. It starts the listener of change hints and the
// duty goroutine.
func Open(ctx context.Context, url string, opts backends.Options) (*Store, error) {
	cc, err := pgconn.ParseConfig(url)
	if err != nil {
		// pgx's own text quotes the connection string; say it redacted.
		msg := "invalid connection string"
		if inner := errors.Unwrap(err); inner != nil {
			msg = inner.Error()
		}
		var ue *neturl.Error // its text quotes the URL, password and all
		if errors.As(err, &ue) {
			msg = ue.Err.Error()
		}
		return nil, fmt.Errorf("open postgres store: cannot parse %s: %s", Redact(url), msg)
	}
	maxConns, ignored, err := poolSettings(cc.RuntimeParams)
	if err != nil {
		return nil, fmt.Errorf("open postgres store: %s: %w", Redact(url), err)
	}
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
	// A daemon cut off in the middle of a transaction (LeaseNext holds a
	// row lock between its two round trips) must not keep its locks until
	// the server's TCP keepalive notices, hours later by default: the
	// server ends a session idle in a transaction for 15 s, and probes a
	// silent peer after 5 s. Set unless the URL sets them.
	for k, v := range sessionSettings {
		if _, ok := cc.RuntimeParams[k]; !ok {
			cc.RuntimeParams[k] = v
		}
	}
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		name := "yirangmq"
		if opts.Holder != "" {
			name += ": " + opts.Holder
		}
		cc.RuntimeParams["application_name"] = truncate(name, 63)
	}
	origin := make([]byte, 8)
	_, _ = rand.Read(origin) // never fails (crypto/rand)
	s := &Store{
		conf:   cc,
		pool:   newPool(cc, maxConns),
		log:    opts.Log().With("store", "postgres"),
		origin: hex.EncodeToString(origin),
	}
	if len(ignored) > 0 {
		s.log.Warn("connection string settings ignored: the store's own pool does not use them", "settings", strings.Join(ignored, ","))
	}

	openCtx, cancel := context.WithTimeout(ctx, 2*connectTimeout)
	defer cancel()
	fail := func(what string, err error) (*Store, error) {
		s.pool.Close()
		return nil, fmt.Errorf("open postgres store %s: %s: %w", describe(cc), what, err)
	}
	c, err := s.pool.Acquire(openCtx)
	if err != nil {
		return fail("connect", err)
	}
	schemaName, err := migrate(openCtx, c.conn)
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

// poolSettings takes the pool's settings out of the runtime parameters
// that pgconn.ParseConfig left (it would send them to the server, which
// refuses names it does not know): pool_max_conns, and the names of the
// settings of pgx's own pool and connection, which are ignored.
func poolSettings(params map[string]string) (maxConns int, ignored []string, err error) {
	maxConns = defaultMaxConns
	if v, ok := params["pool_max_conns"]; ok {
		delete(params, "pool_max_conns")
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, nil, fmt.Errorf("pool_max_conns=%q: want a positive whole number", v)
		}
		maxConns = n
	}
	for k := range params {
		if strings.HasPrefix(k, "pool_") || k == "statement_cache_capacity" || k == "description_cache_capacity" || k == "default_query_exec_mode" {
			delete(params, k)
			ignored = append(ignored, k)
		}
	}
	slices.Sort(ignored)
	return maxConns, ignored, nil
}

// connect opens a dedicated connection (listener, duty), outside the pool,
// with cfg (s.conf if nil).
func (s *Store) connect(ctx context.Context, cfg *pgconn.Config) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if cfg == nil {
		cfg = s.conf
	}
	return dial(ctx, cfg)
}

// closeConn closes a connection without waiting long for a server that is
// gone.
func closeConn(c *conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// describe names the database of cc for error messages, without password.
func describe(cc *pgconn.Config) string {
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
		s.log.Error("database unreachable: operations through the mount fail with EIO until it is back", logErr, err)
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
	s.log.Error("the database server's disk is full: writes fail with ENOSPC until it has room", logErr, pgErr.Message)
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
