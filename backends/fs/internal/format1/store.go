package format1

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"yirangmq/backends"
	"yirangmq/backends/fs/internal/memindex"
	"yirangmq/backends/fs/internal/spare"
	"yirangmq/queuecore"
)

// Names inside the store directory.
const (
	queuesDir      = "queues"
	trashDir       = "trash"
	lostFoundDir   = "lost+found"
	snapshotName   = "snapshot"
	journalName    = "journal"
	oldJournalName = "journal.old"
	tempPrefix     = "." // temp files start with a dot, which no message name does
	idXattr        = "user.yirangmq.id"
)

// Log keys.
const (
	logDir      = "dir"
	logPath     = "path"
	logFrom     = "from"
	logTo       = "to"
	logID       = "id"
	logErr      = "err"
	logCount    = "count"
	logBytes    = "bytes"
	logLSN      = "lsn"
	logAfterLSN = "after_lsn"
	logQueue    = "queue"
	logJournal  = "journal"
	logOffset   = "offset"
	logTook     = "took"
	logSkipped  = "skipped"
	logTorn     = "torn_tails"
)

// defaultCheckpointBytes is the least journal size that triggers a
// checkpoint; a larger snapshot raises it, so that writing snapshots costs
// at most as much as the journal they replace.
const defaultCheckpointBytes = 16 << 20

// errBadOp is the index's: one sentinel for a bad op, wherever found.
// errBadOp is the index's: one sentinel for a bad op, wherever found.
var errBadOp = memindex.ErrBadOp

// config holds what tests tune.
type config struct {
	checkpointBytes int64
	spillAt         int                // ready messages per queue before newer ones spill; 0: defaultSpillAt, <0: never
	fdatasync       func(fd int) error // nil: unix.Fdatasync; tests make it fail
	maxDirtyMoves   int                // 0: maxDirtyMoves; tests make it small
	spillTrimAt     int                // 0: defaultSpillTrimAt; tests make it small
	stageAt         int                // bodies of this size or more are staged (staged.go); 0 or less: none
	spares          int                // spare files kept ready (package spare); 0: spare.Count, <0: none
	noLock          bool               // the caller holds the store's lock (Export)
}

func (s *Store) fdatasync(f *os.File) error {
	if s.cfg.fdatasync != nil {
		return s.cfg.fdatasync(int(f.Fd()))
	}
	return unix.Fdatasync(int(f.Fd()))
}

// Store is the plain-directory store. See the package comment.
type Store struct {
	dir  string
	qdir string // dir/queues
	opts backends.Options
	log  *slog.Logger
	cfg  config
	lock *backends.Lock

	// mu guards the index and everything below up to the next comment.
	// Commits hold it to validate, apply and append; reads share it.
	mu          sync.RWMutex
	ix          *index
	lsn         uint64                  // of the last committed record
	pending     []pendingRecord         // committed records whose file operations are not done, in order
	unwritten   map[uint64]*pendingBody // bodies whose file is not written yet
	busy        map[uint64]int32        // file operations not done, per message
	progress    chan struct{}           // closed and replaced whenever file operations progress
	failErr     error                   // set once: the store refuses changes
	closed      bool
	sinceCkpt   int64 // journal bytes since the last rotation
	ckptAt      int64 // sinceCkpt that triggers a checkpoint
	ckptRunning bool
	inflight    sync.WaitGroup // commits that have not returned
	// stalled is set while file operations wait for space (runFileOps);
	// held is a checkpoint that rotated the journal but could not finish
	// for lack of space: Close tries to finish it.
	stalled bool
	held    *heldCheckpoint

	cur     atomic.Pointer[journal] // the journal appended to; replaced under mu
	written atomic.Int64            // logical end of what has been written to the journal
	synced  atomic.Int64            // logical end of what is durable in the store's SyncMode
	syncMu  sync.Mutex              // held by the group-commit leader while it syncs
	fsyncs  atomic.Int64            // journal fdatasyncs done by commits (for tests and benchmarks)

	// fileMu orders file operations: held for writing while they are done,
	// for reading while Body reads a file, so that a body file is not moved
	// between finding its path and opening it.
	fileMu  sync.RWMutex
	applied int64 // logical position up to which file operations are done
	// placed are the staged bodies linked where their message is, whose
	// staged names wait for a snapshot that holds their record (staged.go).
	placed []placedBody

	spares  *spare.Pool    // empty files for new bodies; nil: none
	bg      sync.WaitGroup // background checkpoint
	trashWG sync.WaitGroup // removal of deleted queues' trees
	noXattr atomic.Bool    // the file system refused user xattrs
	// stagedDirty is set when a body is staged, cleared when DIR/staged
	// is synced (syncStagedLocked).
	stagedDirty atomic.Bool
	dirty       dirtySet // files and directories to fsync at the next checkpoint
}

func open(ctx context.Context, dir string, opts backends.Options, cfg config) (*Store, error) {
	switch opts.Sync {
	case queuecore.SyncFull, queuecore.SyncNormal, queuecore.SyncOff, queuecore.SyncStrict:
	default:
		return nil, fmt.Errorf("open fs store: sync mode %d: %w", opts.Sync, errBadOp)
	}
	var lock *backends.Lock
	if !cfg.noLock {
		var err error
		if lock, err = backends.LockStore(dir, opts.Holder); err != nil {
			return nil, err
		}
	}
	s := &Store{
		dir:       dir,
		qdir:      filepath.Join(dir, queuesDir),
		opts:      opts,
		log:       opts.Log().With(logDir, dir),
		cfg:       cfg,
		lock:      lock,
		ix:        newIndex(),
		unwritten: map[uint64]*pendingBody{},
		busy:      map[uint64]int32{},
		progress:  make(chan struct{}),
		ckptAt:    cfg.checkpointBytes,
	}
	s.dirty.freshAfter = math.MaxUint64 // every move kept until Open ends (dirtySet)
	s.dirty.maxMoves = cmp.Or(cfg.maxDirtyMoves, maxDirtyMoves)
	s.ix.spillAt = cfg.spillAt
	if s.ix.spillAt == 0 {
		s.ix.spillAt = defaultSpillAt
	}
	s.ix.spillKeep = spillKeepFor(s.ix.spillAt)
	s.ix.spillBatch = spillBatchFor(s.ix.spillKeep)
	s.ix.spillTrim = cmp.Or(cfg.spillTrimAt, defaultSpillTrimAt)
	s.ix.spillDir = filepath.Join(dir, spillDir)
	s.ix.spillLog = func(msg string, err error) { s.log.Warn(msg, logErr, err) }
	if err := s.recover(ctx); err != nil {
		if j := s.cur.Load(); j != nil {
			j.f.Close()
		}
		lock.Unlock()
		return nil, fmt.Errorf("open fs store %s: %w", dir, err)
	}
	s.dirty.opened(s.ix.MaxID)
	n := cmp.Or(cfg.spares, spare.Count)
	var err error
	if s.spares, err = spare.Start(dir, n, s.log); err != nil {
		// Publishes create their own files, as without the pool.
		s.log.Warn("no spare body files", logErr, err)
	}
	return s, nil
}

// Close finishes pending commits, checkpoints and releases the lock.
func (s *Store) Close() error {
	s.flushLazy() // the leases and acks not synced yet, and their files
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.inflight.Wait()
	s.bg.Wait()

	var errs []error
	s.mu.RLock()
	failed, dirty, held := s.failErr, s.sinceCkpt > 0, s.held
	s.mu.RUnlock()
	if failed != nil {
		errs = append(errs, fmt.Errorf("close fs store %s: not checkpointed, the store failed: %w", s.dir, failed))
	} else {
		var err error
		if held != nil {
			err = s.finishCheckpoint(held.start, held.old, held.img)
		}
		if err == nil && dirty {
			err = s.checkpoint()
		}
		if err != nil {
			// A full disk: the journals stay for the next Open to replay.
			errs = append(errs, fmt.Errorf("close fs store %s: %w", s.dir, err))
		}
	}
	s.mu.RLock()
	held = s.held
	s.mu.RUnlock()
	if held != nil {
		_ = held.old.f.Close()
		held.img.release()
	}
	s.trashWG.Wait()
	s.spares.Close() // after the checkpoint, whose file operations may take one
	if j := s.cur.Load(); j != nil {
		if err := j.f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close journal: %w", err))
		}
	}
	if err := s.lock.Unlock(); err != nil {
		errs = append(errs, fmt.Errorf("unlock: %w", err))
	}
	return errors.Join(errs...)
}

// failLocked puts the store in the failed state: it refuses every later
// change, since what is on disk is no longer known (a failed fsync may
// have dropped pages). The next Open repairs from the journal.
func (s *Store) failLocked(err error) {
	if s.failErr != nil {
		return
	}
	s.failErr = err
	s.log.Error("fs store failed; it refuses changes until reopened", logErr, err)
	close(s.progress)
	s.progress = make(chan struct{})
}

func (s *Store) failure() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.failErr
}

// Queues lists every queue by name.
func (s *Store) Queues(ctx context.Context) ([]queuecore.QueueInfo, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ix.QueueInfos(), nil
}

// List calls fn with the messages of a queue in one state, in (SortKey,
// Seq) order. It walks a snapshot of the state, so fn runs without a lock;
// a queue's ready messages are merged with those of its spill.
func (s *Store) List(ctx context.Context, queue string, state queuecore.State, fn func(queuecore.Message) bool) error {
	if state == queuecore.StateReady {
		s.mu.RLock()
		q := s.ix.Queues[queue]
		spilled := q != nil && q.Ext.spill != nil
		s.mu.RUnlock()
		if spilled {
			return s.listSpilled(ctx, queue, fn)
		}
	}
	return s.ix.List(&s.mu, queue, state, fn)
}

// MaxID is the largest ID or Seq the store has been given.
func (s *Store) MaxID(ctx context.Context) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ix.MaxID, nil
}

// bodyPath is where the body of a message in queue q, state st, named name
// lives.
func (s *Store) bodyPath(q string, st queuecore.State, name string) string {
	return s.qdir + "/" + q + "/" + st.Dir() + "/" + name
}

func (s *Store) entryPath(e *entry) string { return s.bodyPath(e.Q.Name, e.State, e.Name()) }
