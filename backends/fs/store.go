package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/backends"
	"yirangmq/backends/fs/internal/memindex"
	"yirangmq/backends/fs/internal/spare"
	"yirangmq/queuecore"
)

var (
	_ queuecore.Store        = (*Store)(nil)
	_ queuecore.HandEdited   = (*Store)(nil)
	_ queuecore.BodyFiler    = (*Store)(nil)
	_ queuecore.CacheShedder = (*Store)(nil)
)

// Names inside the store directory.
const (
	queuesDir    = "queues"
	intentsDir   = "intents"
	trashDir     = "trash"
	lostFoundDir = "lost+found"
	formatName   = "format"
	idsName      = "ids"
	manifestName = "manifest"
	snapshotName = "snapshot" // format 1's; in format 2 a file that makes format-1 builds refuse the store
	policyName   = "policy.json"
	// tempPrefix starts the name of every file and directory the store
	// writes before renaming it into place; Open removes what a crash left.
	tempPrefix = ".yirangmq.tmp."
)

// errBadOp is the index's: one sentinel for a bad op, wherever found.
var errBadOp = memindex.ErrBadOp

// DefaultMaxMessages is Tuning.MaxMessages's default: the messages the
// store holds at most, in every queue and state together. The index keeps
// about 240 bytes of memory a message (BenchmarkMessageMemory), so this
// bounds it near 24 MiB.
const DefaultMaxMessages = 100_000

// Tuning holds the fs store's own settings.
type Tuning struct {
	// MaxMessages is the number of messages the store holds at most; an
	// insert past it fails with queuecore.ErrStoreFull (EDQUOT through the
	// mount). 0: DefaultMaxMessages.
	MaxMessages int
	// Spares is the number of empty body files kept ready (package spare):
	// 0: the default (16), negative: none (for measuring what they give).
	Spares int
}

// config holds what tests tune besides Tuning.
type config struct {
	maxMessages int
	spares      int                    // spare files kept ready: 0: spare.Count, <0: none
	fsync       func(f *os.File) error // nil: f.Sync; tests make it fail
}

// Store is the plain-directory store. See the package comment.
type Store struct {
	dir, qdir string
	opts      backends.Options
	log       *slog.Logger
	cfg       config
	lock      *backends.Lock
	// durable says whether the store syncs at all (SyncFull, SyncStrict).
	durable bool

	// mu guards the index and every change of the tree: commits hold it
	// for their renames, links and attribute writes (never for an fsync);
	// reads share it.
	mu      sync.RWMutex
	ix      *index
	idsMark uint64 // IDs and Seqs up to here are reserved in DIR/ids
	failErr error  // set once: the store refuses changes
	closed  bool
	// txns are the files whose keyTxn attribute is still on, by message
	// ID: removed once their change is durable (flush.go).
	txns   map[uint64]pendingTxn
	txnGen uint64
	// stale are the old names of moved files, kept until the new name is
	// durable (flush.go), by path, and the paths by message ID.
	stale   map[string]staleLink
	staleOf map[uint64][]string
	// rewrite are messages whose file's attributes are not what the index
	// says (found changed by hand at Open): their next update writes every
	// field.
	rewrite  map[uint64]bool
	hand     []queuecore.HandChange
	batchGen atomic.Uint64 // numbers batch directories and trashed queues
	tempGen  atomic.Uint64 // numbers temp files
	spares   *spare.Pool   // empty files made ahead for new bodies; nil: none
	full     limitLog

	inflight sync.WaitGroup // commits that have not returned
	trashWG  sync.WaitGroup // removal of deleted queues' trees
	fl       flusher
}

// staleLink is the old name of a moved message: gen tells it from a later
// old name at the same path.
type staleLink struct {
	id, gen uint64
}

// pendingTxn is a txn attribute left on a file, whose fields a flush is
// to write (finishTxns): gen tells it from a later one on the same file;
// disk are the fields the file has beside it (known false: not known, so
// every field is written).
type pendingTxn struct {
	gen   uint64
	disk  []field
	known bool
}

// Open opens (creating if needed) the store in dir, taking its lock, and
// reads the tree: see "Open" in the package comment.
func Open(ctx context.Context, dir string, opts backends.Options) (*Store, error) {
	return OpenTuned(ctx, dir, opts, Tuning{})
}

// OpenTuned is Open with Tuning.
func OpenTuned(ctx context.Context, dir string, opts backends.Options, t Tuning) (*Store, error) {
	return open(ctx, dir, opts, config{maxMessages: t.MaxMessages, spares: t.Spares})
}

func open(ctx context.Context, dir string, opts backends.Options, cfg config) (*Store, error) {
	switch opts.Sync {
	case queuecore.SyncFull, queuecore.SyncNormal, queuecore.SyncOff, queuecore.SyncStrict:
	default:
		return nil, fmt.Errorf("open fs store: sync mode %d: %w", opts.Sync, errBadOp)
	}
	if cfg.maxMessages <= 0 {
		cfg.maxMessages = DefaultMaxMessages
	}
	lock, err := backends.LockStore(dir, opts.Holder)
	if err != nil {
		return nil, err
	}
	s := &Store{
		dir:     dir,
		qdir:    filepath.Join(dir, queuesDir),
		opts:    opts,
		log:     opts.Log().With(queuecore.LogDir, dir),
		cfg:     cfg,
		lock:    lock,
		durable: opts.Sync.Durable(),
		ix:      newIndex(),
		txns:    map[uint64]pendingTxn{},
		stale:   map[string]staleLink{},
		staleOf: map[uint64][]string{},
		rewrite: map[uint64]bool{},
	}
	s.fl.init()
	if err := s.load(ctx); err != nil {
		lock.Unlock()
		return nil, fmt.Errorf("open fs store %s: %w", dir, err)
	}
	n := cfg.spares
	if n == 0 {
		n = spare.Count
	}
	if s.spares, err = spare.Start(dir, n, s.log); err != nil {
		// Publishes create their own files, as without the pool.
		s.log.Warn("no spare body files", queuecore.LogErr, err)
	}
	return s, nil
}

// Close makes every change durable, writes the manifest and releases the
// lock.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.inflight.Wait()
	s.fl.stopTimer()
	s.spares.Close()

	var errs []error
	if err := s.flushAll(); err != nil {
		errs = append(errs, err)
	}
	s.mu.RLock()
	failed := s.failErr
	s.mu.RUnlock()
	if failed == nil {
		if err := s.finishAllTxns(); err != nil {
			errs = append(errs, err)
		}
	}
	s.trashWG.Wait()
	if failed != nil {
		errs = append(errs, fmt.Errorf("close fs store %s: no manifest written, the store failed: %w", s.dir, failed))
	} else if err := s.writeManifest(); err != nil {
		errs = append(errs, fmt.Errorf("close fs store %s: %w", s.dir, err))
	}
	if err := s.lock.Unlock(); err != nil {
		errs = append(errs, fmt.Errorf("unlock: %w", err))
	}
	return errors.Join(errs...)
}

// writableLocked says whether the store takes changes.
func (s *Store) writableLocked() error {
	if s.closed {
		return fmt.Errorf("fs store %s: %w", s.dir, queuecore.ErrClosed)
	}
	if s.failErr != nil {
		return fmt.Errorf("fs store %s failed earlier: %w", s.dir, s.failErr)
	}
	return nil
}

// failLocked puts the store in the failed state: it refuses every later
// change, since what is on disk is no longer known (a failed fsync may
// have dropped pages, a batch stopped half way). The next Open finishes
// from the tree, its txn attributes and its intents.
func (s *Store) failLocked(err error) {
	if s.failErr != nil {
		return
	}
	s.failErr = err
	s.log.Error("fs store failed; it refuses changes until reopened", queuecore.LogErr, err)
}

// Queues lists every queue by name.
func (s *Store) Queues(ctx context.Context) ([]queuecore.QueueInfo, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ix.QueueInfos(), nil
}

// Lookup finds a queue's live or archived message by name.
func (s *Store) Lookup(ctx context.Context, queue, name string, archived bool) (queuecore.Message, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if q := s.ix.Queues[queue]; q != nil {
		if e := q.Named(name, archived); e != nil {
			return e.Message(), nil
		}
	}
	return queuecore.Message{}, fmt.Errorf("message %q in queue %q: %w", name, queue, queuecore.ErrNotFound)
}

// List calls fn with the messages of a queue in one state, in (SortKey,
// Seq) order. It walks a copy of the state, so fn runs without a lock.
func (s *Store) List(ctx context.Context, queue string, state queuecore.State, fn func(queuecore.Message) bool) error {
	return s.ix.List(&s.mu, queue, state, fn)
}

// Due returns up to limit leased or delayed messages due at t, earliest
// first.
func (s *Store) Due(ctx context.Context, t time.Time, limit int) ([]queuecore.Message, error) {
	limit = max(limit, 0)
	until := backends.Nanos(t)
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []queuecore.Message
	s.ix.Due.Ascend(func(e *entry) bool {
		if len(out) >= limit || e.Key > until {
			return false
		}
		out = append(out, e.Message())
		return true
	})
	return out, nil
}

// NextDue is the earliest deadline of a leased or delayed message.
func (s *Store) NextDue(ctx context.Context) (time.Time, bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.ix.Due.Min()
	if !ok {
		return time.Time{}, false, nil
	}
	return e.Deadline(), true, nil
}

// Counts returns the number and bytes of messages per queue and state;
// every queue is present, states without messages are left out.
func (s *Store) Counts(ctx context.Context) (map[string]map[queuecore.State]queuecore.Count, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]map[queuecore.State]queuecore.Count, len(s.ix.Queues))
	for name, q := range s.ix.Queues {
		byState := map[queuecore.State]queuecore.Count{}
		for _, st := range queuecore.States {
			if c := q.Counts[st]; c != (queuecore.Count{}) {
				byState[st] = c
			}
		}
		out[name] = byState
	}
	return out, nil
}

// MaxID is the largest ID or Seq the store has been given, or reserved
// (DIR/ids), whichever is larger.
func (s *Store) MaxID(ctx context.Context) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return max(s.ix.MaxID, s.idsMark), nil
}

// HandChanges returns what Open found changed by hand in the tree, for
// the queue core to apply once (queuecore.HandEdited).
func (s *Store) HandChanges() []queuecore.HandChange {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hand
	s.hand = nil
	return h
}

// ShedCaches does nothing: the index is the store's only copy of the
// metadata it serves, and the kernel's page cache is the kernel's.
func (s *Store) ShedCaches() {}

// bodyPath is where the body of a message in queue q, state st, named name
// lives.
func (s *Store) bodyPath(q string, st queuecore.State, name string) string {
	return s.qdir + "/" + q + "/" + st.Dir() + "/" + name
}

func (s *Store) entryPath(e *entry) string { return s.bodyPath(e.Q.Name, e.State, e.Name()) }

// bodyRetries is how often a read looks the path up again when the file
// moved between the look-up and the open (a lease renames it).
const bodyRetries = 4

// openBody opens the body file of message id read-only, checked to be a
// regular file of the size the index has.
func (s *Store) openBody(id uint64) (*os.File, error) {
	for try := 0; ; try++ {
		s.mu.RLock()
		e := s.ix.ByID[id]
		var p string
		var size int64
		if e != nil {
			p, size = s.entryPath(e), e.Size
		}
		s.mu.RUnlock()
		if e == nil {
			return nil, fmt.Errorf("body of message %d: %w", id, queuecore.ErrNotFound)
		}
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if errors.Is(err, os.ErrNotExist) && try < bodyRetries {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("body of message %d: %w", id, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			f.Close()
			return nil, fmt.Errorf("body of message %d: %w", id, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size {
			f.Close()
			return nil, fmt.Errorf("body of message %d: %s is not its body file (mode %o, %d bytes, want %d): changed outside the daemon", id, p, st.Mode, st.Size, size)
		}
		return f, nil
	}
}

// Body returns the body of message id.
func (s *Store) Body(ctx context.Context, id uint64) ([]byte, error) {
	f, err := s.openBody(id)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("body of message %d: %w", id, err)
	}
	return b, nil
}

// BodyFile opens the body file of message id read-only, for a reader that
// reads it in place (queuecore.BodyFiler). Body files are written whole to
// a temp file and renamed into place, and never written again by the
// daemon, so the bytes behind the descriptor stay the message's whatever
// happens to the name afterwards.
func (s *Store) BodyFile(ctx context.Context, id uint64) (*os.File, error) {
	return s.openBody(id)
}

// limitLog says a refusal at most once a minute, with a count.
type limitLog struct {
	mu      sync.Mutex
	last    time.Time
	skipped int
}

func (l *limitLog) allow(now time.Time) (ok bool, skipped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.last) < time.Minute {
		l.skipped++
		return false, 0
	}
	l.last, skipped, l.skipped = now, l.skipped, 0
	return true, skipped
}
