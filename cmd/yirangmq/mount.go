package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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
	fsStageBodies                   string
	// limits for several users on one mount (docs/multiuser.md)
	nextReaders, nextReadersPerUID, nextReadersPerQueue int
	draftMiB, draftMiBPerUID                            int64
}

func runMount(ctx context.Context, env *cliEnv, args []string) error {
	fl := pflag.NewFlagSet("mount", pflag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintln(fl.Output(), "Usage: yirangmq mount [OPTIONS] MOUNTPOINT\n\nMounts a store as a filesystem of queues; stays in the foreground until\nSIGTERM or SIGINT, which unmount cleanly (or returns once ready with --daemon).\n\nOptions:")
		fl.PrintDefaults()
	}
	var f mountFlags
	fl.StringVar(&f.backend, "backend", "sqlite", "store backend: sqlite, fs or postgres")
	fl.StringVar(&f.store, "store", defaultStore(), "store directory (created on first use), or with --backend postgres a connection URL")
	fl.StringVar(&f.sync, "sync", "full", "durability: full (a message on disk at close; leases and acks within 100 ms), strict (leases and acks on disk too before they return), normal (survives a daemon crash) or off")
	fl.StringSliceVarP(&f.options, "options", "o", nil, "mount options: allow_other, backend=, sync=, store=, min_free=, memory_budget=, max_message_inodes=, sqlite_file_bodies=, fs_stage_bodies=, transport= (others of mount(8) are accepted and ignored)")
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
	fl.StringVar(&f.fsStageBodies, "fs-stage-bodies", "256K", "with --backend fs and --sync full or strict: a body of this SIZE or more is written and synced to a file of its own before its commit, not through the journal (written to the disk once, not twice); 0: every body through the journal")
	fl.IntVar(&fsSpillAt, "fs-spill-at", fsSpillAt, "with --backend fs: ready messages a queue keeps in memory before newer ones go to a spill file on disk (-1: never)")
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
		case "fs_stage_bodies":
			f.fsStageBodies = v
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
	stage, err := parseSize(f.fsStageBodies)
	if err != nil {
		return fmt.Errorf("--fs-stage-bodies: %w", err)
	}
	fsStageAt = int(min(stage, math.MaxInt32)) // no body is that big: never
	if fsStageAt == 0 {
		fsStageAt = -1 // never
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
	store, err := openStore(ctx, f.backend, f.store, sync, "mount "+mountpoint, log)
	for wait := 0; aborted && errors.Is(err, queuecore.ErrLocked) && wait < 50; wait++ {
		time.Sleep(100 * time.Millisecond) // the aborted daemon is still exiting
		store, err = openStore(ctx, f.backend, f.store, sync, "mount "+mountpoint, log)
	}
	if err != nil {
		return err
	}
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
		// The Go heap is collected harder before the daemon nears the
		// budget; the rest of it is SQLite's caches and the stacks.
		debug.SetMemoryLimit(budget / 4 * 3)
		log.Info("memory budget", "budget_mib", budget>>20, "cgroup_limit_mib", cgLimit>>20)
	}
	var release func()
	if sh, ok := store.(queuecore.CacheShedder); ok {
		release = sh.ShedCaches
	}
	startQuietGC(log, release)
	fsys := fusefs.New(opts)
	spaceDir := f.store
	if f.backend == "postgres" {
		spaceDir = "" // the database server's disk: see docs/operations.md
	}
	core, err := queuecore.Open(ctx, store, queuecore.Options{
		Logger: log, Backend: f.backend, StorePath: shown, Version: version,
		SpaceDir: spaceDir, MinFree: minFree,
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
	log.Info("mounted", logMountpoint, mountpoint, "backend", f.backend, "store", shown, "sync", f.sync, "allow_other", allowOther, "min_free", f.minFree, "pid", os.Getpid())
	signalReady()
	// systemd (Type=notify): ready only once the mount serves.
	if _, err := sdnotify.SdNotify(false, sdnotify.SdNotifyReady+"\nSTATUS=serving "+mountpoint); err != nil {
		log.Warn("tell systemd we are ready", logErr, err)
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
			log.Warn("unmount failed, detaching lazily", logMountpoint, mountpoint, logErr, err)
			_ = unix.Unmount(mountpoint, unix.MNT_DETACH)
		}
		<-served
	case <-served:
		log.Info("unmounted by umount", "mountpoint", mountpoint)
	}
	log.Info("stopped", "mountpoint", mountpoint)
	return nil
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

// signalReady tells whoever started us (--daemon's parent, the test
// harness) that the mount serves.
func signalReady() {
	fdStr := os.Getenv(readyFDEnv)
	if fdStr == "" {
		return
	}
	fd, err := strconv.Atoi(fdStr)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), "ready")
	f.Write([]byte("ready\n"))
	f.Close()
	os.Unsetenv(readyFDEnv)
}

// startDaemon runs the same mount in a background child that logs to
// logFile, and returns once it says ready, or with the end of its log if it
// stops first. The child holds none of our descriptors, so a pipeline
// around `yirangmq mount --daemon` ends when this command does.
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
	got := make(chan bool, 1)
	go func() {
		buf := make([]byte, 6)
		n, _ := r.Read(buf)
		got <- n > 0
	}()
	select {
	case ok := <-got:
		if !ok {
			cmd.Wait()
			return fmt.Errorf("the daemon stopped before the mount was ready; the end of %s:\n%s", logFile, logTail(logFile, 10))
		}
		fmt.Fprintf(env.stdout, "yirangmq: mounted, daemon pid %d\n", cmd.Process.Pid)
		_ = cmd.Process.Release()
		return nil
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		return fmt.Errorf("the daemon was not ready after 30 s; the end of %s:\n%s", logFile, logTail(logFile, 10))
	}
}

// logTail returns the last n lines of a log file.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
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
			log.Warn("detached a dead mount left by a crashed daemon", logMountpoint, mountpoint, logErr, err)
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

func runUmount(ctx context.Context, env *cliEnv, args []string) error {
	fl := pflag.NewFlagSet("umount", pflag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintln(fl.Output(), "Usage: yirangmq umount [OPTIONS] MOUNTPOINT\n\nUnmounts a yirangmq mount; the daemon then stops by itself.\n\nOptions:")
		fl.PrintDefaults()
	}
	lazy := fl.BoolP("lazy", "l", false, "detach now even if busy (the daemon stops when the last user leaves)")
	if ok, err := parseFlags(env, fl, args); !ok {
		return err
	}
	if fl.NArg() != 1 {
		fmt.Fprintln(env.stderr, "yirangmq umount: exactly one MOUNTPOINT is needed")
		return errUsage
	}
	mp := fl.Arg(0)
	flags := 0
	if *lazy {
		flags = unix.MNT_DETACH
	}
	err := unix.Unmount(mp, flags)
	if errors.Is(err, unix.EPERM) {
		// Not root: fusermount3 can unmount what this user mounted.
		if out, ferr := exec.Command("fusermount3", "-u", mp).CombinedOutput(); ferr == nil {
			return nil
		} else {
			return fmt.Errorf("unmount %s: %s", mp, strings.TrimSpace(string(out)))
		}
	}
	switch {
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("unmount %s: busy: a process has a file open or its working directory there (try fuser -m %s, or --lazy)", mp, mp)
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("unmount %s: not a mountpoint", mp)
	case err != nil:
		return fmt.Errorf("unmount %s: %w", mp, err)
	}
	return nil
}
