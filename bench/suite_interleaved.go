package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// On a shared machine the speed of everything drifts by up to 2x within
// minutes, so the main tables, measured system after system, make poor
// ratios. The goals' ratios come from this step instead: the systems
// take turns within each round, in an order that rotates from round to
// round, each round on new directories, stores and daemons, and a goal
// is the median of its rounds' ratios (medianRatio). What each system
// is compared with is like it: the mounts at --sync normal with the
// go-fuse loopback (neither syncs at a publish), the publish of the
// mounts at --sync full with the loopback whose daemon fdatasyncs at
// FLUSH (both on disk when close(2) returns), the core with the
// goqite-style queue (both in process).

// turnSystem is one system of the interleaved step: its name, the
// phases it runs, and how to run them for one round and client count.
type turnSystem struct {
	name string
	ops  []opKind
	run  func(ctx context.Context, label string, c, k int, ops []opKind, rec recorder) error
}

// interleavedSystems are the step's systems, in their order in a
// round's rotation: the references, then each transport's mounts.
func (s *suite) interleavedSystems(loopbackBin string) []turnSystem {
	publishOnly := []opKind{opPublish}
	loopback := func(sync bool) func(context.Context, string, int, int, []opKind, recorder) error {
		return func(ctx context.Context, label string, c, k int, ops []opKind, rec recorder) error {
			return s.loopbackTurn(ctx, loopbackBin, sync, label, c, k, ops, rec)
		}
	}
	systems := []turnSystem{
		{sysLoopback, allOps, loopback(false)},
		{sysLoopbackSync, publishOnly, loopback(true)},
		{sysGoqite, allOps, s.goqiteTurn},
		{sysInproc("sqlite", "normal"), allOps, s.coreTurn},
	}
	for _, t := range s.transports {
		for _, sync := range []string{"normal", "full"} {
			ops := allOps
			if sync == "full" {
				// Only the publish syncs at --sync full; the goals
				// compare it alone.
				ops = publishOnly
			}
			for _, store := range []string{"sqlite", "fs"} {
				spec := s.spec(store, sync, t)
				systems = append(systems, turnSystem{sysMount(store, sync, t), ops,
					func(ctx context.Context, label string, c, k int, ops []opKind, rec recorder) error {
						return s.mountTurn(ctx, spec, label, c, k, ops, rec)
					}})
			}
		}
	}
	return systems
}

// interleaveAccum adds up one system's operation over the rounds.
type interleaveAccum struct {
	ops            int
	wall           time.Duration
	lat            latencies
	cpuUS          float64
	others         float64
	requests       float64 // total
	haveRequests   bool
	daemonCPU      time.Duration
	daemonSwitches int64
	rounds         []float64 // ops/s of each round
}

func (s *suite) runInterleaved(ctx context.Context) error {
	k, rounds := s.cfg.interleaveMessages, s.cfg.rounds
	bin, err := buildLoopback(ctx, s.root, s.b.work)
	if err != nil {
		return err
	}
	systems := s.interleavedSystems(bin)
	type key struct {
		system, op string
		clients    int
	}
	acc := map[key]*interleaveAccum{}
	var order []key
	rec := func(system string) recorder {
		return func(op opKind, c int, m measured) {
			key := key{system, op.String(), c}
			a, ok := acc[key]
			if !ok {
				a = &interleaveAccum{}
				acc[key] = a
				order = append(order, key)
			}
			a.add(m)
		}
	}
	for round := range rounds {
		for _, c := range s.cfg.clients {
			for i := range systems {
				sys := systems[(i+round)%len(systems)]
				label := fmt.Sprintf("il-r%d-c%d", round, c)
				if err := sys.run(ctx, label, c, k, sys.ops, rec(sys.name)); err != nil {
					return fmt.Errorf("%s, round %d, %d client(s): %w", sys.name, round+1, c, err)
				}
			}
		}
		s.logf("interleaved: round %d of %d done", round+1, rounds)
	}
	for _, key := range order {
		s.res.Interleaved = append(s.res.Interleaved, acc[key].row(key.system, key.op, key.clients))
	}
	var names []string
	for _, sys := range systems {
		names = append(names, sys.name)
	}
	s.note(fmt.Sprintf("goal ratios come from the interleaved step: %d rounds of %d messages per operation and client count; in each round the %d systems take turns (%s), in an order that rotates by one from round to round, each round on new directories, stores and daemons; a goal is the median of its rounds' ratios, and a system's ops/s in the table the median of its rounds'; the mounts at --sync full and the loopback that fdatasyncs at flush run the publish only", rounds, k, len(systems), strings.Join(names, "; ")))
	return nil
}

// add adds one round's phase.
func (a *interleaveAccum) add(m measured) {
	n := len(m.phase.lat)
	a.ops += n
	a.wall += m.phase.wall
	a.lat = append(a.lat, m.phase.lat...)
	a.cpuUS += (m.cpu.ClientUSPerOp + m.cpu.DaemonUSPerOp) * float64(n)
	a.others += m.cpu.OthersShare * m.phase.wall.Seconds()
	a.daemonCPU += m.cpu.daemonCPU
	a.daemonSwitches += m.cpu.daemonSwitches
	a.rounds = append(a.rounds, opsPerSec(n, m.phase.wall))
	if m.counts != nil {
		a.requests += float64(m.counts.Requests["total"])
		a.haveRequests = true
	}
}

// row is the accumulated system's row: ops/s the median of the rounds',
// latencies, CPU and requests over all rounds together (the daemon's
// CPU is counted in 10 ms ticks: a round's phase holds a few of them,
// all rounds together enough).
func (a *interleaveAccum) row(system, op string, c int) row {
	sum := a.lat.summary()
	ops := float64(max(a.ops, 1))
	med, _ := median(a.rounds)
	r := row{System: system, Op: op, Clients: c, Ops: a.ops, Seconds: round2(a.wall.Seconds()), OpsPerSec: round1(med),
		P50US: sum.P50US, P99US: sum.P99US, CPUSecPer10k: round4(a.cpuUS / ops * 1e4 / 1e6),
		DaemonCPUUS: round1(float64(a.daemonCPU) / 1e3 / ops), DaemonSwitchesPerOp: round2(float64(a.daemonSwitches) / ops),
		OthersShare: round2(a.others / max(a.wall.Seconds(), 1e-9)), RequestsPerOp: -1, FsyncsPerOp: -1,
		RoundOpsPerSec: a.rounds}
	if a.haveRequests {
		r.RequestsPerOp = round2(a.requests / ops)
	}
	return r
}

// loopbackTurn runs a round of the go-fuse loopback (syncAtFlush: the
// one whose daemon fdatasyncs at FLUSH) on a new directory.
func (s *suite) loopbackTurn(ctx context.Context, bin string, syncAtFlush bool, label string, c, k int, ops []opKind, rec recorder) error {
	name := "loopback-"
	if syncAtFlush {
		name = "loopback-sync-"
	}
	dir, err := s.newWorkDir(name + label)
	if err != nil {
		return err
	}
	d, err := startLoopback(bin, dir, s.cfg.cacheTimeout, syncAtFlush)
	if err != nil {
		return err
	}
	s.b.current = d
	s.b.atExit(func() { d.stop() })
	inbox, processing := filepath.Join(d.mnt, "inbox"), filepath.Join(d.mnt, "processing")
	for _, p := range []string{inbox, processing} {
		if err := unix.Mkdir(p, 0o755); err != nil {
			return err
		}
	}
	if err := s.runFusePhases(ctx, d, inbox, processing, c, k, "il", ops, rec); err != nil {
		return err
	}
	return d.stop()
}

// mountTurn runs a round of a yirangmq mount on a new store and daemon.
func (s *suite) mountTurn(ctx context.Context, spec mountSpec, label string, c, k int, ops []opKind, rec recorder) error {
	d, err := s.b.mount(spec, label)
	if err != nil {
		return err
	}
	qdir := filepath.Join(d.mnt, "il")
	if err := setupQueue(qdir); err != nil {
		return err
	}
	if err := s.runFusePhases(ctx, d, filepath.Join(qdir, "inbox"), filepath.Join(qdir, "processing"), c, k, "il", ops, rec); err != nil {
		return err
	}
	return d.stop()
}

// goqiteTurn runs a round of the goqite-style queue on a new database.
func (s *suite) goqiteTurn(ctx context.Context, label string, c, k int, _ []opKind, rec recorder) error {
	dir, err := s.newWorkDir("goqite-" + label)
	if err != nil {
		return err
	}
	g, err := openGoqite(ctx, dir)
	if err != nil {
		return err
	}
	defer g.Close()
	return s.runGoqitePhases(ctx, g, k, c, rec)
}

// coreTurn runs a round of the queue core in process on a new sqlite
// store at --sync normal.
func (s *suite) coreTurn(ctx context.Context, label string, c, k int, _ []opKind, rec recorder) error {
	core, closeCore, err := s.openInproc(ctx, "inproc-"+label, queuecore.SyncNormal)
	if err != nil {
		return err
	}
	err = s.runQueuecore(ctx, core, "il", k, c, rec)
	if cerr := closeCore(); err == nil {
		err = cerr
	}
	return err
}
