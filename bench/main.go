// Command mountbench measures yirangmq through a real mount, as issue 3
// asks: publish (create+write+close), lease (rename) and ack (unlink) with
// 256-byte messages, one client and several, on the sqlite and fs stores;
// the .next wake-up; the same file operations on a plain directory of the
// same disk; and the FUSE request floor (fstat with every kernel cache
// off). It counts the FUSE requests each operation needs (perf, in the
// kernel, during the timed run) and records the request sequence of each
// operation from a --debug mount, then relates every operation to the
// floor × its requests (the goal: within 3x).
//
//	cd bench && go run . [--messages 3000] [--clients 1,4] [--backends sqlite,fs] [--sync normal,full] [--out results/mount-bench.json]
//
// The daemons are children of this process. Every exit path, SIGINT and
// SIGTERM included, unmounts and stops them; if this process is killed
// with SIGKILL they get SIGTERM (Pdeathsig) and unmount by themselves, and
// a dead mount left by a crash is detached at the next run. See
// docs/mount-bench.md for what the numbers mean.
//
// `mountbench suite` is the comparison suite behind `make bench`
// (suite.go, docs/bench.md): the same operations on yirangmq through the
// mount and in process, a plain directory, a go-fuse loopback mount, a
// goqite-style SQLite queue and POSIX message queues, in one run.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// workPrefix names this bench's working directories, and its mounts.
const workPrefix = "yirangmq-mountbench-"

func init() {
	// Daemons and perf are started from the main goroutine, which this
	// keeps on the main thread: Pdeathsig fires when the thread that
	// started a child exits, and the main thread lives as long as we do.
	runtime.LockOSThread()
}

type config struct {
	messages, durableMessages, nextSamples, floorOps, traceOps, warmup int
	clients                                                            []int
	backends, syncs                                                    []string
	cacheTimeout                                                       time.Duration
	out, bin, workBase, count                                          string
	keep, noPlain                                                      bool
	// transport is every daemon's --transport ("": none passed).
	transport string
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "suite":
			os.Exit(suiteMain(os.Args[2:]))
		case "report":
			os.Exit(reportMain(os.Args[2:]))
		}
	}
	var cfg config
	fl := pflag.NewFlagSet("mountbench", pflag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintln(os.Stderr, "Usage: (cd bench && go run . [OPTIONS])\n\nBenchmarks publish, lease, ack and the .next wake-up through a yirangmq mount,\nagainst a plain directory and the FUSE request floor (see docs/mount-bench.md).\n\nOptions:")
		fl.PrintDefaults()
	}
	fl.IntVar(&cfg.messages, "messages", 3000, "messages per timed phase (per store, sync mode and client count)")
	fl.IntVar(&cfg.durableMessages, "durable-messages", 500, "messages per phase on the plain directory made durable by hand (the comparison for --sync full; fsync-bound, so fewer)")
	fl.IntSliceVar(&cfg.clients, "clients", []int{1, 4}, "client counts (goroutines, each with its own names)")
	fl.StringSliceVar(&cfg.backends, "backends", []string{"sqlite", "fs"}, "stores to mount")
	fl.StringSliceVar(&cfg.syncs, "sync", []string{"normal", "full"}, "--sync modes of the daemon")
	fl.IntVar(&cfg.nextSamples, "next-samples", 300, ".next wake-up samples per store and sync mode")
	fl.IntVar(&cfg.floorOps, "floor-ops", 20000, "fstat probes of the FUSE request floor per client count at the start (a quarter, at least 5000, before each store and sync mode)")
	fl.IntVar(&cfg.traceOps, "trace-ops", 3, "operations per phase on the --debug mount that records request sequences (0: skip)")
	fl.IntVar(&cfg.warmup, "warmup", 200, "untimed publish+lease+ack before each timed run")
	fl.DurationVar(&cfg.cacheTimeout, "cache-timeout", time.Second, "--cache-timeout of the timed mounts (the floor mount always uses 0s)")
	fl.StringVar(&cfg.out, "out", "results/mount-bench.json", "where to write the results as JSON")
	fl.StringVar(&cfg.bin, "bin", "", "yirangmq binary (default: build ./cmd/yirangmq of this checkout)")
	fl.StringVar(&cfg.workBase, "workdir", defaultWorkBase(), "where to make the working directory (stores, mounts, plain directories); not under a $TMPDIR, whose yirangmq mounts the test harness (testenv.CleanLeftoverMounts) detaches, live ones too")
	fl.StringVar(&cfg.count, "count", "auto", "how to count FUSE requests per operation: perf (in the kernel, during the timed run), trace (from the --debug run), or auto")
	fl.BoolVar(&cfg.keep, "keep", false, "keep the working directory (daemon logs)")
	fl.BoolVar(&cfg.noPlain, "no-plain", false, "skip the plain-directory comparison")
	if err := fl.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return
		}
		os.Exit(2)
	}
	if err := cfg.check(); err != nil {
		fmt.Fprintln(os.Stderr, "mountbench:", err)
		os.Exit(2)
	}
	// The transport of the tests' daemons (make test) is this bench's too.
	cfg.transport = os.Getenv(testenv.TransportEnv)
	ctx, interrupted, stop := interruptible("mountbench")
	b := &bench{cfg: cfg, log: os.Stderr}
	err := b.run(ctx)
	if err != nil && b.current != nil && !interrupted.Load() {
		fmt.Fprintf(os.Stderr, "mountbench: the last lines of the daemon's log (%s):\n%s\n", b.current.logPath, b.current.tail(3000))
	}
	b.cleanup()
	stop()
	switch {
	case interrupted.Load():
		fmt.Fprintln(os.Stderr, "mountbench: interrupted; cleaned up")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "mountbench:", err)
		os.Exit(1)
	}
}

func (c *config) check() error {
	if c.messages < 1 || c.durableMessages < 1 || c.nextSamples < 0 || c.floorOps < 1 || c.traceOps < 0 || c.warmup < 0 {
		return errors.New("counts must be positive")
	}
	for _, n := range c.clients {
		if n < 1 || n > 256 {
			return fmt.Errorf("--clients %d: want 1..256", n)
		}
	}
	for _, s := range c.backends {
		if s != "sqlite" && s != "fs" {
			return fmt.Errorf("--backends %q: want sqlite or fs", s)
		}
	}
	for _, s := range c.syncs {
		if s != "normal" && s != "full" && s != "off" {
			return fmt.Errorf("--sync %q: want normal, full or off", s)
		}
	}
	switch c.count {
	case "auto", "perf", "trace":
	default:
		return fmt.Errorf("--count %q: want auto, perf or trace", c.count)
	}
	return nil
}

// bench is one run: its configuration, what to undo, and the results.
type bench struct {
	cfg      config
	log      io.Writer
	work     string
	usePerf  bool
	current  *daemon // the last one started, whose log explains an error
	undo     []func()
	res      results
	floorMnt *daemon                       // the --cache-timeout 0s mount of the floor probes
	traceReq map[string]map[string]float64 // by phase and opcode, from the --debug trace
}

// atExit registers f to run at cleanup, last registered first.
func (b *bench) atExit(f func()) { b.undo = append(b.undo, f) }

func (b *bench) cleanup() {
	for i := len(b.undo) - 1; i >= 0; i-- {
		b.undo[i]()
	}
	b.undo = nil
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "mountbench: "+format+"\n", args...)
}

func (b *bench) run(ctx context.Context) error {
	detachDeadBenchMounts()
	if err := os.MkdirAll(b.cfg.workBase, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(b.cfg.workBase, workPrefix)
	if err != nil {
		return err
	}
	b.work = work
	spreadErr := spreadSubdirs(work)
	if spreadErr != nil {
		b.logf("cannot mark %s as a top directory (%v): its subdirectories share block groups, and a create may pay for inodes others freed nearby in the last 60 s", work, spreadErr)
	}
	b.atExit(func() {
		if b.cfg.keep {
			b.logf("kept %s", work)
			return
		}
		if err := os.RemoveAll(work); err != nil {
			b.logf("remove %s: %v", work, err)
		}
	})
	if err := b.setup(ctx); err != nil {
		return err
	}
	b.res.TopDir = spreadErr == nil
	start := time.Now()
	if !b.cfg.noPlain {
		if err := b.runPlain(ctx); err != nil {
			return fmt.Errorf("plain directory: %w", err)
		}
	}
	if err := b.startFloorMount(); err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	if _, err := b.probeFloor(ctx, "start", b.cfg.floorOps, []floorKind{floorFstat, floorStat}); err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	for _, backend := range b.cfg.backends {
		for _, sync := range b.cfg.syncs {
			spec := mountSpec{backend: backend, sync: sync, transport: b.cfg.transport, cacheTimeout: b.cfg.cacheTimeout}
			for attempt := 1; ; attempt++ {
				nMount, nNext, nFloor := len(b.res.Mount), len(b.res.Next), len(b.res.Floor)
				ref, err := b.probeFloor(ctx, "before "+backend+"/"+sync, max(b.cfg.floorOps/4, 5000), []floorKind{floorFstat})
				if err == nil {
					err = b.runMount(ctx, spec, ref)
				}
				if err == nil {
					break
				}
				if attempt == 1 && mountVanished(err) && ctx.Err() == nil {
					// Somebody else unmounted it (a test's sweep of
					// leftover mounts): once more, from the start.
					b.logf("%s/%s: the mount went away under us (%v); running it again", backend, sync, err)
					b.res.Notes = append(b.res.Notes, fmt.Sprintf("%s/%s ran twice: its first mount was unmounted from outside (%v)", backend, sync, err))
					b.res.Mount, b.res.Next, b.res.Floor = b.res.Mount[:nMount], b.res.Next[:nNext], b.res.Floor[:nFloor]
					if b.floorMnt.gone() {
						if err := b.startFloorMount(); err != nil {
							return fmt.Errorf("floor: %w", err)
						}
					}
					continue
				}
				return fmt.Errorf("%s --sync %s: %w", backend, sync, err)
			}
		}
	}
	if err := b.floorMnt.stop(); err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	if b.cfg.traceOps > 0 {
		if err := b.runTraceMount(ctx); err != nil {
			return fmt.Errorf("trace: %w", err)
		}
	}
	b.res.Seconds = round1(time.Since(start).Seconds())
	b.finish()
	b.report(os.Stdout)
	return b.writeJSON()
}

// setup finds the binary, decides how to count requests and describes
// the machine.
func (b *bench) setup(ctx context.Context) error {
	if b.cfg.bin == "" {
		root, err := moduleRoot()
		if err != nil {
			return err
		}
		b.cfg.bin = filepath.Join(b.work, "yirangmq")
		b.logf("building %s", b.cfg.bin)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.cfg.bin, "./cmd/yirangmq")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build: %v\n%s", err, out)
		}
		if err := evictCached(b.cfg.bin); err != nil {
			return err
		}
	}
	switch b.cfg.count {
	case "perf", "auto":
		err := perfUsable()
		if err == nil {
			b.usePerf = true
		} else if b.cfg.count == "perf" {
			return fmt.Errorf("--count perf: %w", err)
		} else {
			b.logf("perf cannot count FUSE requests (%v): requests per operation come from the --debug trace", err)
		}
	}
	if !b.usePerf && b.cfg.traceOps == 0 {
		b.cfg.traceOps = 3 // the only source of request counts left
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	var sfs unix.Statfs_t
	_ = unix.Statfs(b.work, &sfs)
	b.res = results{
		Started:      time.Now().UTC().Format(time.RFC3339),
		Kernel:       unix.ByteSliceToString(uts.Release[:]),
		CPUs:         runtime.NumCPU(),
		GoVersion:    runtime.Version(),
		Workdir:      b.work,
		Filesystem:   fsDescription(b.work),
		MessageBytes: msgSize,
		Messages:     b.cfg.messages,
		CacheTimeout: b.cfg.cacheTimeout.String(),
		CountSource:  map[bool]string{true: "perf: fuse:fuse_request_send and ext4:ext4_sync_file_enter counted in the kernel during the timed run", false: "--debug trace of a few operations (cold pattern)"}[b.usePerf],
	}
	b.res.LoadBefore = loadavg()
	return nil
}

// defaultWorkBase is the user's cache directory: on the same disk as the
// temporary directories here, but under no $TMPDIR that a concurrent
// `go test` may sweep for leftover mounts.
func defaultWorkBase() string {
	if dir, err := os.UserCacheDir(); err == nil {
		return filepath.Join(dir, "yirangmq-mountbench")
	}
	return "/var/tmp"
}

// fsTopdirFL is FS_TOPDIR_FL (chattr +T), missing from x/sys/unix.
const fsTopdirFL = 0x00020000

// spreadSubdirs marks dir as a top of a directory hierarchy (chattr +T).
// ext4 then places each of its subdirectories as it places directories
// under /, in a block group with many free inodes (the Orlov allocator),
// instead of the parent's group. That is what makes a fresh directory
// fresh here: ext4 without a journal skips inodes freed in the last 60 s
// on create (recently_deleted), per block group, so a new directory next
// to ones where other processes (other tests on this machine, or our own
// earlier phases) just deleted thousands of files creates 10-20 times more
// slowly, whatever its own history (measured: 1.3k creates/s in a new
// directory of /var/tmp while other tests ran, 20k/s under a +T directory).
func spreadSubdirs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetInt(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		return err
	}
	return unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, flags|fsTopdirFL)
}

// moduleRoot is the directory of the yirangmq go.mod at or above the
// working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if m, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(m, []byte("module yirangmq\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the yirangmq module: run from the checkout, or pass --bin")
		}
		dir = parent
	}
}

// fsDescription says which filesystem (device, type, options) holds dir,
// from /proc/self/mountinfo.
func fsDescription(dir string) string {
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return ""
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	want := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[2] != want {
			continue
		}
		i := slices.Index(f, "-")
		if i < 0 || i+2 >= len(f) {
			continue
		}
		return fmt.Sprintf("%s %s on %s (%s)", f[i+1], f[i+2], f[4], f[5])
	}
	return ""
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// setupQueue makes a queue whose acks delete (no archive) and whose
// leases outlast the run.
func setupQueue(dir string) error {
	if err := unix.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	policy := []byte(`{"archive": {"enabled": false}, "visibilityTimeoutSec": 3600}`)
	fd, err := unix.Open(filepath.Join(dir, ".policy"), unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open .policy: %w", err)
	}
	_, err = unix.Write(fd, policy)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write .policy: %w", err)
	}
	return nil
}

// mount starts a daemon on a new store in a new directory of the work
// directory (so in a block group of its own), and registers its stop.
func (b *bench) mount(spec mountSpec, label string) (*daemon, error) {
	dir := filepath.Join(b.work, spec.String()+"-"+label)
	for i := 2; ; i++ { // a new directory, also when a configuration runs again
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		dir = filepath.Join(b.work, fmt.Sprintf("%s-%s-%d", spec, label, i))
	}
	d, err := startDaemon(b.cfg.bin, dir, spec)
	if err != nil {
		return nil, err
	}
	b.current = d
	b.atExit(func() {
		if err := d.stop(); err != nil {
			b.logf("stop daemon %s: %v", spec, err)
		}
	})
	return d, nil
}

// measure runs one timed phase with its counters.
type measured struct {
	phase  phaseResult
	cpu    cpuUse
	counts *counts
}

func (b *bench) measure(d *daemon, store string, f func() (phaseResult, error)) (measured, error) {
	var m measured
	var ctr *counter
	pid := 0
	if d != nil {
		pid = d.pid()
		if b.usePerf {
			conn, err := d.connection()
			if err != nil {
				return m, err
			}
			if ctr, err = startCounter(conn, store); err != nil {
				return m, err
			}
			b.atExit(ctr.kill)
		}
	}
	cpu := startCPU(pid)
	ph, err := f()
	m.phase = ph
	m.cpu = cpu.stop(len(ph.lat))
	if ctr != nil {
		c, cerr := ctr.stop()
		if err == nil && cerr != nil {
			err = fmt.Errorf("count requests: %w", cerr)
		}
		m.counts = &c
	}
	return m, err
}

// runPlain runs the three operations on plain directories: each client
// count in new directories ("fresh"), then again in the same directories
// right after their files were deleted ("churn": ext4 without a journal
// skips inodes freed in the last 60 s, see docs/mount-bench.md, Baselines).
func (b *bench) runPlain(ctx context.Context) error {
	modes := []bool{false}
	if slices.Contains(b.cfg.syncs, "full") {
		modes = append(modes, true)
	}
	for _, durable := range modes {
		for _, c := range b.cfg.clients {
			name := fmt.Sprintf("plain-%s-c%d", map[bool]string{false: "nosync", true: "durable"}[durable], c)
			root := filepath.Join(b.work, name)
			q := queueDirs{inbox: filepath.Join(root, "inbox"), processing: filepath.Join(root, "processing"), durable: durable}
			for _, p := range []string{q.inbox, q.processing} {
				if err := os.MkdirAll(p, 0o755); err != nil {
					return err
				}
			}
			n, passes := b.cfg.messages, []string{"fresh", "churn"}
			if durable {
				// fsync dominates, whatever the directory's past.
				n, passes = b.cfg.durableMessages, []string{"fresh"}
			}
			for _, dirState := range passes {
				for _, op := range []opKind{opPublish, opLease, opAck} {
					m, err := b.measure(nil, "", func() (phaseResult, error) {
						return runPhase(ctx, q, op, dirState, n, c)
					})
					if err != nil {
						return fmt.Errorf("%s %s %s: %w", name, dirState, op, err)
					}
					r := plainRow{Op: op.String(), Clients: c, Durable: durable, Dir: dirState,
						Ops: len(m.phase.lat), Seconds: m.phase.wall.Seconds(),
						OpsPerSec: opsPerSec(len(m.phase.lat), m.phase.wall), Latency: m.phase.lat.summary(), CPU: m.cpu}
					b.res.Plain = append(b.res.Plain, r)
					b.logf("plain %-7s %-5s c=%d durable=%v: %8.0f ops/s p50 %6.1f µs p99 %7.1f µs", op, dirState, c, durable, r.OpsPerSec, r.Latency.P50US, r.Latency.P99US)
				}
			}
		}
	}
	return nil
}

func opsPerSec(n int, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return round1(float64(n) / wall.Seconds())
}

// floorRef is the FUSE request floor an operation is compared to: the
// fstat probe's mean time per request (1/throughput) and its p50.
type floorRef struct{ meanUS, p50US float64 }

// startFloorMount mounts the store of the floor probes, with every kernel
// cache off (--cache-timeout 0s), for the whole run: the floor is probed
// once at length, and again right before each store and sync mode so that
// each is compared with the floor of its own minutes on a shared machine.
func (b *bench) startFloorMount() error {
	d, err := b.mount(mountSpec{backend: "sqlite", sync: "normal", transport: b.cfg.transport, cacheTimeout: 0}, "floor")
	if err != nil {
		return err
	}
	if err := setupQueue(filepath.Join(d.mnt, "floor")); err != nil {
		return err
	}
	b.floorMnt = d
	return nil
}

// probeFloor runs the floor probes and returns the fstat floor by client
// count; label says when ("start", or the configuration that follows).
func (b *bench) probeFloor(ctx context.Context, label string, n int, kinds []floorKind) (map[int]floorRef, error) {
	d := b.floorMnt
	ref := map[int]floorRef{}
	for _, kind := range kinds {
		path := d.mnt
		if kind == floorStat {
			path = filepath.Join(d.mnt, "floor", ".stats")
		}
		for _, c := range b.cfg.clients {
			m, err := b.measure(d, "", func() (phaseResult, error) { return runFloor(ctx, kind, path, n, c) })
			if err != nil {
				return nil, fmt.Errorf("%s c=%d: %w", kind, c, err)
			}
			ops := len(m.phase.lat)
			r := floorRow{Probe: kind.String(), When: label, Clients: c, CacheTimeout: "0s", Ops: ops,
				OpsPerSec: opsPerSec(ops, m.phase.wall), Latency: m.phase.lat.summary(), CPU: m.cpu}
			if m.counts != nil {
				r.RequestsPerOp, r.Requests = perOp(m.counts.Requests, ops)
			} else {
				r.RequestsPerOp = map[floorKind]float64{floorFstat: 1, floorStat: 3}[kind] // GETATTR; LOOKUP floor, LOOKUP .stats, GETATTR
			}
			r.USPerRequest = round1(float64(m.phase.wall.Nanoseconds()) / 1e3 / float64(ops) / r.RequestsPerOp)
			if kind == floorFstat {
				ref[c] = floorRef{meanUS: r.USPerRequest, p50US: round1(r.Latency.P50US / r.RequestsPerOp)}
			}
			b.res.Floor = append(b.res.Floor, r)
			b.logf("%s (%s) c=%d: %8.0f ops/s p50 %6.1f µs, %.2f requests/op, %.1f µs/request, daemon CPU %.1f µs/op",
				kind, label, c, r.OpsPerSec, r.Latency.P50US, r.RequestsPerOp, r.USPerRequest, r.CPU.DaemonUSPerOp)
		}
	}
	return ref, nil
}

// mountVanished tells whether an error says the mount was taken away.
func mountVanished(err error) bool {
	return errors.Is(err, unix.ECONNABORTED) || errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ENODEV)
}

// perOp divides counts by the number of operations.
func perOp(req map[string]int64, ops int) (float64, map[string]float64) {
	out := map[string]float64{}
	for k, v := range req {
		if k == "total" {
			continue
		}
		out[k] = round2(float64(v) / float64(ops))
	}
	return round2(float64(req["total"]) / float64(ops)), out
}

// runMount runs the timed phases on one store and sync mode: a new store
// per client count, and one for .next, so that no run creates files where
// an earlier one just deleted thousands (the fs store keeps a file per
// message).
func (b *bench) runMount(ctx context.Context, spec mountSpec, floor map[int]floorRef) error {
	for _, c := range b.cfg.clients {
		d, err := b.mount(spec, fmt.Sprintf("c%d", c))
		if err != nil {
			return err
		}
		qdir := filepath.Join(d.mnt, "bench")
		if err := setupQueue(qdir); err != nil {
			return err
		}
		q := queueDirs{inbox: filepath.Join(qdir, "inbox"), processing: filepath.Join(qdir, "processing")}
		for _, op := range []opKind{opPublish, opLease, opAck} {
			if _, err := runPhase(ctx, q, op, "warmup", b.cfg.warmup, 1); err != nil {
				return fmt.Errorf("warm-up %s: %w", op, err)
			}
		}
		for _, op := range []opKind{opPublish, opLease, opAck} {
			m, err := b.measure(d, d.store, func() (phaseResult, error) {
				return runPhase(ctx, q, op, "timed", b.cfg.messages, c)
			})
			if err != nil {
				return fmt.Errorf("c=%d %s: %w", c, op, err)
			}
			ops := len(m.phase.lat)
			r := opRow{Op: op.String(), Backend: spec.backend, Sync: spec.sync, Clients: c, Ops: ops,
				Seconds: round2(m.phase.wall.Seconds()), OpsPerSec: opsPerSec(ops, m.phase.wall),
				Latency: m.phase.lat.summary(), CPU: m.cpu, RequestsPerOp: -1, FsyncsPerOp: -1,
				FloorUS: floor[c].meanUS, FloorP50US: floor[c].p50US}
			if m.counts != nil {
				r.RequestsPerOp, r.Requests = perOp(m.counts.Requests, ops)
				if m.counts.Fsyncs >= 0 {
					r.FsyncsPerOp = round2(float64(m.counts.Fsyncs) / float64(ops))
				}
			}
			b.res.Mount = append(b.res.Mount, r)
			b.logf("%-6s %-6s c=%d %-7s: %7.0f ops/s p50 %6.1f µs p99 %7.1f µs, %.2f req/op, %.2f fsync/op, daemon CPU %.0f µs/op, others %.0f%%",
				spec.backend, spec.sync, c, op, r.OpsPerSec, r.Latency.P50US, r.Latency.P99US, r.RequestsPerOp, r.FsyncsPerOp, r.CPU.DaemonUSPerOp, 100*r.CPU.OthersShare)
		}
		if err := d.stop(); err != nil {
			return err
		}
	}
	if b.cfg.nextSamples > 0 {
		d, err := b.mount(spec, "next")
		if err != nil {
			return err
		}
		qdir := filepath.Join(d.mnt, "next")
		if err := setupQueue(qdir); err != nil {
			return err
		}
		var nr nextResult
		m, err := b.measure(d, d.store, func() (phaseResult, error) {
			var err error
			nr, err = runNext(ctx, qdir, 0, b.cfg.nextSamples)
			return phaseResult{lat: nr.Wake}, err
		})
		if err != nil {
			return fmt.Errorf(".next: %w", err)
		}
		r := nextRow{Backend: spec.backend, Sync: spec.sync, Samples: len(nr.Wake), Wake: nr.Wake.summary(),
			AfterClose: nr.AfterClose.summary(), Unconfirmed: nr.Unconfirmed, RequestsPerSample: -1, CPU: m.cpu,
			FloorP50US: floor[1].p50US}
		if m.counts != nil {
			r.RequestsPerSample, r.Requests = perOp(m.counts.Requests, len(nr.Wake))
		}
		b.res.Next = append(b.res.Next, r)
		b.logf("%-6s %-6s .next wake-up: p50 %6.1f µs p99 %7.1f µs (after close returned: p50 %6.1f µs), %d samples, %d unconfirmed",
			spec.backend, spec.sync, r.Wake.P50US, r.Wake.P99US, r.AfterClose.P50US, r.Samples, r.Unconfirmed)
		return d.stop()
	}
	return nil
}

// runTraceMount records the request sequence of each operation from a
// --debug mount.
func (b *bench) runTraceMount(ctx context.Context) error {
	spec := mountSpec{backend: "sqlite", sync: "normal", transport: b.cfg.transport, cacheTimeout: b.cfg.cacheTimeout, debug: true}
	d, err := b.mount(spec, "trace")
	if err != nil {
		return err
	}
	labels, err := runTrace(ctx, d.mnt, b.cfg.traceOps, b.cfg.cacheTimeout)
	if err != nil {
		return err
	}
	if err := d.stop(); err != nil {
		return err
	}
	tr, err := parseTrace(d.logPath, labels)
	if err != nil {
		return err
	}
	b.res.Trace = &tr
	// Without perf, requests per operation come from the sequence most
	// operations of a phase had (the first one also looks up the
	// directories), FORGETs left out as perf would.
	b.traceReq = map[string]map[string]float64{}
	for _, phase := range tr.Order {
		var common traceSeq
		for _, s := range tr.Phases[phase] {
			if s.Ops > common.Ops {
				common = s
			}
		}
		byOp := map[string]float64{}
		for _, r := range common.Requests {
			op, _, _ := strings.Cut(r, " ")
			if op != "FORGET" && op != "BATCH_FORGET" {
				byOp[op]++
			}
		}
		b.traceReq[phase] = byOp
	}
	return nil
}

// interruptible returns a context that SIGINT and SIGTERM cancel, whether
// one of them came (name prefixes the line that says so), and the function
// that stops listening for them once the run has cleaned up.
func interruptible(name string) (context.Context, *atomic.Bool, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	interrupted := new(atomic.Bool)
	go func() {
		for sg := range sigs {
			fmt.Fprintf(os.Stderr, "%s: %v: stopping and cleaning up\n", name, sg)
			interrupted.Store(true)
			cancel()
		}
	}()
	return ctx, interrupted, func() {
		signal.Stop(sigs)
		cancel()
	}
}
