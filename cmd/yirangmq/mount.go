package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	sdnotify "github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"yirangmq/backends/disk"
	"yirangmq/fusefs"
	"yirangmq/queuecore"
)

// readyFDEnv names the descriptor on which a mounting daemon writes
// "ready\n" once the mount serves; --daemon and the test harness use it.
const readyFDEnv = "YIRANGMQ_READY_FD"

type mountFlags struct {
	backend, store, sync, logFormat string
	logFile                         string
	minFree                         string
	logMaxSize                      string
	options                         []string
	daemon, debug                   bool
	entryTimeout                    time.Duration
	memoryBudget                    string
	maxMessageInodes                int
	cpuProfile                      string
	sqliteFileBodies                string
	transport                       string
	fsStageBodies, fsSpillAt        string // ignored: settings of the fs store's format 1
	// limits for several users on one mount (docs/multiuser.md)
	nextReaders, nextReadersPerUID, nextReadersPerQueue int
	draftMiB, draftMiBPerUID                            int64
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

func mount(ctx context.Context, env *cliEnv, args []string) (err error) {
	fl := pflag.NewFlagSet("mount", pflag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintln(fl.Output(), "Usage: yirangmq mount [OPTIONS] MOUNTPOINT\n\nMounts a store as a filesystem of queues; stays in the foreground until\nSIGTERM or SIGINT, which unmount cleanly (or returns once ready with --daemon).\n\nOptions:")
		printOptions(fl)
	}
	var f mountFlags
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
	fl.IntVar(&fsMaxMessages, "fs-max-messages", defaultFSMaxMessages, "with --backend fs: messages the store holds at most, in every queue and state (past it a publish fails with EDQUOT); the daemon keeps about 200 bytes of memory per message")
	// For measuring what the fs store's spare files give (-1: none).
	fl.IntVar(&fsSpares, "fs-spares", 0, "")
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
	allowOther := false
	for _, o := range f.options {
		k, v, _ := strings.Cut(strings.TrimSpace(o), "=")
		switch k {
		case "allow_other":
			allowOther = true
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
			fsMaxMessages = n
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
	sync, err := queuecore.ParseSyncMode(f.sync)
	if err != nil {
		return err
	}
	if _, err := fusefs.ParseTransport(f.transport); err != nil {
		return err
	}
	minFree, err := parseMinFree(f.minFree)
	if err != nil {
		return err
	}
	logMax, err := parseSize(f.logMaxSize)
	if err != nil {
		return fmt.Errorf("--log-max-size: %w", err)
	}
	if sqliteFileBodies, err = parseSize(f.sqliteFileBodies); err != nil {
		return fmt.Errorf("--sqlite-file-bodies: %w", err)
	}
	if sqliteFileBodies == 0 {
		sqliteFileBodies = -1 // never
	}
	if fsMaxMessages < 0 {
		return fmt.Errorf("--fs-max-messages %d: want 0 (the default) or more", fsMaxMessages)
	}
	budget, cgLimit, err := parseMemoryBudget(f.memoryBudget)
	if err != nil {
		return err
	}
	if f.maxMessageInodes < 0 {
		return fmt.Errorf("--max-message-inodes %d: want 0 (no limit) or more", f.maxMessageInodes)
	}
	if f.daemon {
		if f.logFile == "" {
			dir := f.store
			if f.backend == "postgres" {
				dir = defaultStore() // the store is no directory
			}
			f.logFile = filepath.Join(dir, "yirangmq.log")
		}
		return startDaemon(ctx, env, args, f.logFile)
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
	logOut := env.stderr
	if f.logFile != "" {
		if err := os.MkdirAll(filepath.Dir(f.logFile), 0o700); err != nil {
			return err
		}
		lf, err := openLogFile(f.logFile, logMax)
		if err != nil {
			return fmt.Errorf("open log file: %w", err)
		}
		defer lf.Close()
		logOut = lf
	}
	log, err := newLogger(logOut, f.logFormat, f.debug)
	if err != nil {
		return err
	}
	if f.cpuProfile != "" {
		stop, err := startProfiles(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	aborted, err := recoverMountpoint(mountpoint, log)
	if err != nil {
		return err
	}
	// Before the store is opened: a mount that cannot happen must not
	// make the store (or its space reserve) first.
	if err := checkMountpoint(mountpoint); err != nil {
		return err
	}
	store, err := openStore(ctx, f.backend, f.store, sync, "mount "+mountpoint, log)
	for wait := 0; aborted && errors.Is(err, queuecore.ErrLocked) && wait < 50; wait++ {
		time.Sleep(100 * time.Millisecond) // the aborted daemon is still exiting
		store, err = openStore(ctx, f.backend, f.store, sync, "mount "+mountpoint, log)
	}
	if err != nil {
		return err
	}
	opened = true
	defer store.Close()
	opts := fusefs.DefaultOptions()
	opts.AllowOther, opts.Debug, opts.Logger = allowOther, f.debug, log
	opts.EntryTimeout, opts.AttrTimeout = f.entryTimeout, f.entryTimeout
	opts.NameTimeout = fusefs.NameTimeoutFactor * f.entryTimeout
	opts.MaxNextReaders, opts.MaxNextReadersPerUID, opts.MaxNextReadersPerQueue = f.nextReaders, f.nextReadersPerUID, f.nextReadersPerQueue
	opts.MaxDraftBytes, opts.MaxDraftBytesPerUID = f.draftMiB<<20, f.draftMiBPerUID<<20
	shown := displayStore(f.backend, f.store)
	opts.FsName = shown
	opts.MaxMessageInodes, opts.MemoryBudget = f.maxMessageInodes, budget
	opts.Transport = f.transport
	if budget > 0 {
		debug.SetMemoryLimit(heapLimit(budget))
		log.Info("memory budget", "budget_mib", budget>>20, "cgroup_limit_mib", cgLimit>>20)
	}
	var release func()
	if sh, ok := store.(queuecore.CacheShedder); ok {
		release = sh.ShedCaches
	}
	gc := startQuietGC(log, release)
	if isAutoBudget(f.memoryBudget) {
		// The limit changes while the daemon runs (systemctl
		// set-property MemoryMax=, a move to another cgroup): follow it.
		opts.FollowBudget = autoMemoryBudget
		opts.BudgetChanged = func(b int64) { gc.setMemoryLimit(heapLimit(b)) }
	}
	fsys := fusefs.New(opts)
	var storeDisk queuecore.Disk
	if f.backend != "postgres" { // else the database server's disk: see docs/operations.md
		storeDisk = disk.New(f.store)
	}
	core, err := queuecore.Open(ctx, store, queuecore.Options{
		Logger: log, Backend: f.backend, StorePath: shown, Version: version,
		Disk: storeDisk, MinFree: minFree,
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
	conn := ""
	if info, ok, _ := fusefs.LookupMount(mountpoint); ok {
		conn = info.Conn // for stop, below
	}
	log.Info("mounted", queuecore.LogMountpoint, mountpoint, "backend", f.backend, "store", shown, "sync", f.sync, "allow_other", allowOther, "min_free", f.minFree, "pid", os.Getpid())
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
	return nil
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

// The ready pipe: a mounting daemon started with readyFDEnv writes
// "ready\n" on it once the mount serves, or "error: WHY\n" if the mount
// fails, then closes it.
const readyFailed = "error: "

// signalReady tells whoever started us (--daemon's parent, the test
// harness) that the mount serves.
func signalReady() { tellStarter("ready\n") }

// signalFailed tells whoever started us why the mount failed.
func signalFailed(err error) {
	tellStarter(readyFailed + strings.Join(strings.Fields(err.Error()), " ") + "\n")
}

func tellStarter(line string) {
	fdStr := os.Getenv(readyFDEnv)
	if fdStr == "" {
		return
	}
	os.Unsetenv(readyFDEnv)
	fd, err := strconv.Atoi(fdStr)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), "ready")
	f.Write([]byte(line))
	f.Close()
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

// startDaemon runs the same mount in a background child that logs to
// logFile, and returns once it says ready, or with the error it says on
// the ready pipe if it fails. The child holds none of our descriptors, so
// a pipeline around `yirangmq mount --daemon` ends when this command does.
func startDaemon(ctx context.Context, env *cliEnv, args []string, logFile string) error {
	var childArgs []string
	for _, a := range args {
		if a != "--daemon" {
			childArgs = append(childArgs, a)
		}
	}
	childArgs = append([]string{"--log-file", logFile}, childArgs...)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logStart := logSize(logFile)
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(self, append([]string{"mount"}, childArgs...)...)
	cmd.Env = append(os.Environ(), readyFDEnv+"=3")
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, nil // /dev/null
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return err
	}
	w.Close()
	got := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(r).ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		if line == "ready\n" {
			fmt.Fprintf(env.stdout, "yirangmq: mounted, daemon pid %d\n", cmd.Process.Pid)
			_ = cmd.Process.Release()
			return nil
		}
		werr := cmd.Wait()
		if why, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), readyFailed); ok {
			return errors.New(why)
		}
		// It died without a word (a crash, a kill): what it logged, if
		// anything, is in its log.
		return fmt.Errorf("the daemon stopped before the mount was ready (%v)%s", werr, newLogLines(logFile, logStart, 10))
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("the daemon was not ready after 30 s%s", newLogLines(logFile, logStart, 10))
	}
}

// logSize is the size of a log file, 0 if there is none.
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// newLogLines returns the last n of the lines a log file got past offset
// from (what this run of the daemon wrote), introduced, or "" when none.
func newLogLines(path string, from int64, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if int64(len(b)) < from {
		from = 0 // rotated meanwhile: all of it is new
	}
	if int64(len(b)) == from {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b[from:]), "\n"), "\n")
	return "; its log " + path + " says:\n" + strings.Join(lines[max(0, len(lines)-n):], "\n")
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
