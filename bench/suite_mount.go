package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/backends"
	"yirangmq/backends/sqlite"
	"yirangmq/queuecore"
)

// newWorkDir makes a new directory of the work directory (a block group
// of its own, see spreadSubdirs).
func (s *suite) newWorkDir(label string) (string, error) {
	dir := filepath.Join(s.b.work, label)
	for i := 2; ; i++ {
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			return dir, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", err
		}
		dir = filepath.Join(s.b.work, fmt.Sprintf("%s-%d", label, i))
	}
}

// runLoopback runs the operations through a go-fuse loopback mount, one
// new mount per client count; the last one is kept for the idle window.
func (s *suite) runLoopback(ctx context.Context) error {
	bin, err := buildLoopback(ctx, s.root, s.b.work)
	if err != nil {
		return err
	}
	if err := s.probeFloor(ctx, sysLoopback, max(s.cfg.floorOps/4, 5000)); err != nil {
		return err
	}
	for i, c := range s.cfg.clients {
		dir, err := s.newWorkDir(fmt.Sprintf("loopback-c%d", c))
		if err != nil {
			return err
		}
		d, err := startLoopback(bin, dir, s.cfg.cacheTimeout, false)
		if err != nil {
			return err
		}
		s.b.current = d
		s.b.atExit(func() {
			if err := d.stop(); err != nil {
				s.logf("stop loopback: %v", err)
			}
		})
		if i == 0 {
			time.Sleep(300 * time.Millisecond)
			s.keep(sysLoopback, d)
		}
		inbox, processing := filepath.Join(d.mnt, "inbox"), filepath.Join(d.mnt, "processing")
		for _, p := range []string{inbox, processing} {
			if err := unix.Mkdir(p, 0o755); err != nil {
				return err
			}
		}
		if err := s.runFuseOps(ctx, d, inbox, processing, c, s.cfg.messages, "t", s.addTo(sysLoopback)); err != nil {
			return fmt.Errorf("loopback: %w", err)
		}
		if i > 0 {
			// The daemon kept for the idle window is the first one; it
			// has done the 1-client work.
			if err := d.stop(); err != nil {
				return err
			}
		}
	}
	return nil
}

// runMounts runs every transport, store and sync mode: the operations
// per client count on a new daemon each (the first is kept for the idle
// window), then the .next wake-up and the lease-expiry redelivery on the
// last.
func (s *suite) runMounts(ctx context.Context) error {
	for _, t := range s.transports {
		for _, backend := range s.cfg.backends {
			for _, sync := range s.cfg.syncs {
				if err := s.runMount(ctx, backend, sync, t); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// runMount is runMounts' work for one transport, store and sync mode.
func (s *suite) runMount(ctx context.Context, backend, sync, transport string) error {
	system := sysMount(backend, sync, transport)
	spec := s.spec(backend, sync, transport)
	if err := s.probeFloor(ctx, system, max(s.cfg.floorOps/4, 5000)); err != nil {
		return err
	}
	var last *daemon
	for i, c := range s.cfg.clients {
		d, err := s.b.mount(spec, fmt.Sprintf("c%d", c))
		if err != nil {
			return err
		}
		if i == 0 {
			time.Sleep(300 * time.Millisecond)
			s.keep(system, d)
		} else if err := last.stopUnlessKept(s); err != nil {
			return err
		}
		last = d
		qdir := filepath.Join(d.mnt, "bench")
		if err := setupQueue(qdir); err != nil {
			return err
		}
		if err := s.runFuseOps(ctx, d, filepath.Join(qdir, "inbox"), filepath.Join(qdir, "processing"), c, s.cfg.messages, "t", s.addTo(system)); err != nil {
			return fmt.Errorf("%s: %w", system, err)
		}
	}
	if err := s.runNextWake(ctx, system, last); err != nil {
		return fmt.Errorf("%s: %w", system, err)
	}
	if err := s.runExpiry(ctx, system, last); err != nil {
		return fmt.Errorf("%s: %w", system, err)
	}
	return last.stopUnlessKept(s)
}

// stopUnlessKept stops d unless it waits for the idle window.
func (d *daemon) stopUnlessKept(s *suite) error {
	for _, l := range s.live {
		if l.d == d {
			return nil
		}
	}
	return d.stop()
}

// runNextWake measures the .next wake-up (next.go) on a new queue.
func (s *suite) runNextWake(ctx context.Context, system string, d *daemon) error {
	qdir := filepath.Join(d.mnt, "next")
	if err := setupQueue(qdir); err != nil {
		return err
	}
	nr, err := runNext(ctx, qdir, 0, s.cfg.nextSamples)
	if err != nil {
		return fmt.Errorf(".next: %w", err)
	}
	sum := nr.Wake.summary()
	s.res.Wake = append(s.res.Wake, wakeRow{System: system, How: "read(2) of QUEUE/.next blocked, create+write+close of inbox/NAME",
		Samples: sum.N, P50US: sum.P50US, P99US: sum.P99US, Unconfirmed: nr.Unconfirmed})
	after := nr.AfterClose.summary()
	s.logf("%s .next wake-up: p50 %.1f µs p99 %.1f µs (%d samples); from the publisher's close: p50 %.1f µs p99 %.1f µs", system, sum.P50US, sum.P99US, sum.N, after.P50US, after.P99US)
	return nil
}

// expiryPolicy: 1 s leases, redelivery straight to inbox/ (no backoff),
// enough retries that no sample is dead-lettered.
const expiryPolicy = `{"visibilityTimeoutSec": 1, "retry": {"limit": 100, "initialDelaySec": 0, "maxDelaySec": 0}, "archive": {"enabled": false}}`

// runExpiry leases messages of a queue whose leases last 1 s, does not
// ack them, and measures from each lease deadline (the message's
// user.yirangmq.lease_deadline) to .next returning it again: readers
// block in .next before the first deadline, a few at a time.
func (s *suite) runExpiry(ctx context.Context, system string, d *daemon) error {
	qdir := filepath.Join(d.mnt, "expiry")
	if err := unix.Mkdir(qdir, 0o755); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(qdir, ".policy"), []byte(expiryPolicy)); err != nil {
		return fmt.Errorf("policy: %w", err)
	}
	var delays latencies
	const batch = 4
	body := make([]byte, msgSize)
	for first := 0; first < s.cfg.expirySamples; first += batch {
		n := min(batch, s.cfg.expirySamples-first)
		deadlines := map[string]time.Time{}
		for i := range n {
			name := fmt.Sprintf("exp-%04d", first+i)
			if err := publish(filepath.Join(qdir, "inbox", name), body, false, -1); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			leased := filepath.Join(qdir, "processing", name)
			if err := unix.Rename(filepath.Join(qdir, "inbox", name), leased); err != nil {
				return fmt.Errorf("lease: %w", err)
			}
			dl, err := leaseDeadline(leased)
			if err != nil {
				return err
			}
			deadlines[name] = dl
			// Spread the deadlines, so that each sample is its own expiry.
			time.Sleep(60 * time.Millisecond)
		}
		got, err := readNextMany(ctx, qdir, n, 10*time.Second)
		if err != nil {
			return fmt.Errorf("expiry: %w", err)
		}
		for name, at := range got {
			dl, ok := deadlines[name]
			if !ok {
				return fmt.Errorf("expiry: .next returned %q, not one of ours", name)
			}
			delays = append(delays, at.Sub(dl))
			if err := unix.Unlink(filepath.Join(qdir, "processing", name)); err != nil {
				return fmt.Errorf("ack %s: %w", name, err)
			}
		}
	}
	sum := delays.summary()
	min := slices.Min(delays)
	r := expiryRow{System: system, Samples: sum.N, P50MS: round2(sum.P50US / 1000), MaxMS: round2(sum.MaxUS / 1000), MinMS: round2(float64(min) / 1e6)}
	s.res.Expiry = append(s.res.Expiry, r)
	s.logf("%s expiry redelivery: p50 %.1f ms, max %.1f ms (%d samples)", system, r.P50MS, r.MaxMS, r.Samples)
	return nil
}

// leaseDeadline reads a leased message's deadline.
func leaseDeadline(path string) (time.Time, error) {
	buf := make([]byte, 128)
	n, err := unix.Getxattr(path, "user.yirangmq.lease_deadline", buf)
	if err != nil {
		return time.Time{}, fmt.Errorf("getxattr lease_deadline: %w", err)
	}
	return time.Parse(time.RFC3339Nano, strings.TrimSpace(string(buf[:n])))
}

// readNextMany blocks n readers in QUEUE/.next at once and returns when
// each read returned which message.
func readNextMany(ctx context.Context, qdir string, n int, limit time.Duration) (map[string]time.Time, error) {
	type got struct {
		name string
		at   time.Time
		err  error
	}
	ch := make(chan got, n)
	for range n {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			fd, err := unix.Open(filepath.Join(qdir, ".next"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				ch <- got{err: err}
				return
			}
			buf := make([]byte, 512)
			k, err := unix.Read(fd, buf)
			at := time.Now()
			unix.Close(fd)
			line := strings.TrimSpace(string(buf[:max(k, 0)]))
			ch <- got{name: strings.TrimPrefix(line, "processing/"), at: at, err: err}
		}()
	}
	out := map[string]time.Time{}
	timeout := time.After(limit)
	for range n {
		select {
		case g := <-ch:
			if g.err != nil {
				return out, fmt.Errorf("read .next: %w", g.err)
			}
			out[g.name] = g.at
		case <-timeout:
			return out, fmt.Errorf("%d of %d messages not redelivered within %v", n-len(out), n, limit)
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
	return out, nil
}

func writeFile(path string, data []byte) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_, err = unix.Write(fd, data)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	return err
}

// runChurn sends many messages through a new sqlite/normal daemon
// (round trips, 4 clients or the most asked for) and reads its RSS. It
// serves on the last transport of the run (io_uring when both are
// measured: the one the daemon's default, auto, picks when the kernel
// offers it); its figure is in no goal.
func (s *suite) runChurn(ctx context.Context) error {
	if s.cfg.churnMessages <= 0 {
		return nil
	}
	t := s.transports[len(s.transports)-1]
	system := sysMount("sqlite", "normal", t)
	d, err := s.b.mount(s.spec("sqlite", "normal", t), "churn")
	if err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	label := fmt.Sprintf("%s, after %s messages", system, countName(s.cfg.churnMessages))
	l := s.keep(label, d)
	qdir := filepath.Join(d.mnt, "churn")
	if err := setupQueue(qdir); err != nil {
		return err
	}
	q := queueDirs{inbox: filepath.Join(qdir, "inbox"), processing: filepath.Join(qdir, "processing")}
	c := slices.Max(s.cfg.clients)
	m, err := s.b.measure(d, "", func() (phaseResult, error) { return runPhase(ctx, q, opRoundTrip, "churn", s.cfg.churnMessages, c) })
	if err != nil {
		return err
	}
	r := phaseRow(system, opRoundTrip, c, m)
	s.res.Churn = &churnResult{System: system, Messages: s.cfg.churnMessages, Clients: c, Seconds: r.Seconds, OpsPerSec: r.OpsPerSec,
		CPUSecPer10k: r.CPUSecPer10k, RSSBeforeMiB: l.rss.total, RSSAfterMiB: procRSSMiB(d.pid())}
	s.logf("%s: %.0f round trips/s, RSS %.1f → %.1f MiB", label, r.OpsPerSec, l.rss.total, s.res.Churn.RSSAfterMiB)
	return nil
}

// runScale runs scaleOn for each transport, each on a store of its own.
func (s *suite) runScale(ctx context.Context) error {
	if s.cfg.ready <= 0 {
		return nil
	}
	for _, t := range s.transports {
		if err := s.scaleOn(ctx, t); err != nil {
			return fmt.Errorf("%s: %w", t, err)
		}
	}
	return nil
}

// scaleOn fills a new sqlite store with many ready messages in process
// (Core.Publish from 8 goroutines: group commit), mounts it on
// transport, reads the daemon's RSS, and compares round trips through
// the mount on that queue with round trips on an empty queue of the same
// daemon, alternated in four rounds.
func (s *suite) scaleOn(ctx context.Context, transport string) error {
	system := sysMount("sqlite", "normal", transport)
	dir, err := s.newWorkDir("scale-" + transport)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := fillStore(ctx, filepath.Join(dir, "store"), s.cfg.ready); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	fill := time.Since(t0)
	s.logf("filled %d ready messages in %.1f s", s.cfg.ready, fill.Seconds())
	t0 = time.Now()
	d, err := startDaemon(s.b.cfg.bin, dir, s.spec("sqlite", "normal", transport))
	if err != nil {
		return err
	}
	mounted := time.Since(t0)
	s.b.current = d
	s.b.atExit(func() {
		if err := d.stop(); err != nil {
			s.logf("stop daemon: %v", err)
		}
	})
	time.Sleep(300 * time.Millisecond)
	l := s.keep(fmt.Sprintf("%s, %s ready", system, countName(s.cfg.ready)), d)
	sc := scaleResult{System: system, Transport: transport, Ready: s.cfg.ready, FillSeconds: round1(fill.Seconds()), MountSeconds: round2(mounted.Seconds()), RSSMiB: l.rss.total,
		How: "published in process into the store before mounting (queuecore.Core.Publish, 8 goroutines)"}
	queues := map[string]queueDirs{}
	for _, name := range []string{"big", "empty"} {
		qdir := filepath.Join(d.mnt, name)
		queues[name] = queueDirs{inbox: filepath.Join(qdir, "inbox"), processing: filepath.Join(qdir, "processing")}
	}
	const rounds = 4
	per := max(s.cfg.scaleRoundTrips/rounds, 1)
	var wall = map[string]time.Duration{}
	var ops = map[string]int{}
	for round := range rounds {
		for _, name := range []string{"empty", "big"} {
			ph, err := runPhase(ctx, queues[name], opRoundTrip, fmt.Sprintf("s%d", round), per, 1)
			if err != nil {
				return fmt.Errorf("round trips on %s: %w", name, err)
			}
			wall[name] += ph.wall
			ops[name] += len(ph.lat)
		}
	}
	sc.RoundTrips = ops["big"]
	sc.EmptyRTPerS = opsPerSec(ops["empty"], wall["empty"])
	sc.FullRTPerS = opsPerSec(ops["big"], wall["big"])
	if sc.EmptyRTPerS > 0 {
		sc.Ratio = round2(sc.FullRTPerS / sc.EmptyRTPerS)
	}
	sc.RSSAfterMiB = procRSSMiB(d.pid())
	s.res.Scales = append(s.res.Scales, sc)
	s.logf("%d ready: RSS %.1f MiB; round trips %.0f/s vs %.0f/s empty (%.2f×)", sc.Ready, sc.RSSMiB, sc.FullRTPerS, sc.EmptyRTPerS, sc.Ratio)
	return nil
}

// fillStore creates the queues "big" (n ready messages) and "empty" in a
// new sqlite store at dir, through the queue core, then closes it.
func fillStore(ctx context.Context, dir string, n int) error {
	st, err := sqlite.Open(ctx, dir, backends.Options{Sync: queuecore.SyncNormal})
	if err != nil {
		return err
	}
	core, err := queuecore.Open(ctx, st, queuecore.Options{})
	if err != nil {
		st.Close()
		return err
	}
	defer st.Close()
	defer core.Close()
	for _, q := range []string{"big", "empty"} {
		if err := core.CreateQueue(ctx, q, 0, 0, 0o755); err != nil {
			return err
		}
		if err := core.SetPolicy(ctx, q, []byte(benchPolicy)); err != nil {
			return err
		}
	}
	body := make([]byte, msgSize)
	const workers = 8
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if i%1024 == 0 && ctx.Err() != nil {
					errs[w] = ctx.Err()
					return
				}
				if _, err := core.Publish(ctx, "big", "r-"+strconv.Itoa(i), body, queuecore.PublishOptions{}); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// benchPolicy is setupQueue's: acks delete, leases outlast the run.
const benchPolicy = `{"archive": {"enabled": false}, "visibilityTimeoutSec": 3600}`
