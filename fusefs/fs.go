package fusefs

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"yirangmq/queuecore"
)

// Options configure a mount.
type Options struct {
	// AllowOther lets other users use the mount; the kernel then checks
	// permissions (default_permissions).
	AllowOther bool
	// EntryTimeout and AttrTimeout are how long the kernel may cache a
	// name it found and the attributes of a file. The daemon never sends
	// the kernel an entry invalidation (one can wedge a killed daemon, see
	// docs/fusefs.md), so a move the daemon makes by itself (a .next lease,
	// an expiry, the end of a backoff, retention) shows in stat(2) within
	// this time, and every operation is checked again by the daemon.
	// Names found missing are never cached.
	EntryTimeout, AttrTimeout time.Duration
	// NameTimeout is how long the kernel may keep the name of a message
	// it looked up or published. It can be longer than EntryTimeout
	// because every use of a kept name that changes something is checked
	// by the daemon: a stat asks for the attributes once AttrTimeout has
	// passed and gets ESTALE (so the kernel looks the name up again) if
	// the message is no longer there, an open is checked the same way, a
	// touch, chmod or chown through it changes nothing, a rename or an
	// unlink names the message by directory and name, and an exclusive
	// create always looks the name up. Some reads are not checked
	// (docs/fusefs.md). What a longer one saves is the LOOKUP of the
	// source of each lease of a message published more than EntryTimeout
	// before (docs/performance-history.md).
	NameTimeout time.Duration
	// MaxNextReaders caps the .next reads blocked at once; past it a read
	// fails with EBUSY. MaxNextReadersPerUID and MaxNextReadersPerQueue
	// cap them per caller uid and per queue (EBUSY too), so that one user
	// cannot take the readers of the others away.
	MaxNextReaders         int
	MaxNextReadersPerUID   int
	MaxNextReadersPerQueue int
	// MaxDraftBytes and MaxDraftBytesPerUID bound the bytes held in
	// memory for files not committed yet (being written, and drafts), in
	// all and per writer uid; past them a write fails with EDQUOT.
	MaxDraftBytes       int64
	MaxDraftBytesPerUID int64
	// DraftTTL is how long an uncommitted draft (.name in inbox/) is kept.
	DraftTTL time.Duration
	// MaxMessageInodes is how many message inodes the kernel may keep
	// (and the daemon a node for each) before it is asked to forget the
	// least recently used ones (memory.go); 0 is no limit.
	MaxMessageInodes int
	// MemoryBudget, in bytes of RSS, is where the daemon sheds its caches
	// (at 70%) and refuses new messages with ENOSPC (at 90%); 0 is none.
	MemoryBudget int64
	// FollowBudget, when set, gives the budget as it is now (three
	// quarters of the cgroup's memory limit, which `systemctl
	// set-property` or a move to another cgroup changes while the daemon
	// runs). It is asked again at most once a second, while the daemon
	// works (memory.go, followBudget); an idle daemon does not grow.
	FollowBudget func() int64
	// BudgetChanged, when set, hears of a budget that FollowBudget changed
	// (`yirangmq mount` moves the Go heap's soft limit with it).
	BudgetChanged func(budget int64)
	FsName        string // shown as the source in /proc/mounts
	Logger        *slog.Logger
	Debug         bool
	// Transport is how requests travel between the kernel and the
	// daemon: "auto" (io_uring when the kernel offers it at INIT, else
	// /dev/fuse), "uring" (FUSE over io_uring, or the mount fails) or
	// "classic" (read and write on /dev/fuse). See docs/performance.md.
	Transport string
}

// NameTimeoutFactor is how many times EntryTimeout the names of messages
// are kept by default (Options.NameTimeout; `yirangmq mount` keeps it
// with any --cache-timeout).
const NameTimeoutFactor = 10

// DefaultOptions are the options of `yirangmq mount` without flags.
func DefaultOptions() Options {
	return Options{
		EntryTimeout:           time.Second,
		AttrTimeout:            time.Second,
		NameTimeout:            NameTimeoutFactor * time.Second,
		MaxNextReaders:         1024,
		MaxNextReadersPerUID:   256,
		MaxNextReadersPerQueue: 512,
		MaxDraftBytes:          256 << 20,
		MaxDraftBytesPerUID:    64 << 20,
		DraftTTL:               time.Hour,
		FsName:                 "yirangmq",
		MaxMessageInodes:       DefaultMaxMessageInodes,
		Transport:              "auto",
	}
}

// FS is a mounted (or mountable) filesystem of queues: build it, open the
// core, then Mount.
type FS struct {
	opts Options
	log  *slog.Logger
	core *queuecore.Core
	root *rootNode
	uid  uint32 // the mounting user, owner of the root
	gid  uint32

	readers readerCount // blocked .next reads (limits.go)
	drafts  draftBytes  // bytes of uncommitted files (limits.go)

	bodyFiles bodyFileCount // body files held open for readers (bodyfiles.go)

	mu      sync.Mutex
	queueNo map[string]uint32       // queue name → number, for inode numbers
	pending map[pendingKey]*msgNode // files in inbox/ not yet committed, and drafts

	placements placements  // where the kernel last saw each message
	successors successors  // new messages that renames made of old inodes
	leasers    leasers     // who leases: /proc read once per thread (proc.go)
	onRing     atomic.Bool // requests come through io_uring (nextNode.next)

	memState // the bound on message inodes and the memory budget (memory.go)

	started time.Time
	done    chan struct{}
	wg      sync.WaitGroup
}

type pendingKey struct{ queue, name string }

// New returns an FS; call Mount once the core is open.
func New(opts Options) *FS {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	d := DefaultOptions()
	if opts.MaxNextReaders <= 0 {
		opts.MaxNextReaders = d.MaxNextReaders
	}
	if opts.MaxNextReadersPerUID <= 0 {
		opts.MaxNextReadersPerUID = d.MaxNextReadersPerUID
	}
	if opts.MaxNextReadersPerQueue <= 0 {
		opts.MaxNextReadersPerQueue = d.MaxNextReadersPerQueue
	}
	if opts.MaxDraftBytes <= 0 {
		opts.MaxDraftBytes = d.MaxDraftBytes
	}
	if opts.MaxDraftBytesPerUID <= 0 {
		opts.MaxDraftBytesPerUID = d.MaxDraftBytesPerUID
	}
	if opts.DraftTTL <= 0 {
		opts.DraftTTL = d.DraftTTL
	}
	if opts.FsName == "" {
		opts.FsName = d.FsName
	}
	f := &FS{
		opts: opts, log: opts.Logger,
		uid: uint32(os.Getuid()), gid: uint32(os.Getgid()),
		queueNo: map[string]uint32{},
		pending: map[pendingKey]*msgNode{},
		done:    make(chan struct{}),
		started: time.Now(),
	}
	f.lru.kick = make(chan struct{}, 1)
	f.memWake = make(chan struct{}, 1)
	f.successors.ttl = 2*max(opts.EntryTimeout, opts.NameTimeout, opts.AttrTimeout) + time.Second
	f.root = &rootNode{fsys: f}
	return f
}

// Mount serves core at mountpoint. The returned server is running; call
// its Unmount to stop.
func (f *FS) Mount(core *queuecore.Core, mountpoint string) (*Server, error) {
	f.core = core
	f.maxWrite = maxWriteFor(f.opts.MemoryBudget)
	f.budget.Store(f.opts.MemoryBudget)
	f.trimWrites.Store(f.maxWrite > smallMaxWrite && smallBudgetFor(f.opts.MemoryBudget))
	entry, attr, negative := f.opts.EntryTimeout, f.opts.AttrTimeout, time.Duration(0)
	transport, err := ParseTransport(f.opts.Transport)
	if err != nil {
		return nil, err
	}
	mo := fuse.MountOptions{
		FsName:        f.opts.FsName,
		Name:          "yirangmq",
		AllowOther:    f.opts.AllowOther,
		Debug:         f.opts.Debug,
		MaxBackground: 64,
		MaxWrite:      f.maxWrite,
		Transport:     transport,
		// Every blocked .next read holds a ring entry (and its worker
		// thread) until it is answered; the rest are for the requests
		// being served beside them.
		MaxRingWorkers: f.opts.MaxNextReaders + 8*runtime.NumCPU(),
		// A bug in a handler must not take the queues down: log it with
		// its stack and answer that request with EIO.
		PanicHandler: func(r any) fuse.Status {
			f.log.Error("panic in a request handler, answered EIO", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			return fuse.EIO
		},
	}
	server, err := mountServer(mountpoint, f.root, mo, &fs.Options{
		EntryTimeout: &entry,
		AttrTimeout:  &attr,
		// A name found missing is never cached: the daemon may create it
		// by itself a moment later (a .next lease puts processing/NAME in
		// place), and it cannot tell the kernel (see Options).
		NegativeTimeout: &negative,
		RootStableAttr:  &fs.StableAttr{Ino: inoRoot},
		UID:             f.uid,
		GID:             f.gid,
		// go-fuse's diagnostics (a backing file refused for passthrough,
		// an inode number overridden) are warnings in our log.
		Logger: slog.NewLogLogger(f.log.With("from", "go-fuse").Handler(), slog.LevelWarn),
	}, func() {
		f.wg.Add(2)
		go f.sweepDrafts()
		go f.prune(&f.root.Inode)
		if f.opts.MemoryBudget > 0 || f.opts.FollowBudget != nil {
			f.wg.Add(1)
			go f.watchMemory()
		}
	})
	if err != nil {
		return nil, err
	}
	tr := server.TransportInfo()
	f.onRing.Store(tr.Transport == fuse.TransportIoUring)
	f.log.Info("transport", "transport", tr.Transport.String(), "reason", tr.Reason, "queues", tr.Queues)
	return server, nil
}

// ParseTransport checks a transport's name (Options.Transport).
func ParseTransport(s string) (fuse.Transport, error) {
	t, err := fuse.ParseTransport(s)
	if err != nil {
		return t, fmt.Errorf("transport: %w", err)
	}
	return t, nil
}

// Stop ends the FS's goroutines; call after the server has unmounted.
func (f *FS) Stop() {
	select {
	case <-f.done:
	default:
		close(f.done)
	}
	f.wg.Wait()
}

// Inode numbers fit in 32 bits (docs/contract.md §2) so that 32-bit programs built
// without large-file support can stat every file:
//
//	1, 2, 3                   the root, /.stats, /.metrics
//	0x100 + 16*q + k          queue q's directory (k=0), its state
//	                          directories (k=1..5), .stats, .policy, .next
//	0x0100_0000 + id          a message, from its create to its end (the
//	                          id is reserved at create); wraps below 2^31
const (
	inoRoot      = 1
	inoRootStats = 2
	inoMetrics   = 3
	inoQueueBase = 0x100
	inoMsgBase   = 0x0100_0000
	inoMsgSpan   = 0x8000_0000 - inoMsgBase
)

const (
	kQueueDir = 0
	kStats    = 6
	kPolicy   = 7
	kNext     = 8
)

func (f *FS) queueIno(queue string, k uint32) uint64 {
	f.mu.Lock()
	n, ok := f.queueNo[queue]
	if !ok {
		n = uint32(len(f.queueNo))
		f.queueNo[queue] = n
	}
	f.mu.Unlock()
	return uint64(inoQueueBase + 16*(n%0xF_0000) + k)
}

func msgIno(id uint64) uint64 { return inoMsgBase + id%inoMsgSpan }

// sweepDrafts drops drafts left uncommitted for longer than DraftTTL.
func (f *FS) sweepDrafts() {
	defer f.wg.Done()
	t := time.NewTicker(f.opts.DraftTTL / 4)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-f.done:
			return
		}
		// Copy the files out first: a node's mutex is taken before f.mu
		// (a commit drops its file from f.pending under n.mu), never after.
		now := time.Now()
		f.mu.Lock()
		files := make(map[pendingKey]*msgNode, len(f.pending))
		for k, n := range f.pending {
			files[k] = n
		}
		f.mu.Unlock()
		var old []pendingKey
		for k, n := range files {
			if n.isStaleDraft(now, f.opts.DraftTTL) {
				f.dropPending(k.queue, k.name, n)
				old = append(old, k)
			}
		}
		for _, k := range old {
			f.log.Info("draft removed after its time to live", queuecore.LogQueue, k.queue, queuecore.LogName, k.name)
		}
	}
}

func (f *FS) pendingFile(queue, name string) *msgNode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pending[pendingKey{queue, name}]
}

// caller returns who made a request.
func caller(ctx context.Context) (uid, gid, pid uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid, c.Pid
	}
	return 0, 0, 0
}

// fillDir sets the attributes of a directory.
func fillDir(out *fuse.Attr, ino uint64, uid, gid, mode uint32, t time.Time) {
	out.Ino = ino
	out.Mode = syscall.S_IFDIR | (mode & 0o7777)
	out.Nlink = 2
	out.Uid, out.Gid = uid, gid
	out.SetTimes(&t, &t, &t)
	out.Size = 4096
	out.Blksize = 4096
}

func (f *FS) startTime() time.Time { return f.started }
