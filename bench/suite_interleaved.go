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
// ratios. The goals' ratios (the mount against the loopback and against
// the goqite-style queue, the core against goqite) come from this step
// instead: the systems take turns, in a rotating order, for a few
// rounds, each round on new directories, stores and daemons, and each
// system's figure adds up all its rounds. The goals' mounts are the
// daemon's default options (--sync full), on both local stores; the
// mounts at --sync normal take their turns too, in no goal, to show the
// mounts without the sync at close.

// interleaveAccum adds up one system's operation over the rounds.
type interleaveAccum struct {
	ops          int
	wall         time.Duration
	lat          latencies
	cpuUS        float64
	others       float64
	requests     float64 // total
	haveRequests bool
}

func (s *suite) runInterleaved(ctx context.Context) error {
	// The mounts at --sync normal are not in the goals: they show, in the
	// same run, the mounts without the sync at close, as the loopback and
	// goqite-style (synchronous=NORMAL) run, so the part of a goal's gap
	// that is the disk's fsync can be told from the daemon's.
	systems := []string{sysLoopback, sysMount("sqlite", goalSync), sysGoqite, sysMount("fs", goalSync), sysInproc("sqlite", "normal"), sysMount("sqlite", "normal"), sysMount("fs", "normal")}
	k, rounds := s.cfg.interleaveMessages, s.cfg.interleaveRounds
	bin, err := buildLoopback(ctx, s.root, s.b.work)
	if err != nil {
		return err
	}
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
			n := len(m.phase.lat)
			a.ops += n
			a.wall += m.phase.wall
			a.lat = append(a.lat, m.phase.lat...)
			a.cpuUS += (m.cpu.ClientUSPerOp + m.cpu.DaemonUSPerOp) * float64(n)
			a.others += m.cpu.OthersShare * m.phase.wall.Seconds()
			if m.counts != nil {
				a.requests += float64(m.counts.Requests["total"])
				a.haveRequests = true
			}
		}
	}
	for round := range rounds {
		for _, c := range s.cfg.clients {
			for i := range systems {
				system := systems[(i+round)%len(systems)]
				if err := s.interleaveOne(ctx, bin, system, round, c, k, rec(system)); err != nil {
					return fmt.Errorf("%s, round %d, %d client(s): %w", system, round+1, c, err)
				}
			}
		}
	}
	for _, key := range order {
		a := acc[key]
		system, op, c := key.system, key.op, key.clients
		sum := a.lat.summary()
		r := row{System: system, Op: op, Clients: c, Ops: a.ops, Seconds: round2(a.wall.Seconds()), OpsPerSec: opsPerSec(a.ops, a.wall),
			P50US: sum.P50US, P99US: sum.P99US, CPUSecPer10k: round4(a.cpuUS / float64(max(a.ops, 1)) * 1e4 / 1e6),
			OthersShare: round2(a.others / max(a.wall.Seconds(), 1e-9)), RequestsPerOp: -1, FsyncsPerOp: -1}
		if a.haveRequests {
			r.RequestsPerOp = round2(a.requests / float64(max(a.ops, 1)))
		}
		s.res.Interleaved = append(s.res.Interleaved, r)
	}
	s.note(fmt.Sprintf("goal ratios between the mounts (sqlite/%s and fs/%s, the daemon's default options), the loopback, the goqite-style queue and the core come from the interleaved step: %d rounds of %d messages per operation and client count, the %d systems in a rotating order, each round on new directories, stores and daemons; the mounts at --sync normal take their turns too, for comparison (no goal: they show the mounts without the sync at close, like the loopback and goqite-style)", goalSync, goalSync, rounds, k, len(systems)))
	return nil
}

// interleaveOne runs one system's round.
func (s *suite) interleaveOne(ctx context.Context, loopbackBin, system string, round, c, k int, rec recorder) error {
	label := fmt.Sprintf("il-r%d-c%d", round, c)
	switch system {
	case sysLoopback:
		dir, err := s.newWorkDir("loopback-" + label)
		if err != nil {
			return err
		}
		d, err := startLoopback(loopbackBin, dir, s.cfg.cacheTimeout)
		if err != nil {
			return err
		}
		s.b.atExit(func() { d.stop() })
		inbox, processing := filepath.Join(d.mnt, "inbox"), filepath.Join(d.mnt, "processing")
		for _, p := range []string{inbox, processing} {
			if err := unix.Mkdir(p, 0o755); err != nil {
				return err
			}
		}
		if err := s.runFuseOps(ctx, d, inbox, processing, c, k, "il", rec); err != nil {
			return err
		}
		return d.stop()
	case sysMount("sqlite", goalSync), sysMount("fs", goalSync), sysMount("sqlite", "normal"), sysMount("fs", "normal"):
		store, sync, _ := strings.Cut(strings.TrimPrefix(system, "mount "), "/")
		d, err := s.b.mount(mountSpec{backend: store, sync: sync, cacheTimeout: s.cfg.cacheTimeout}, label)
		if err != nil {
			return err
		}
		qdir := filepath.Join(d.mnt, "il")
		if err := setupQueue(qdir); err != nil {
			return err
		}
		if err := s.runFuseOps(ctx, d, filepath.Join(qdir, "inbox"), filepath.Join(qdir, "processing"), c, k, "il", rec); err != nil {
			return err
		}
		return d.stop()
	case sysGoqite:
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
	case sysInproc("sqlite", "normal"):
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
	return fmt.Errorf("no interleaved run for %s", system)
}
