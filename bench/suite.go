package main

// The suite behind `make bench` (issue 6): yirangmq against the
// alternatives, on this machine, in one run, bounded in time.
//
//	cd bench && go run . suite [--quick] [--million] [--out-dir results]
//
// With 256-byte messages and 1 and 4 clients it measures publish, lease,
// ack and the round trip (publish+lease+ack of one message) on:
//
//   - a plain directory of the same disk, with no fsync and as a careful
//     Maildir writer does it (write, fsync, rename into place, fsync dir);
//   - a go-fuse loopback mount of a plain directory (child process, the
//     daemon's mount options): the price of FUSE itself; and the same
//     loopback syncing at FLUSH, the like of a --sync full publish;
//   - yirangmq through the mount, sqlite and fs stores, --sync normal and
//     full, on each transport asked for (classic, io_uring; transport.go)
//     (bin/yirangmq mount, as mountbench starts it);
//   - queuecore in process on the sqlite store, normal and full;
//   - a goqite-style SQLite queue in process (goqite.go);
//   - POSIX message queues (testdata/mqbench.c), the in-kernel floor;
//
// and, on the mounts, the .next wake-up (against inotify on a plain
// directory and a blocked mq_receive), the lease-expiry redelivery, CPU
// per 10,000 messages, RSS after mount, after many messages and with
// many ready, and idle CPU and wakeups. Every figure is related to the
// plain directory and to the FUSE request floor; the goals of the issues
// are checked at the end, each ratio the median of rounds in which the
// systems took turns (suite_interleaved.go). Results go to OUT-DIR/bench-STAMP.{json,png}
// and OUT-DIR/bench-latest.{json,png}; docs/bench.md explains them.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// suiteConfig is how much the suite does; --quick picks smaller counts.
type suiteConfig struct {
	quick, million, keep bool
	clients              []int
	backends, syncs      []string

	messages           int // per phase: plain directory, loopback and mounts
	durableMessages    int // per phase: plain directory with fsync
	inprocMessages     int // per phase: queuecore normal, goqite
	inprocFull         int // per phase: queuecore full (fsync-bound)
	mqMessages         int // per phase: POSIX mqueue
	nextSamples        int // wake-ups per mount (and inotify, mqueue)
	expirySamples      int // redeliveries per mount
	churnMessages      int // round trips before the "after many messages" RSS
	ready              int // ready messages of the scale run
	scaleRoundTrips    int // round trips per queue in the scale run
	floorOps           int
	warmup             int
	idle               time.Duration
	interleaveMessages int           // per operation and round of the interleaved step
	rounds             int           // rounds of the steps whose systems take turns (interleaved, 1 MiB, latency)
	bigMessages        int           // 1 MiB messages per system and round (0: skip)
	latencyPeak        int           // round trips of the peak before the paced load
	latencyLength      time.Duration // the paced load per store (0: skip)

	cacheTimeout          time.Duration
	outDir, bin, workBase string
	jsonOut               string // --json: this run's JSON, partial or not, also here
	// transports are --transports; transportsSet whether it was given
	// (else both when the build and the kernel offer io_uring).
	transports    []string
	transportsSet bool
	// only names the steps to run (their keys in suite.run); empty: all.
	// For looking at one step; the goals of the steps left out are
	// reported as not measured.
	only []string
}

// suiteStep is one step of the suite; key names it for --only.
type suiteStep struct {
	key, name string
	run       func(context.Context) error
}

// steps are the suite's steps, in their order. A nil s gives their keys
// and names (the run funcs are then not to be called).
func (s *suite) steps() []suiteStep {
	return []suiteStep{
		{"floor", "FUSE request floor", s.runFloorStart},
		{"plain", "plain directory", s.runPlain},
		{"loopback", "go-fuse loopback", s.runLoopback},
		{"mounts", "yirangmq mounts", s.runMounts},
		{"churn", "many messages through the mount", s.runChurn},
		{"scale", "many ready messages", s.runScale},
		{"inproc", "queuecore in process", s.runInproc},
		{"goqite", "goqite-style queue", s.runGoqite},
		{"interleaved", "goal ratios, interleaved", s.runInterleaved},
		{"big", "1 MiB messages", s.runBig},
		{"latency", "latency under a paced load", s.runLatency},
		{"mqueue", "POSIX mqueue", s.runMQueue},
		{"inotify", "inotify wake-up", s.runInotify},
		{"idle", "idle daemons", s.runIdle},
	}
}

// stepKeys are the keys of the suite's steps, in their order (--only).
func stepKeys() []string {
	var keys []string
	for _, st := range (*suite)(nil).steps() {
		keys = append(keys, st.key)
	}
	return keys
}

func defaultSuiteConfig(quick bool) suiteConfig {
	c := suiteConfig{
		quick: quick, clients: []int{1, 4},
		backends: []string{"sqlite", "fs"}, syncs: []string{"normal", "full"},
		messages: 3000, durableMessages: 500, inprocMessages: 20000, inprocFull: 3000, mqMessages: 200000,
		nextSamples: 300, expirySamples: 10, churnMessages: 100_000, ready: 100_000, scaleRoundTrips: 2000,
		floorOps: 20000, warmup: 200, idle: 60 * time.Second, cacheTimeout: time.Second,
		interleaveMessages: 1000, rounds: 5,
		bigMessages: 64, latencyPeak: 2000, latencyLength: 20 * time.Second,
		outDir: "results", workBase: defaultWorkBase(),
	}
	if quick {
		c.messages, c.durableMessages, c.inprocMessages, c.inprocFull, c.mqMessages = 800, 200, 4000, 800, 50000
		c.nextSamples, c.expirySamples, c.churnMessages, c.ready, c.scaleRoundTrips = 100, 4, 10_000, 20_000, 400
		c.floorOps, c.warmup, c.idle = 5000, 100, 10*time.Second
		c.interleaveMessages = 250
		c.bigMessages, c.latencyPeak, c.latencyLength = 24, 600, 6*time.Second
	}
	return c
}

func suiteMain(args []string) int {
	quick := false
	for _, a := range args {
		if a == "--quick" || a == "--quick=true" {
			quick = true
		}
	}
	cfg := defaultSuiteConfig(quick)
	fl := pflag.NewFlagSet("mountbench suite", pflag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintln(os.Stderr, "Usage: (cd bench && go run . suite [OPTIONS])\n\nCompares yirangmq (through the mount and in process) with a plain directory,\na go-fuse loopback mount, a goqite-style SQLite queue and POSIX message queues;\nprints the tables and the goals, writes OUT-DIR/bench-*.{json,png} (docs/bench.md).\n\nOptions (counts default to the full mode's, or --quick's):")
		fl.PrintDefaults()
	}
	fl.BoolVar(&cfg.quick, "quick", quick, "the short run (about 2-3 minutes): fewer messages, a 10 s idle window, 20k ready")
	fl.BoolVar(&cfg.million, "million", false, "the scale run with 1,000,000 ready messages instead of --ready")
	fl.IntSliceVar(&cfg.clients, "clients", cfg.clients, "client counts")
	fl.IntVar(&cfg.messages, "messages", cfg.messages, "messages per phase through the mounts, the loopback and the plain directory")
	fl.IntVar(&cfg.churnMessages, "churn", cfg.churnMessages, "round trips through the sqlite/normal mount before its \"after many messages\" RSS (0: skip)")
	fl.IntVar(&cfg.ready, "ready", cfg.ready, "ready messages of the scale run (0: skip)")
	fl.DurationVar(&cfg.idle, "idle", cfg.idle, "idle window of the daemons (CPU, wakeups)")
	fl.IntVar(&cfg.interleaveMessages, "interleaved", cfg.interleaveMessages, "messages per operation and round of the interleaved step (the goals' ratios)")
	fl.IntVar(&cfg.rounds, "rounds", cfg.rounds, "rounds of the steps whose systems take turns (interleaved, 1 MiB, latency): each goal ratio is the median of its rounds' ratios")
	fl.IntVar(&cfg.bigMessages, "big", cfg.bigMessages, "1 MiB messages per system and round of the bandwidth step (0: skip)")
	fl.DurationVar(&cfg.latencyLength, "latency", cfg.latencyLength, "length of the paced load per store and transport of the latency step, all rounds together (0: skip)")
	fl.StringSliceVar(&cfg.transports, "transports", []string{transportClassic, transportUring}, "the daemon's transports to measure (classic, uring); default: both when the build has --transport and the kernel offers io_uring ("+uringParam+" is Y), else classic; a build without --transport is started without it")
	fl.StringVar(&cfg.outDir, "out-dir", cfg.outDir, "where to write bench-STAMP.{json,png} and bench-latest.{json,png}")
	fl.StringVar(&cfg.jsonOut, "json", "", "also write this run's JSON to FILE, a partial run's (--only) too (never bench-latest.json: the next run's comparison takes whole runs only)")
	fl.StringVar(&cfg.bin, "bin", "", "yirangmq binary (default: build ./cmd/yirangmq of this checkout)")
	fl.StringVar(&cfg.workBase, "workdir", cfg.workBase, "where to make the working directory (same disk as the stores; not under $TMPDIR, whose mounts tests may sweep)")
	fl.BoolVar(&cfg.keep, "keep", false, "keep the working directory (daemon logs, stores)")
	fl.StringSliceVar(&cfg.only, "only", nil, "run only these steps ("+strings.Join(stepKeys(), ", ")+"; the floor always runs); for looking at one step: the goals of the others are not measured, and nothing is written to --out-dir")
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if cfg.million {
		cfg.ready = 1_000_000
	}
	cfg.transportsSet = fl.Changed("transports")
	for _, k := range cfg.only {
		if !slices.Contains(stepKeys(), k) {
			fmt.Fprintf(os.Stderr, "mountbench suite: --only %s: no such step (%s)\n", k, strings.Join(stepKeys(), ", "))
			return 2
		}
	}
	if slices.Contains(cfg.only, "idle") && !slices.ContainsFunc(cfg.only, func(k string) bool {
		return k == "loopback" || k == "mounts" || k == "churn" || k == "scale"
	}) {
		fmt.Fprintln(os.Stderr, "mountbench suite: --only idle needs a step that leaves daemons to watch (loopback, mounts, churn or scale)")
		return 2
	}
	for _, n := range cfg.clients {
		if n < 1 || n > 256 {
			fmt.Fprintf(os.Stderr, "mountbench suite: --clients %d: want 1..256\n", n)
			return 2
		}
	}
	if cfg.messages < 1 || cfg.interleaveMessages < 1 || cfg.rounds < 1 || cfg.idle < time.Second {
		fmt.Fprintln(os.Stderr, "mountbench suite: --messages, --interleaved and --rounds must be positive and --idle at least 1s")
		return 2
	}

	ctx, interrupted, stop := interruptible("mountbench suite")
	s := newSuite(cfg, os.Stderr)
	err := s.run(ctx)
	if err != nil && s.b.current != nil && !interrupted.Load() {
		fmt.Fprintf(os.Stderr, "mountbench suite: the last lines of the last daemon's log (%s):\n%s\n", s.b.current.logPath, s.b.current.tail(3000))
	}
	s.b.cleanup()
	stop()
	switch {
	case interrupted.Load():
		fmt.Fprintln(os.Stderr, "mountbench suite: interrupted; cleaned up")
		return 130
	case err != nil:
		fmt.Fprintln(os.Stderr, "mountbench suite:", err)
		return 1
	}
	return 0
}

// suite is one run. It borrows mountbench's bench for the daemons, the
// floor probes, the perf counters and the cleanup list.
type suite struct {
	cfg  suiteConfig
	b    *bench
	log  io.Writer
	root string // the module's directory
	res  suiteResults
	live []*liveDaemon // daemons kept for the idle window
	// transports are the daemon's transports measured; binHasTransport
	// whether the build takes --transport (transportFlag).
	transports      []string
	binHasTransport bool
	transportWhy    string // why a run is classic only, when it is by default
}

// spec is how the suite mounts store at sync on transport.
func (s *suite) spec(store, sync, transport string) mountSpec {
	return mountSpec{backend: store, sync: sync, transport: transportFlag(transport, s.binHasTransport), cacheTimeout: s.cfg.cacheTimeout}
}

// liveDaemon is a daemon whose memory and idle cost the suite reports.
type liveDaemon struct {
	system string
	d      *daemon
	rss    rssMiB // right after the mount was ready
}

func newSuite(cfg suiteConfig, log io.Writer) *suite {
	bcfg := config{
		clients: cfg.clients, bin: cfg.bin, workBase: cfg.workBase, count: "auto",
		floorOps: cfg.floorOps, cacheTimeout: cfg.cacheTimeout, warmup: cfg.warmup, traceOps: 0,
	}
	return &suite{cfg: cfg, log: log, b: &bench{cfg: bcfg, log: log}}
}

func (s *suite) logf(format string, args ...any) {
	fmt.Fprintf(s.log, "bench: "+format+"\n", args...)
}

func (s *suite) note(n string) {
	for _, have := range s.res.Notes {
		if have == n {
			return
		}
	}
	s.res.Notes = append(s.res.Notes, n)
}

func (s *suite) run(ctx context.Context) error {
	start := time.Now()
	b := s.b
	detachDeadBenchMounts()
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	s.root = root
	if err := os.MkdirAll(s.cfg.workBase, 0o755); err != nil {
		return err
	}
	removeStaleSuiteDirs(s.cfg.workBase, s.logf)
	work, err := os.MkdirTemp(s.cfg.workBase, suiteDirPrefix)
	if err != nil {
		return err
	}
	b.work = work
	// Held as long as we live: tells a later run that this directory
	// is not a leftover.
	lock, err := os.Create(filepath.Join(work, suiteLockName))
	if err != nil {
		return err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	b.atExit(func() { lock.Close() })
	if err := spreadSubdirs(work); err != nil {
		s.note(fmt.Sprintf("the work directory is not a chattr +T top directory (%v): its subdirectories share block groups", err))
	}
	b.atExit(func() {
		if s.cfg.keep {
			s.logf("kept %s", work)
			return
		}
		if err := os.RemoveAll(work); err != nil {
			s.logf("remove %s: %v", work, err)
		}
	})
	if s.cfg.bin != "" {
		// A copy: others may rebuild bin/yirangmq while we run, and
		// every daemon of a run must be the same program.
		cp := filepath.Join(work, "yirangmq")
		if err := copyFile(s.cfg.bin, cp); err != nil {
			return fmt.Errorf("copy --bin: %w", err)
		}
		if err := evictCached(cp); err != nil {
			return fmt.Errorf("copy --bin: %w", err)
		}
		b.cfg.bin = cp
	}
	if err := b.setup(ctx); err != nil {
		return err
	}
	if err := s.setTransports(); err != nil {
		return err
	}
	mode := "full"
	if s.cfg.quick {
		mode = "quick"
	}
	s.res = suiteResults{
		Started: b.res.Started, Mode: mode, Million: s.cfg.million, Kernel: b.res.Kernel, CPUs: b.res.CPUs,
		GoVersion: b.res.GoVersion, Filesystem: b.res.Filesystem, Workdir: work, LoadBefore: b.res.LoadBefore,
		MessageBytes: msgSize, CacheTimeout: s.cfg.cacheTimeout.String(), CountSource: b.res.CountSource,
		Transports: s.transports, Rounds: s.cfg.rounds,
	}
	if s.transportWhy != "" {
		s.note(s.transportWhy)
	}
	for _, st := range s.steps() {
		// The floor's mount is what later steps probe: it always runs.
		if len(s.cfg.only) > 0 && st.key != "floor" && !slices.Contains(s.cfg.only, st.key) {
			continue
		}
		t0 := time.Now()
		s.logf("== %s", st.name)
		if err := st.run(ctx); err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		s.logf("== %s: %.1f s", st.name, time.Since(t0).Seconds())
	}
	s.res.Seconds = round1(time.Since(start).Seconds())
	s.res.LoadAfter = loadavg()
	s.finishNotes()
	s.res.computeRatios()
	s.res.Goals = s.res.computeGoals()
	stamp := time.Now().UTC().Format("20060102T150405Z")
	out := s.cfg.outDir
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	// The run before this one in the same results directory: each goal's
	// previous value goes next to the new one, before it is overwritten.
	if prev, err := readResults(filepath.Join(out, "bench-latest.json")); err == nil {
		s.res.comparePrevious(prev, filepath.Join(out, "bench-latest.json"))
	} else if !errors.Is(err, os.ErrNotExist) {
		s.note(fmt.Sprintf("no comparison with the previous run: %v", err))
	}
	s.res.report(os.Stdout)
	if len(s.res.Notes) > 0 {
		fmt.Println("\nNotes:")
		for _, n := range s.res.Notes {
			fmt.Println("- " + n)
		}
	}
	if s.cfg.jsonOut != "" {
		if err := s.res.writeJSON(s.cfg.jsonOut); err != nil {
			return err
		}
		s.logf("wrote %s", s.cfg.jsonOut)
	}
	if len(s.cfg.only) > 0 {
		// A partial run's goals would stand for the whole run's next
		// to the next full run: it writes nothing there.
		s.logf("--only %s: nothing written to %s", strings.Join(s.cfg.only, ","), out)
		return nil
	}
	files, err := s.res.writeFiles(out, stamp)
	if err != nil {
		return err
	}
	s.logf("wrote %s", strings.Join(files, ", "))
	return nil
}

// setTransports decides the transports of the run (chooseTransports)
// from the build's flags and the kernel's switch; the floor's daemon
// serves on the first.
func (s *suite) setTransports() error {
	has, err := binHasTransport(s.b.cfg.bin)
	if err != nil {
		return err
	}
	on, state := kernelUring()
	ts, why, err := chooseTransports(s.cfg.transports, s.cfg.transportsSet, has, on, state)
	if err != nil {
		return err
	}
	s.transports, s.binHasTransport, s.transportWhy = ts, has, why
	s.b.cfg.transport = transportFlag(ts[0], has)
	if why != "" {
		s.logf("%s", why)
	}
	s.logf("transports: %s (the build %s --transport)", strings.Join(ts, ", "), map[bool]string{true: "has", false: "has no"}[has])
	return nil
}

func (s *suite) finishNotes() {
	s.note("ops/s: messages ÷ wall time of the phase, all clients together; p50/p99 per operation; round trip = publish, lease and ack of one message by one client, in a row")
	s.note("through a mount and on the plain directory, each client count has a new directory (or store and daemon) in a block group of its own; publish, lease and ack run there one after the other (all messages each), then the round trips (so those create files where many were just deleted)")
	s.note(fmt.Sprintf("mount phases: --cache-timeout %s, queue archive off, visibility timeout 1 h, after %d untimed publish+lease+ack", s.cfg.cacheTimeout, s.cfg.warmup))
	s.note("CPU s per 10k: user+system CPU of the client (this process, or mqbench; /proc/PID/stat) plus the daemon's time on a CPU (the yirangmq or loopback child; /proc/PID/task/*/schedstat), per 10,000 operations")
	s.note("in process: queuecore lease = Core.Next (non-blocking), ack = Core.Ack; goqite-style lease = receive (UPDATE … RETURNING), ack = delete; POSIX mqueue has no ack (a received message is gone)")
}

// runFloorStart mounts the floor's daemon (--cache-timeout 0s) and probes
// the floor once at length.
func (s *suite) runFloorStart(ctx context.Context) error {
	if err := s.b.startFloorMount(); err != nil {
		return err
	}
	return s.probeFloor(ctx, "start", s.cfg.floorOps)
}

// probeFloor probes the FUSE request floor (fstat) for every client count
// and records it as measured before system.
func (s *suite) probeFloor(ctx context.Context, system string, n int) error {
	ref, err := s.b.probeFloor(ctx, system, n, []floorKind{floorFstat})
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	for _, c := range s.cfg.clients {
		s.res.Floor = append(s.res.Floor, floorProbe{Before: system, Clients: c, USPerRequest: ref[c].meanUS, P50US: ref[c].p50US})
	}
	return nil
}

// addRow records a measured phase.
func (s *suite) addRow(r row) {
	s.res.Rows = append(s.res.Rows, r)
	s.logf("%-24s %-9s c=%d: %9.0f ops/s p50 %7.1f µs p99 %8.1f µs, %s CPU s/10k, %s req/op",
		r.System, r.Op, r.Clients, r.OpsPerSec, r.P50US, r.P99US, cpuCell(r.CPUSecPer10k), num(r.RequestsPerOp))
}

// phaseRow turns a measured phase into a row.
func phaseRow(system string, op opKind, clients int, m measured) row {
	ops := len(m.phase.lat)
	sum := m.phase.lat.summary()
	r := row{System: system, Op: op.String(), Clients: clients, Ops: ops, Seconds: round2(m.phase.wall.Seconds()),
		OpsPerSec: opsPerSec(ops, m.phase.wall), P50US: sum.P50US, P99US: sum.P99US,
		ClientCPUUS: m.cpu.ClientUSPerOp, DaemonCPUUS: m.cpu.DaemonUSPerOp, DaemonSwitchesPerOp: m.cpu.DaemonSwitchesPerOp,
		OthersShare: m.cpu.OthersShare, RequestsPerOp: -1, FsyncsPerOp: -1}
	r.CPUSecPer10k = round4((m.cpu.ClientUSPerOp + m.cpu.DaemonUSPerOp) * 1e4 / 1e6)
	if m.counts != nil {
		r.RequestsPerOp, r.Requests = perOp(m.counts.Requests, ops)
		if m.counts.Fsyncs >= 0 {
			r.FsyncsPerOp = round2(float64(m.counts.Fsyncs) / float64(ops))
		}
	}
	return r
}

// runPlain runs the operations on plain directories of the same disk,
// without fsync and as a careful Maildir writer does.
func (s *suite) runPlain(ctx context.Context) error {
	for _, durable := range []bool{false, true} {
		system, n := sysPlain, s.cfg.messages
		if durable {
			system, n = sysPlainFsync, s.cfg.durableMessages
		}
		for _, c := range s.cfg.clients {
			root := filepath.Join(s.b.work, fmt.Sprintf("plain-%v-c%d", durable, c))
			q := queueDirs{inbox: filepath.Join(root, "inbox"), processing: filepath.Join(root, "processing"), durable: durable}
			if durable {
				q.tmp = filepath.Join(root, "tmp")
			}
			for _, p := range []string{q.inbox, q.processing, q.tmp} {
				if p == "" {
					continue
				}
				if err := os.MkdirAll(p, 0o755); err != nil {
					return err
				}
			}
			for _, op := range []opKind{opPublish, opLease, opAck, opRoundTrip} {
				m, err := s.b.measure(nil, "", func() (phaseResult, error) { return runPhase(ctx, q, op, "t", n, c) })
				if err != nil {
					return fmt.Errorf("%s %s c=%d: %w", system, op, c, err)
				}
				s.addRow(phaseRow(system, op, c, m))
			}
		}
	}
	return nil
}

// recorder takes a measured phase of a system.
type recorder func(op opKind, clients int, m measured)

// addTo is the recorder of the main tables.
func (s *suite) addTo(system string) recorder {
	return func(op opKind, c int, m measured) { s.addRow(phaseRow(system, op, c, m)) }
}

// runFuseOps runs publish, lease, ack and round trip, n messages each,
// in inbox/ and processing/ through mount d, after a warm-up, with the
// request counters on.
func (s *suite) runFuseOps(ctx context.Context, d *daemon, inbox, processing string, c, n int, pass string, rec recorder) error {
	return s.runFusePhases(ctx, d, inbox, processing, c, n, pass, allOps, rec)
}

// allOps are the phases of a system in the main tables, in their order.
var allOps = []opKind{opPublish, opLease, opAck, opRoundTrip}

// runFusePhases is runFuseOps for some of the phases.
func (s *suite) runFusePhases(ctx context.Context, d *daemon, inbox, processing string, c, n int, pass string, ops []opKind, rec recorder) error {
	q := queueDirs{inbox: inbox, processing: processing}
	for _, op := range []opKind{opPublish, opLease, opAck} {
		if _, err := runPhase(ctx, q, op, pass+"-warmup", s.cfg.warmup, 1); err != nil {
			return fmt.Errorf("warm-up %s: %w", op, err)
		}
	}
	for _, op := range ops {
		m, err := s.b.measure(d, d.store, func() (phaseResult, error) { return runPhase(ctx, q, op, pass, n, c) })
		if err != nil {
			return fmt.Errorf("%s c=%d: %w", op, c, err)
		}
		rec(op, c, m)
	}
	return nil
}

// keep registers d for the idle window, with its RSS now.
func (s *suite) keep(system string, d *daemon) *liveDaemon {
	l := &liveDaemon{system: system, d: d, rss: procRSS(d.pid())}
	s.live = append(s.live, l)
	return l
}

// procRSSMiB is VmRSS of pid in MiB (0 if unknown).
func procRSSMiB(pid int) float64 { return procRSS(pid).total }

// rssMiB is a process's resident memory in MiB: VmRSS, and its parts
// RssAnon (heap, stacks, written data: the daemon's own) and RssFile
// (pages of the binary and libraries mapped from the page cache, clean
// and shared; how many depends on the folios the page cache holds them
// in, see evictCached).
type rssMiB struct{ total, anon, file float64 }

// procRSS reads pid's resident memory from /proc/PID/status (zeros if
// unknown).
func procRSS(pid int) rssMiB {
	var r rssMiB
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return r
	}
	for _, line := range strings.Split(string(b), "\n") {
		key, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		switch key {
		case "VmRSS":
			r.total = round1(kb / 1024)
		case "RssAnon":
			r.anon = round1(kb / 1024)
		case "RssFile":
			r.file = round1(kb / 1024)
		}
	}
	return r
}

// procSwitches is the context switches (voluntary and not) of all of
// pid's threads: each one a time a thread went to sleep or was put off
// the CPU, so the count of its wakeups.
func procSwitches(pid int) int64 {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/status")
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, k := range []string{"voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"} {
				if v, ok := strings.CutPrefix(line, k); ok {
					x, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					n += x
				}
			}
		}
	}
	return n
}

// runIdle leaves every kept daemon alone for the idle window, all at
// once, and measures their CPU time and wakeups over it.
func (s *suite) runIdle(ctx context.Context) error {
	if err := s.b.floorMnt.stop(); err != nil {
		return fmt.Errorf("stop the floor's daemon: %w", err)
	}
	type sample struct {
		cpu time.Duration
		sw  int64
	}
	// Let the last phase's writes and timers settle first.
	if err := sleepCtx(ctx, time.Second); err != nil {
		return err
	}
	before := make([]sample, len(s.live))
	for i, l := range s.live {
		cpu, _ := procCPU(l.d.pid())
		before[i] = sample{cpu, procSwitches(l.d.pid())}
	}
	t0 := time.Now()
	s.logf("idle window: %d daemons for %v", len(s.live), s.cfg.idle)
	if err := sleepCtx(ctx, s.cfg.idle); err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	for i, l := range s.live {
		if l.d.gone() {
			return fmt.Errorf("%s: the daemon exited during the idle window:\n%s", l.system, l.d.tail(2000))
		}
		cpu, _ := procCPU(l.d.pid())
		sw := procSwitches(l.d.pid())
		end := procRSS(l.d.pid())
		r := resourceRow{System: l.system, PID: l.d.pid(), RSSIdleMiB: l.rss.total, RSSAnonMiB: l.rss.anon, RSSFileMiB: l.rss.file,
			RSSEndMiB: end.total, RSSEndAnonMiB: end.anon, RSSEndFileMiB: end.file, IdleSeconds: round1(secs),
			IdleCPUMSPerS: round2(float64(cpu-before[i].cpu) / 1e6 / secs), WakeupsPerSec: round2(float64(sw-before[i].sw) / secs)}
		s.res.Resources = append(s.res.Resources, r)
		s.logf("%-40s RSS %.1f (anon %.1f, file %.1f) → %.1f MiB (anon %.1f, file %.1f), idle CPU %.2f ms/s, %.2f wakeups/s",
			r.System, r.RSSIdleMiB, r.RSSAnonMiB, r.RSSFileMiB, r.RSSEndMiB, r.RSSEndAnonMiB, r.RSSEndFileMiB, r.IdleCPUMSPerS, r.WakeupsPerSec)
	}
	s.note("idle: every kept daemon is left alone at the same time for the idle window after all phases (the yirangmq daemons after their phases, so with timers and caches as work left them); CPU from /proc/PID/stat utime+stime (10 ms ticks), wakeups = voluntary + involuntary context switches of all threads from /proc/PID/task/*/status")
	return nil
}

const (
	suiteDirPrefix = workPrefix + "suite-"
	suiteLockName  = "suite.lock"
)

// removeStaleSuiteDirs removes the work directories that killed runs
// left in base: those whose lock nobody holds and under which nothing is
// mounted.
func removeStaleSuiteDirs(base string, logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(base, suiteDirPrefix+"*"))
	mounts, _ := os.ReadFile("/proc/self/mounts")
	for _, dir := range dirs {
		if strings.Contains(string(mounts), " "+dir+"/") {
			continue
		}
		f, err := os.Open(filepath.Join(dir, suiteLockName))
		if err != nil {
			continue // not ours, or still being made
		}
		free := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
		f.Close()
		if free {
			logf("removing %s, left by a killed run", dir)
			if err := os.RemoveAll(dir); err != nil {
				logf("remove %s: %v", dir, err)
			}
		}
	}
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o755)
}

// evictCached writes path to the disk and drops its pages from the page
// cache, so that the daemons started from it read it from the disk, as
// an installed binary is read after a boot.
//
// It makes the RSS rows comparable from run to run. Every page of a
// binary a process maps from the page cache counts in its RssFile, and
// the kernel maps a whole folio at a fault: a file just written in one
// piece (the copy above, or a linker's output) sits in the page cache in
// large folios, so the text and read-only data of a daemon started from
// it are nearly all resident at once. The same yirangmq build measured
// 19.7 MiB after mount that way, 16.5 MiB started from the disk (RssFile
// 15.0 against 11.8 MiB; RssAnon 4.7 MiB both). The resource rows give
// RssAnon and RssFile apart.
func evictCached(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("fdatasync %s: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("drop %s from the page cache: %w", path, err)
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runInotify measures the plain directory's wake-up: a reader blocked in
// read(2) of an inotify descriptor watching inbox/ (IN_CLOSE_WRITE), a
// publish (create+write+close) from another thread.
func (s *suite) runInotify(ctx context.Context) error {
	dir := filepath.Join(s.b.work, "plain-inotify")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lat, err := runInotifyWake(ctx, dir, s.cfg.nextSamples)
	if err != nil {
		return err
	}
	sum := lat.summary()
	s.res.Wake = append(s.res.Wake, wakeRow{System: sysPlain, How: "inotify read blocked (IN_CLOSE_WRITE), create+write+close from another thread",
		Samples: sum.N, P50US: sum.P50US, P99US: sum.P99US})
	s.logf("inotify wake-up: p50 %.1f µs p99 %.1f µs", sum.P50US, sum.P99US)
	return nil
}

func runInotifyWake(ctx context.Context, dir string, samples int) (latencies, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE); err != nil {
		return nil, err
	}
	goCh := make(chan struct{})
	tidCh := make(chan int, 1)
	doneCh := make(chan error, 1)
	var at atomic.Int64
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tidCh <- unix.Gettid()
		buf := make([]byte, 4096)
		for range goCh {
			_, err := unix.Read(fd, buf)
			at.Store(time.Now().UnixNano())
			doneCh <- err
		}
	}()
	defer close(goCh)
	tid := <-tidCh
	body := make([]byte, msgSize)
	var lat latencies
	for i := range samples {
		if ctx.Err() != nil {
			return lat, ctx.Err()
		}
		goCh <- struct{}{}
		if !waitSleeping(tid, 200*time.Millisecond) {
			time.Sleep(2 * time.Millisecond)
		}
		name := filepath.Join(dir, fmt.Sprintf("w-%06d", i))
		t0 := time.Now()
		if err := publish(name, body, false, -1); err != nil {
			return lat, err
		}
		select {
		case err := <-doneCh:
			if err != nil {
				return lat, fmt.Errorf("read inotify: %w", err)
			}
		case <-time.After(10 * time.Second):
			return lat, errors.New("inotify did not wake the reader within 10 s")
		}
		lat = append(lat, time.Duration(at.Load()-t0.UnixNano()))
		if err := unix.Unlink(name); err != nil {
			return lat, err
		}
	}
	return lat, nil
}

// waitSleeping waits until thread tid of this process sleeps (state S).
func waitSleeping(tid int, limit time.Duration) bool {
	path := "/proc/self/task/" + strconv.Itoa(tid) + "/stat"
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(path)
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && len(b) > i+2 && b[i+2] == 'S' {
			return true
		}
		time.Sleep(50 * time.Microsecond)
	}
	return false
}
