package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/mattn/go-sqlite3"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// FileName is the database file inside a store directory; SQLite keeps
// FileName-wal and FileName-shm beside it.
const FileName = "yirangmq.db"

// Tuning. The page caches are what the store's memory is made of; they
// are small because the kernel's page cache holds the file too, and a read
// that misses SQLite's cache costs a pread, not a disk access.
const (
	busyTimeout    = 5 * time.Second
	writerCacheKiB = 8 << 10 // the writer touches the right edge of the indexes and random name pages
	// A reader drops its whole page cache whenever a read transaction
	// begins after another connection's commit (SQLite's WAL readers do),
	// which under load is every read: a big cache then buys nothing and
	// its drop costs a walk of the cache's hash table (a profile of leases
	// by 4 clients showed it: docs/performance-history.md).
	readerCacheKiB = 256
	maxReaders     = 8
	// A checkpoint copies the WAL into the database file; SQLite runs it
	// in the commit that crosses this many pages (4 KiB each).
	walAutocheckpoint = 2000
	// After a checkpoint that resets it, the WAL file is truncated to this
	// size, so that one burst does not leave a large file behind.
	journalSizeLimit = 64 << 20
)

var errClosed = fmt.Errorf("sqlite store: %w", queuecore.ErrClosed)

// Store is a queuecore.Store in a SQLite database.
type Store struct {
	path string // of the database file
	sync queuecore.SyncMode
	log  *slog.Logger
	lock *backends.Lock

	// closeMu is held shared by every call in flight and exclusively by
	// Close, which thus waits for pending Applies and reads.
	closeMu sync.RWMutex
	closed  bool

	// Group commit (writer.go), all guarded by groupMu: the batches
	// queued for the next commit, whether a leader (or a read, or
	// takeWriter) has the writer (it then owns w and spare), and the
	// signal to takeWriter's waiters that it is free.
	groupMu       sync.Mutex
	writerFree    *sync.Cond
	writerWaiters int
	pending       []*batch
	committing    bool
	spare         []*batch
	w             *writer

	// Reads (reader.go): database/sql's pool of readers and the read
	// statements prepared on it.
	db    *sql.DB
	reads *readStmts

	// Body files (files.go): their directory, the least size of a body
	// the store has or had in a file since it was opened, and the IDs
	// whose file an Apply is writing.
	bodies    string
	fileFloor fileFloor
	writingMu sync.Mutex
	writing   map[uint64]struct{}
	// removals are the body files of deletes that wait for their sync
	// (dropFiles), and the last sync's count, guarded by mu.
	removals struct {
		mu     sync.Mutex
		synced uint64
		due    []pendingRemoval
		// kept is set by a failed sync of the WAL (syncFailed): no file
		// is removed after it, for the rest of the run.
		kept bool
	}

	config config
	anchor *anchor  // vfs.go
	lazy   lazySync // SyncFull's leases and acks (lazysync.go)
}

// config is Tuning plus what tests and benchmarks vary; Open uses the
// defaults. (The fs store has the same pair.)
type config struct {
	// plainVFS opens the database with SQLite's unix VFS, without the
	// store's VFS and anchor (vfs.go): to measure what they save. The
	// build tag yirangmq_novfs makes it the default.
	plainVFS bool
	// walAutocheckpoint replaces the constant when not 0.
	walAutocheckpoint int
	// pageSize of a new database, when not 0 (else defaultPageSize).
	pageSize int
	// fileBodies is Tuning.FileBodies.
	fileBodies int64
}

// defaultPageSize is the page size of a new database. A message operation
// writes a few pages to the WAL (its row, its index entries): with 2 KiB
// pages rather than SQLite's 4 KiB it costs some 10% less CPU and does
// some 20% more round trips per second (BenchmarkPageSize), and a row
// with a body kept inline (inlineBody) still fits in one page. An
// existing database keeps the page size it was made with.
const defaultPageSize = 2048

var _ queuecore.Store = (*Store)(nil)

// Open opens the store in directory dir, creating it if needed. It takes
// the store's lock first: if another process (or another Open in this one)
// has the store, the error wraps queuecore.ErrLocked and names the holder.
func Open(ctx context.Context, dir string, opts backends.Options) (*Store, error) {
	return open(ctx, dir, opts, defaultTuning())
}

// OpenTuned is Open with the settings of t.
func OpenTuned(ctx context.Context, dir string, opts backends.Options, t Tuning) (*Store, error) {
	tun := defaultTuning()
	tun.fileBodies = t.FileBodies
	return open(ctx, dir, opts, tun)
}

// defaultTuning is what Open uses: the build tags' choices (tags.go).
func defaultTuning() config {
	return config{plainVFS: tagNoVFS}
}

func open(ctx context.Context, dir string, opts backends.Options, tun config) (*Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("open sqlite store: %w", err)
	}
	if _, err := syncPragma(opts.Sync); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open sqlite store: %w", err)
	}
	lock, err := backends.LockStore(abs, opts.Holder)
	if err != nil {
		return nil, fmt.Errorf("open sqlite store: %w", err)
	}
	s := &Store{
		path:    filepath.Join(abs, FileName),
		sync:    opts.Sync,
		log:     opts.Log(),
		lock:    lock,
		config:  tun,
		bodies:  filepath.Join(abs, bodiesDir),
		writing: map[uint64]struct{}{},
	}
	s.writerFree = sync.NewCond(&s.groupMu)
	s.lazy.wal = s.path + "-wal"
	s.lazy.onSynced = s.synced
	s.lazy.onFailed = s.syncFailed
	s.lazy.onErr = func(err error) {
		s.log.Error("sync of the WAL after leases and acks failed; retried", queuecore.LogPath, s.path, "err", err)
	}
	if err := s.open(); err != nil {
		s.closeConns()
		lock.Unlock()
		return nil, fmt.Errorf("open sqlite store %s: %w", s.path, err)
	}
	s.log.Debug("sqlite store open", queuecore.LogPath, s.path, queuecore.LogSync, s.sync.String())
	return s, nil
}

// open opens the writer, creates or checks the schema and opens a first
// reader, so that a store that cannot be read fails here.
func (s *Store) open() error {
	if !s.config.plainVFS {
		if err := registerVFS(); err != nil {
			return err
		}
	}
	if err := privateFiles(s.path); err != nil {
		return err
	}
	c, err := openConn(s.path, s.connOpts(true))
	if err != nil {
		return err
	}
	if err := migrate(c); err != nil {
		c.Close()
		return err
	}
	if s.w, err = openWriter(c); err != nil {
		return err
	}
	s.w.fileFloor = &s.fileFloor
	if err := s.openFiles(); err != nil {
		return err
	}
	if !s.config.plainVFS {
		// After the writer: the file exists and is in WAL mode.
		if s.anchor, err = openAnchor(s.path); err != nil {
			return err
		}
	}
	if err := s.openReads(); err != nil {
		return fmt.Errorf("open readers: %w", err)
	}
	if err := s.db.Ping(); err != nil {
		return fmt.Errorf("open a reader: %w", err)
	}
	return nil
}

// connOptions are the per-connection settings.
type connOptions struct {
	writer     bool
	sync       string
	vfs        string // "" for SQLite's default
	checkpoint int    // wal_autocheckpoint of the writer
	pageSize   int    // of a new database; 0 for SQLite's default
}

func (s *Store) connOpts(writer bool) connOptions {
	p, _ := syncPragma(s.sync) // checked by Open
	o := connOptions{writer: writer, sync: p, checkpoint: walAutocheckpoint}
	if s.config.walAutocheckpoint != 0 {
		o.checkpoint = s.config.walAutocheckpoint
	}
	o.pageSize = s.config.pageSize
	if o.pageSize == 0 {
		o.pageSize = defaultPageSize
	}
	if !s.config.plainVFS {
		o.vfs = vfsName
	}
	return o
}

func syncPragma(m queuecore.SyncMode) (string, error) {
	switch m {
	case queuecore.SyncStrict:
		return "FULL", nil
	case queuecore.SyncFull:
		return "NORMAL", nil // and the store syncs the WAL (lazysync.go)
	case queuecore.SyncNormal:
		return "NORMAL", nil
	case queuecore.SyncOff:
		return "OFF", nil
	}
	return "", fmt.Errorf("open sqlite store: invalid sync mode %d", m)
}

// openConn opens one connection to the database file and applies the
// settings.
func openConn(path string, o connOptions) (*sqlite3.SQLiteConn, error) {
	// A file: URI, so that no character of the path is taken for the
	// start of go-sqlite3's options. _mutex=no: SQLite need not lock a
	// connection that this package never shares between goroutines.
	q := url.Values{"_mutex": {"no"}, "_busy_timeout": {fmt.Sprint(busyTimeout.Milliseconds())}}
	if o.vfs != "" {
		q.Set("vfs", o.vfs)
		if o.writer {
			q.Set(writerParam, "1") // keeps the WAL write lock (vfs.go)
		}
	}
	u := url.URL{Scheme: "file", Path: path, RawQuery: q.Encode()}
	dc, err := (&sqlite3.SQLiteDriver{}).Open(u.String())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	c := dc.(*sqlite3.SQLiteConn)
	pragmas := []string{
		"PRAGMA synchronous = " + o.sync,
		"PRAGMA temp_store = MEMORY",
	}
	if o.writer {
		pragmas = append(pragmas,
			fmt.Sprintf("PRAGMA cache_size = %d", -writerCacheKiB),
			"PRAGMA foreign_keys = ON",
			fmt.Sprintf("PRAGMA wal_autocheckpoint = %d", o.checkpoint),
			fmt.Sprintf("PRAGMA journal_size_limit = %d", journalSizeLimit),
		)
	} else {
		pragmas = append(pragmas,
			fmt.Sprintf("PRAGMA cache_size = %d", -readerCacheKiB),
			"PRAGMA query_only = ON",
		)
	}
	if o.writer && o.pageSize != 0 {
		if _, err := c.Exec(fmt.Sprintf("PRAGMA page_size = %d", o.pageSize), nil); err != nil {
			c.Close()
			return nil, fmt.Errorf("set page size: %w", err)
		}
	}
	if o.writer {
		// The journal mode is kept in the file; it must be in place before
		// the schema is created and before any reader opens.
		mode, err := queryValue(c, "PRAGMA journal_mode = WAL")
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("set WAL mode: %w", err)
		}
		if m, _ := mode.(string); m != "wal" {
			c.Close()
			return nil, fmt.Errorf("set WAL mode: journal mode is %v", mode)
		}
	}
	for _, p := range pragmas {
		if _, err := c.Exec(p, nil); err != nil {
			c.Close()
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	return c, nil
}

// Close waits for the Applies and reads in flight, checkpoints the WAL into
// the database file, closes the connections and releases the lock. Calls
// after Close fail with an error wrapping queuecore.ErrClosed.
func (s *Store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	// Readers first: a checkpoint cannot truncate a WAL a reader still uses.
	errs = append(errs, s.closeReads(), s.lazy.close())
	if _, err := s.w.conn.Exec("PRAGMA wal_checkpoint(TRUNCATE)", nil); err != nil {
		errs = append(errs, fmt.Errorf("checkpoint: %w", err))
	}
	errs = append(errs, s.closeConns(), s.lock.Unlock())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close sqlite store %s: %w", s.path, err)
	}
	s.log.Debug("sqlite store closed", queuecore.LogPath, s.path)
	return nil
}

// closeConns closes every connection still open. The writer goes last,
// after the anchor: as the last connection, it checkpoints the WAL into
// the database file and deletes it.
func (s *Store) closeConns() error {
	errs := []error{s.closeReads(), s.anchor.close()}
	s.anchor = nil
	if s.w != nil {
		errs = append(errs, s.w.close())
		s.w = nil
	}
	return errors.Join(errs...)
}

// privateFiles makes the database and its -wal and -shm files 0600 before
// SQLite opens them, whatever the umask and the directory's mode: they hold
// message bodies. SQLite creates a database with 0644 and gives its -wal
// and -shm the database file's mode (with fchmod, so the umask does not
// matter), so the database file is created here, empty, and every one
// already there is set to 0600.
func privateFiles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	err = f.Chmod(0o600)
	f.Close()
	if err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	for _, p := range []string{path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("chmod %s: %w", p, err)
		}
	}
	return nil
}
