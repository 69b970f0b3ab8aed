package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	sdnotify "github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"yirangmq/backends/disk"
	"yirangmq/backends/fs"
	"yirangmq/fusefs"
	"yirangmq/queuecore"
)

// mountFlags is the command line of `yirangmq mount`, with its -o options
// applied; every flag lives here.
type mountFlags struct {
	backend, store, sync, logFormat string
	logFile                         string
	minFree                         string
	logMaxSize                      string
	options                         []string
	allowOther                      bool // -o allow_other
	daemon, debug                   bool
	entryTimeout                    time.Duration
	memoryBudget                    string
	maxMessageInodes                int
	cpuProfile                      string
	sqliteFileBodies                string
	fsMaxMessages                   int
	fsSpares                        int // hidden: for measuring what the fs store's spare files give (-1: none)
	transport                       string
	fsStageBodies, fsSpillAt        string // ignored: settings of the fs store's format 1
	// limits for several users on one mount (docs/multiuser.md)
	nextReaders, nextReadersPerUID, nextReadersPerQueue int
	draftMiB, draftMiBPerUID                            int64
}

// mountSettings is what the flags say, read and checked.
type mountSettings struct {
	store            storeSpec
	minFree, logMax  int64
	budget, cgLimit  int64 // the memory budget, and the cgroup limit it came from
	followBudget     bool  // --memory-budget auto: the budget follows the cgroup's limit
	maxMessageInodes int
}

// runMount is `yirangmq mount`. A mount started by --daemon (or by the
// test harness) that fails says why on its ready pipe: its parent prints
// that, since the child's stderr goes nowhere.
func runMount(ctx context.Context, env *cliEnv, args []string) error {
	err := mount(ctx, env, args)
	if err != nil && !errors.Is(err, errUsage) {
		signalFailed(err)
	}
	return err
}

// mount reads the command line, then opens the log, the store, the core
// and the mount in that order, and serves until asked to stop; whatever
// fails undoes what came before it.
func mount(ctx context.Context, env *cliEnv, args []string) (err error) {
	fl := pflag.NewFlagSet("mount", pflag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintln(fl.Output(), "Usage: yirangmq mount [OPTIONS] MOUNTPOINT\n\nMounts a store as a filesystem of queues; stays in the foreground until\nSIGTERM or SIGINT, which unmount cleanly (or returns once ready with --daemon).\n\nOptions:")
		printOptions(fl)
	}
	var f mountFlags
	f.define(fl)
	if ok, err := parseFlags(env, fl, args); !ok {
		return err
	}
	if fl.NArg() != 1 {
		fmt.Fprintln(env.stderr, "yirangmq mount: exactly one MOUNTPOINT is needed (see yirangmq mount --help)")
		return errUsage
	}
	mountpoint, err := filepath.Abs(fl.Arg(0))
	if err != nil {
		return err
	}
	if err := f.applyOptions(env); err != nil {
		return err
	}
	set, err := f.settings()
	if err != nil {
		return err
	}
	if f.daemon {
		return startDaemon(ctx, env, args, f.daemonLog())
	}
	// A mount that fails leaves nothing in the store (the log file of
	// --daemon, which lives there, included: its error reached the parent
	// through the ready pipe).
	trace := traceStore(f.backend, f.store, f.logFile)
	opened := false
	defer func() {
		if err != nil {
			trace.undo(opened)
		}
	}()
	log, closeLog, err := f.openLog(env, set.logMax)
	if err != nil {
		return err
	}
	defer closeLog()
	if f.cpuProfile != "" {
		stop, err := startProfiles(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	store, err := openForMount(ctx, set.store, mountpoint, log)
	if err != nil {
		return err
	}
	opened = true
	defer store.Close()
	fsys := fusefs.New(f.fuseOptions(set, store, log))
	var storeDisk queuecore.Disk
	if f.backend != "postgres" { // else the database server's disk: see docs/operations.md
		storeDisk = disk.New(f.store)
	}
	shown := displayStore(f.backend, f.store)
	core, err := queuecore.Open(ctx, store, queuecore.Options{
		Logger: log, Backend: f.backend, StorePath: shown, Version: version,
		Disk: storeDisk, MinFree: set.minFree,
	})
	if err != nil {
		return err
	}
	defer core.Close()
	server, err := fsys.Mount(core, mountpoint)
	if err != nil {
		return err
	}
	defer fsys.Stop()
	log.Info("mounted", queuecore.LogMountpoint, mountpoint, "backend", f.backend, "store", shown, "sync", f.sync, "allow_other", f.allowOther, "min_free", f.minFree, "pid", os.Getpid())
	serve(ctx, server, mountpoint, log)
	return nil
}

// daemonLog is the log file of a daemon started with --daemon: --log-file,
// or yirangmq.log in the store's directory.
func (f *mountFlags) daemonLog() string {
	if f.logFile != "" {
		return f.logFile
	}
	dir := f.store
	if f.backend == "postgres" {
		dir = defaultStore() // the store is no directory
	}
	return filepath.Join(dir, "yirangmq.log")
}

// define declares the flags of `yirangmq mount` on fl.
func (f *mountFlags) define(fl *pflag.FlagSet) {
	fl.StringVar(&f.backend, "backend", "sqlite", "store backend: sqlite, fs or postgres")
	fl.StringVar(&f.store, "store", defaultStore(), "store directory (created on first use), or with --backend postgres a connection URL")
	fl.StringVar(&f.sync, "sync", "full", "durability: full (a message on disk at close; leases and acks within 100 ms), strict (leases and acks on disk too before they return), normal (survives a daemon crash) or off")
	fl.StringSliceVarP(&f.options, "options", "o", nil, "mount options: allow_other, backend=, sync=, store=, min_free=, memory_budget=, max_message_inodes=, sqlite_file_bodies=, fs_max_messages=, transport= (others of mount(8) are accepted and ignored)")
	fl.BoolVar(&f.daemon, "daemon", false, "return once the mount is ready, leaving the daemon in the background")
	fl.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fl.StringVar(&f.logFile, "log-file", "", "append the log to this file instead of stderr (with --daemon: STORE/yirangmq.log by default)")
	fl.StringVar(&f.minFree, "min-free", "auto", "free space to keep on the store's filesystem: below it publishes fail with ENOSPC, consumers go on (SIZE like 64M, 0 for none; auto: a tenth of the filesystem, 2M to 64M)")
	fl.StringVar(&f.logMaxSize, "log-max-size", "10M", "with --log-file: move the log to FILE.1 at this size (0: never, for logrotate)")
	fl.BoolVar(&f.debug, "debug", false, "log every FUSE request")
	fl.DurationVar(&f.entryTimeout, "cache-timeout", time.Second, "how long the kernel may cache attributes and the names of directories (the names of messages: 10 times as long, every use checked by the daemon)")
	lim := fusefs.DefaultOptions()
	fl.IntVar(&f.nextReaders, "max-next-readers", lim.MaxNextReaders, "blocked .next reads at once, in all (past it: EBUSY)")
	fl.IntVar(&f.nextReadersPerUID, "max-next-readers-per-uid", lim.MaxNextReadersPerUID, "blocked .next reads at once per caller uid")
	fl.IntVar(&f.nextReadersPerQueue, "max-next-readers-per-queue", lim.MaxNextReadersPerQueue, "blocked .next reads at once per queue")
	fl.Int64Var(&f.draftMiB, "max-draft-mib", lim.MaxDraftBytes>>20, "MiB held for files not committed yet, in all (past it a write fails with EDQUOT)")
	fl.Int64Var(&f.draftMiBPerUID, "max-draft-mib-per-uid", lim.MaxDraftBytesPerUID>>20, "MiB held for files not committed yet, per writer uid")
	fl.StringVar(&f.memoryBudget, "memory-budget", "auto", "RSS at which the daemon sheds caches (70%) and refuses new messages with ENOSPC (90%): a size (48MiB), off, or auto (3/4 of the cgroup's memory limit; off without one)")
	fl.StringVar(&f.sqliteFileBodies, "sqlite-file-bodies", "256K", "with --backend sqlite: bodies of this SIZE or more are kept in files of their own (STORE/bodies/), which readers read in place; 0: none, every body in the database file")
	fl.IntVar(&f.fsMaxMessages, "fs-max-messages", fs.DefaultMaxMessages, "with --backend fs: messages the store holds at most, in every queue and state (past it a publish fails with EDQUOT); the daemon keeps about 240 bytes of memory per message")
	fl.IntVar(&f.fsSpares, "fs-spares", 0, "")
	_ = fl.MarkHidden("fs-spares")
	// Settings of the fs store's format 1, which earlier builds wrote:
	// accepted so that old command lines and fstab entries still mount.
	fl.StringVar(&f.fsStageBodies, "fs-stage-bodies", "", "")
	fl.StringVar(&f.fsSpillAt, "fs-spill-at", "", "")
	_ = fl.MarkDeprecated("fs-stage-bodies", "the fs store stages no bodies since format 2: ignored")
	_ = fl.MarkDeprecated("fs-spill-at", "the fs store spills no ready messages since format 2 (see --fs-max-messages): ignored")
	fl.StringVar(&f.transport, "transport", lim.Transport, "how requests travel between the kernel and the daemon: auto (FUSE over io_uring when the kernel offers it, else /dev/fuse), uring (or fail) or classic (docs/performance.md)")
	fl.IntVar(&f.maxMessageInodes, "max-message-inodes", fusefs.DefaultMaxMessageInodes, "message inodes the kernel may cache before it is asked to forget the least recently used (0: no limit)")
	// For measuring the daemon: a CPU profile to FILE, and the
	// allocations to FILE.allocs, written at unmount.
	fl.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile to FILE (and allocations to FILE.allocs)")
	_ = fl.MarkHidden("cpuprofile")
}

// applyOptions applies the -o options (from the command line, or from
// /etc/fstab through the mount(8) helper) over the flags.
func (f *mountFlags) applyOptions(env *cliEnv) error {
	for _, o := range f.options {
		k, v, _ := strings.Cut(strings.TrimSpace(o), "=")
		switch k {
		case "allow_other":
			f.allowOther = true
		case "backend":
			f.backend = v
		case "sync":
			f.sync = v
		case "store":
			f.store = v
		case "min_free":
			f.minFree = v
		case "memory_budget":
			f.memoryBudget = v
		case "sqlite_file_bodies":
			f.sqliteFileBodies = v
		case "fs_stage_bodies", "fs_spill_at":
			fmt.Fprintf(env.stderr, "yirangmq mount: option %s is ignored: the fs store has no such setting since format 2\n", k)
		case "fs_max_messages":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("mount option %q: want a number of messages", o)
			}
			f.fsMaxMessages = n
		case "transport":
			f.transport = v
		case "max_message_inodes":
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("mount option %q: want a number", o)
			}
			f.maxMessageInodes = n
		case "", "rw", "defaults", "nofail", "auto", "noauto", "user", "users", "_netdev", "nodev", "nosuid", "noexec", "dev", "suid", "exec", "default_permissions":
		default:
			if !strings.HasPrefix(k, "x-") && !strings.HasPrefix(k, "comment") {
				return fmt.Errorf("unknown mount option %q", o)
			}
		}
	}
	return nil
}

// settings reads and checks the flags' values, before anything is made.
func (f *mountFlags) settings() (mountSettings, error) {
	set := mountSettings{store: storeSpec{backend: f.backend, dir: f.store, fsMaxMessages: f.fsMaxMessages, fsSpares: f.fsSpares}}
	var err error
	if set.store.sync, err = queuecore.ParseSyncMode(f.sync); err != nil {
		return set, err
	}
	if _, err := fusefs.ParseTransport(f.transport); err != nil {
		return set, err
	}
	if set.minFree, err = parseMinFree(f.minFree); err != nil {
		return set, err
	}
	if set.logMax, err = parseSize(f.logMaxSize); err != nil {
		return set, fmt.Errorf("--log-max-size: %w", err)
	}
	if set.store.sqliteFileBodies, err = parseSize(f.sqliteFileBodies); err != nil {
		return set, fmt.Errorf("--sqlite-file-bodies: %w", err)
	}
	if set.store.sqliteFileBodies == 0 {
		set.store.sqliteFileBodies = -1 // never
	}
	if f.fsMaxMessages < 0 {
		return set, fmt.Errorf("--fs-max-messages %d: want 0 (the default) or more", f.fsMaxMessages)
	}
	if set.budget, set.cgLimit, err = parseMemoryBudget(f.memoryBudget); err != nil {
		return set, err
	}
	set.followBudget = isAutoBudget(f.memoryBudget)
	if f.maxMessageInodes < 0 {
		return set, fmt.Errorf("--max-message-inodes %d: want 0 (no limit) or more", f.maxMessageInodes)
	}
	set.maxMessageInodes = f.maxMessageInodes
	return set, nil
}

// openLog makes the daemon's logger, on --log-file or stderr; closeLog
// closes the file.
func (f *mountFlags) openLog(env *cliEnv, logMax int64) (log *slog.Logger, closeLog func(), err error) {
	logOut, closeLog := env.stderr, func() {}
	if f.logFile != "" {
		if err := os.MkdirAll(filepath.Dir(f.logFile), 0o700); err != nil {
			return nil, nil, err
		}
		lf, err := openLogFile(f.logFile, logMax)
		if err != nil {
			return nil, nil, fmt.Errorf("open log file: %w", err)
		}
		logOut, closeLog = lf, func() { lf.Close() }
	}
	log, err = newLogger(logOut, f.logFormat, f.debug)
	if err != nil {
		closeLog()
		return nil, nil, err
	}
	return log, closeLog, nil
}

// openForMount opens the store for a mount at mountpoint: once a dead
// mount left there by a killed daemon is detached (whose daemon may still
// hold the store's lock for a moment while it exits) and the mountpoint
// is known to be usable, so that a mount that cannot happen does not make
// the store (or its space reserve) first.
func openForMount(ctx context.Context, spec storeSpec, mountpoint string, log *slog.Logger) (queuecore.Store, error) {
	aborted, err := recoverMountpoint(mountpoint, log)
	if err != nil {
		return nil, err
	}
	if err := checkMountpoint(mountpoint); err != nil {
		return nil, err
	}
	holder := "mount " + mountpoint
	store, err := openStore(ctx, spec, holder, log)
	for wait := 0; aborted && errors.Is(err, queuecore.ErrLocked) && wait < 50; wait++ {
		time.Sleep(100 * time.Millisecond) // the aborted daemon is still exiting
		store, err = openStore(ctx, spec, holder, log)
	}
	return store, err
}

// fuseOptions is the filesystem's configuration from the flags; with a
// memory budget it also sets the Go heap's limit under it, and starts the
// collector that returns memory to the system when the daemon goes idle.
func (f *mountFlags) fuseOptions(set mountSettings, store queuecore.Store, log *slog.Logger) fusefs.Options {
	opts := fusefs.DefaultOptions()
	opts.AllowOther, opts.Debug, opts.Logger = f.allowOther, f.debug, log
	opts.EntryTimeout, opts.AttrTimeout = f.entryTimeout, f.entryTimeout
	opts.NameTimeout = fusefs.NameTimeoutFactor * f.entryTimeout
	opts.MaxNextReaders, opts.MaxNextReadersPerUID, opts.MaxNextReadersPerQueue = f.nextReaders, f.nextReadersPerUID, f.nextReadersPerQueue
	opts.MaxDraftBytes, opts.MaxDraftBytesPerUID = f.draftMiB<<20, f.draftMiBPerUID<<20
	opts.FsName = displayStore(f.backend, f.store)
	opts.MaxMessageInodes, opts.MemoryBudget = set.maxMessageInodes, set.budget
	opts.Transport = f.transport
	if set.budget > 0 {
		debug.SetMemoryLimit(heapLimit(set.budget))
		log.Info("memory budget", "budget_mib", set.budget>>20, "cgroup_limit_mib", set.cgLimit>>20)
	}
	var release func()
	if sh, ok := store.(queuecore.CacheShedder); ok {
		release = sh.ShedCaches
	}
	gc := startQuietGC(log, release)
	if set.followBudget {
		// The limit changes while the daemon runs (systemctl
		// set-property MemoryMax=, a move to another cgroup): follow it.
		opts.FollowBudget = autoMemoryBudget
		opts.BudgetChanged = func(b int64) { gc.setMemoryLimit(heapLimit(b)) }
	}
	return opts
}

// serve tells whoever started the daemon (the ready pipe, systemd) that
// the mount serves, then waits for SIGTERM or SIGINT (ctx), which
// unmount, or for an umount from outside.
func serve(ctx context.Context, server *fusefs.Server, mountpoint string, log *slog.Logger) {
	conn := ""
	if info, ok, _ := fusefs.LookupMount(mountpoint); ok {
		conn = info.Conn // for stopServing
	}
	signalReady()
	// systemd (Type=notify): ready only once the mount serves.
	if _, err := sdnotify.SdNotify(false, sdnotify.SdNotifyReady+"\nSTATUS=serving "+mountpoint); err != nil {
		log.Warn("tell systemd we are ready", queuecore.LogErr, err)
	}
	served := make(chan struct{})
	go func() {
		server.Wait()
		close(served)
	}()
	select {
	case <-ctx.Done():
		_, _ = sdnotify.SdNotify(false, sdnotify.SdNotifyStopping)
		log.Info("unmounting", "mountpoint", mountpoint)
		if err := server.Unmount(); err != nil {
			log.Warn("unmount failed, detaching lazily", queuecore.LogMountpoint, mountpoint, queuecore.LogErr, err)
			_ = unix.Unmount(mountpoint, unix.MNT_DETACH)
		}
		stopServing(served, conn, mountpoint, log)
	case <-served:
		log.Info("unmounted by umount", "mountpoint", mountpoint)
	}
	log.Info("stopped", "mountpoint", mountpoint)
}

// stopGrace is how long a daemon asked to stop waits for the kernel to
// let go of its mount after unmounting it, before it looks why not.
const stopGrace = 5 * time.Second

// stopServing waits, once the daemon has unmounted its mount, for the
// kernel to let go of the connection (served closes). A mount detached
// lazily while busy is let go when its last user leaves: that is waited
// for. One that another mount namespace holds (a container, unshare -m,
// a service with PrivateTmp= started while it was mounted) is never let
// go while that namespace lives: asked to stop, the daemon stops, by
// aborting the connection, and that copy then fails with ENOTCONN.
func stopServing(served <-chan struct{}, conn, mountpoint string, log *slog.Logger) {
	for {
		select {
		case <-served:
			return
		case <-time.After(stopGrace):
		}
		if holders := mountHolders(conn); len(holders) > 0 {
			log.Warn("the mount is still held in another mount namespace: aborting its connection to stop",
				queuecore.LogMountpoint, mountpoint, "fuse_connection", conn, "holder_pid", holders[0].pid, "holder_comm", holders[0].comm,
				queuecore.LogErr, fusefs.AbortConnection(conn))
			<-served
			return
		}
	}
}

// startProfiles starts a CPU profile to path; stop ends it and writes the
// allocation profile to path.allocs.
func startProfiles(path string) (stop func(), err error) {
	pf, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		pf.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		pf.Close()
		if af, err := os.Create(path + ".allocs"); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(af, 0)
			af.Close()
		}
	}, nil
}

// checkMountpoint makes sure there is a directory to mount on.
func checkMountpoint(mountpoint string) error {
	fi, err := os.Stat(mountpoint)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("mountpoint %s does not exist (mkdir it first)", mountpoint)
	case err != nil:
		return fmt.Errorf("mountpoint %s: %w", mountpoint, err)
	case !fi.IsDir():
		return fmt.Errorf("mountpoint %s is not a directory", mountpoint)
	}
	return nil
}

// storeTrace is what a store directory held before a mount, so that a
// mount that fails can take away what it made: the whole directory when
// it made it, else the space reserve and an empty log file when it made
// those.
type storeTrace struct {
	dir        string // "" for a store that is no directory (postgres)
	newDir     bool
	hadReserve bool
	logFile    string // "" when it existed before (or the log is stderr)
}

func traceStore(backend, dir, logFile string) storeTrace {
	var s storeTrace
	if logFile != "" {
		if _, err := os.Lstat(logFile); errors.Is(err, os.ErrNotExist) {
			s.logFile = logFile
		}
	}
	if backend == "postgres" || dir == "" {
		return s
	}
	_, err := os.Lstat(dir)
	_, rerr := os.Lstat(filepath.Join(dir, disk.ReserveName))
	s.dir, s.newDir, s.hadReserve = dir, errors.Is(err, os.ErrNotExist), rerr == nil
	return s
}

// undo removes what a failed mount made; opened says whether it had
// opened the store (and so held it: a store that another daemon holds is
// left alone). A log file that got lines stays: they may say more.
func (s storeTrace) undo(opened bool) {
	if s.newDir {
		os.RemoveAll(s.dir)
		return
	}
	if s.dir != "" && opened && !s.hadReserve {
		os.Remove(filepath.Join(s.dir, disk.ReserveName))
	}
	if fi, err := os.Stat(s.logFile); s.logFile != "" && err == nil && fi.Size() == 0 {
		os.Remove(s.logFile)
	}
}

// recoverMountpoint deals with what a crashed daemon left on mountpoint:
// a dead mount ("Transport endpoint is not connected") is detached; a
// wedged one (its daemon killed while the kernel waited on it, so even a
// stat hangs) has its FUSE connection aborted, then is detached. A live
// yirangmq mount is an error. It reports whether it aborted a connection
// (whose zombie daemon may hold its store's lock for a moment more).
func recoverMountpoint(mountpoint string, log *slog.Logger) (aborted bool, err error) {
	info, ok, err := fusefs.LookupMount(mountpoint)
	if err != nil || !ok || info.FSType != "fuse.yirangmq" {
		return false, nil
	}
	// Opening the directory needs an answer from the mount's daemon; a
	// stat could be answered from the kernel's attribute cache and take a
	// dead mount for a live one.
	probe := make(chan error, 1)
	go func() {
		fd, err := unix.Open(mountpoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		probe <- err
	}()
	select {
	case err := <-probe:
		switch {
		case err == nil:
			return false, fmt.Errorf("%s is already a yirangmq mount (unmount it first)", mountpoint)
		case errors.Is(err, unix.ENOTCONN),
			// Over io_uring the kernel ends the connection a few
			// milliseconds after its daemon is gone; a call in
			// between fails with these (docs/fusefs.md).
			errors.Is(err, unix.ECONNABORTED), errors.Is(err, unix.ECANCELED):
			err := unix.Unmount(mountpoint, unix.MNT_DETACH)
			log.Warn("detached a dead mount left by a crashed daemon", queuecore.LogMountpoint, mountpoint, queuecore.LogErr, err)
			return false, nil
		}
		return false, nil
	case <-time.After(2 * time.Second):
		aerr := fusefs.AbortConnection(info.Conn)
		uerr := unix.Unmount(mountpoint, unix.MNT_DETACH)
		log.Warn("aborted and detached a wedged mount left by a killed daemon", "mountpoint", mountpoint,
			"fuse_connection", info.Conn, "abort_err", aerr, "umount_err", uerr)
		return true, nil
	}
}
