package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"yirangmq/backends"
	"yirangmq/backends/sqlite"
	"yirangmq/queuecore"
)

// runFuncPhase runs f for n operations split over clients goroutines
// (client c does its i-th operation as f(c, i)), all released at once,
// as runPhase does for file operations.
func runFuncPhase(ctx context.Context, n, clients int, f func(c, i int) error) (phaseResult, error) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	lats := make([]latencies, clients)
	errs := make([]error, clients)
	for c := range clients {
		count := n / clients
		if c < n%clients {
			count++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make(latencies, 0, count)
			<-start
			for i := range count {
				if i%64 == 0 && ctx.Err() != nil {
					errs[c] = ctx.Err()
					break
				}
				t0 := time.Now()
				err := f(c, i)
				lat = append(lat, time.Since(t0))
				if err != nil {
					errs[c] = err
					break
				}
			}
			lats[c] = lat
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(t0)
	var all latencies
	for _, l := range lats {
		all = append(all, l...)
	}
	return phaseResult{wall: wall, lat: all}, errors.Join(errs...)
}

// clientNames holds per client the names (or ids) a lease phase got,
// for the ack phase.
type clientNames [][]string

func newClientNames(clients, n int) clientNames {
	names := make(clientNames, clients)
	for c := range names {
		names[c] = make([]string, 0, n/clients+1)
	}
	return names
}

// funcPhase is one operation of an in-process system: f(client, i).
type funcPhase struct {
	op opKind
	f  func(c, i int) error
}

// runFuncPhases measures each phase, n operations over c clients, with
// the CPU sampler (this process), and records it.
func (s *suite) runFuncPhases(ctx context.Context, phases []funcPhase, n, c int, rec recorder) error {
	for _, ph := range phases {
		m, err := s.b.measure(nil, "", func() (phaseResult, error) { return runFuncPhase(ctx, n, c, ph.f) })
		if err != nil {
			return fmt.Errorf("%s c=%d: %w", ph.op, c, err)
		}
		rec(ph.op, c, m)
	}
	return nil
}

// openInproc opens the queue core on a new sqlite store in a new
// directory; close closes both.
func (s *suite) openInproc(ctx context.Context, label string, sync queuecore.SyncMode) (core *queuecore.Core, close func() error, err error) {
	dir, err := s.newWorkDir(label)
	if err != nil {
		return nil, nil, err
	}
	st, err := sqlite.Open(ctx, dir, backends.Options{Sync: sync})
	if err != nil {
		return nil, nil, err
	}
	core, err = queuecore.Open(ctx, st, queuecore.Options{})
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return core, func() error { return errors.Join(core.Close(), st.Close()) }, nil
}

// runInproc calls the queue core directly on the sqlite store, in
// normal and full sync mode: Publish, Next (the lease), Ack, and the
// round trip, with a new store per sync mode and a queue per client
// count.
func (s *suite) runInproc(ctx context.Context) error {
	for _, sync := range []queuecore.SyncMode{queuecore.SyncNormal, queuecore.SyncFull} {
		system := sysInproc("sqlite", sync.String())
		n := s.cfg.inprocMessages
		if sync == queuecore.SyncFull {
			n = s.cfg.inprocFull
		}
		core, closeCore, err := s.openInproc(ctx, "inproc-sqlite-"+sync.String(), sync)
		if err != nil {
			return err
		}
		for _, c := range s.cfg.clients {
			if err = s.runQueuecore(ctx, core, "c"+strconv.Itoa(c), n, c, s.addTo(system)); err != nil {
				break
			}
		}
		if cerr := closeCore(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", system, err)
		}
	}
	return nil
}

// runQueuecore creates queue q and runs the four phases on it.
func (s *suite) runQueuecore(ctx context.Context, core *queuecore.Core, q string, n, c int, rec recorder) error {
	const consumer = "uid=0 pid=1 bench"
	if err := core.CreateQueue(ctx, q, 0, 0, 0o755); err != nil {
		return err
	}
	if err := core.SetPolicy(ctx, q, []byte(benchPolicy)); err != nil {
		return err
	}
	body := make([]byte, msgSize)
	pub := func(name string) error {
		_, err := core.Publish(ctx, q, name, body, queuecore.PublishOptions{})
		return err
	}
	leased := newClientNames(c, n)
	return s.runFuncPhases(ctx, []funcPhase{
		{opPublish, func(cl, i int) error { return pub(msgName("t", cl, i)) }},
		{opLease, func(cl, i int) error {
			m, err := core.Next(ctx, q, consumer, true)
			if err == nil {
				leased[cl] = append(leased[cl], m.Name)
			}
			return err
		}},
		{opAck, func(cl, i int) error { return core.Ack(ctx, q, leased[cl][i]) }},
		{opRoundTrip, func(cl, i int) error {
			if err := pub(msgName("rt", cl, i)); err != nil {
				return err
			}
			// With several clients, Next may give another client's
			// message: any one will do, and there is always one.
			m, err := core.Next(ctx, q, consumer, true)
			if err != nil {
				return err
			}
			return core.Ack(ctx, q, m.Name)
		}},
	}, n, c, rec)
}

// goqiteMessages is the goqite-style queue's phase length: about half as
// fast as the core.
func (s *suite) goqiteMessages() int { return max(s.cfg.inprocMessages/2, 1) }

// runGoqite runs the goqite-style queue: send (publish), receive (lease),
// delete (ack), and the round trip.
func (s *suite) runGoqite(ctx context.Context) error {
	dir, err := s.newWorkDir("goqite")
	if err != nil {
		return err
	}
	g, err := openGoqite(ctx, dir)
	if err != nil {
		return err
	}
	defer g.Close()
	for _, c := range s.cfg.clients {
		if err := s.runGoqitePhases(ctx, g, s.goqiteMessages(), c, s.addTo(sysGoqite)); err != nil {
			return err
		}
	}
	return nil
}

func (s *suite) runGoqitePhases(ctx context.Context, g *goqiteQueue, n, c int, rec recorder) error {
	body := make([]byte, msgSize)
	received := newClientNames(c, n)
	return s.runFuncPhases(ctx, []funcPhase{
		{opPublish, func(cl, i int) error { _, err := g.send(ctx, body); return err }},
		{opLease, func(cl, i int) error {
			id, err := g.receive(ctx)
			if err == nil {
				received[cl] = append(received[cl], id)
			}
			return err
		}},
		{opAck, func(cl, i int) error { return g.delete(ctx, received[cl][i]) }},
		{opRoundTrip, func(cl, i int) error {
			if _, err := g.send(ctx, body); err != nil {
				return err
			}
			id, err := g.receive(ctx)
			if err != nil {
				return err
			}
			return g.delete(ctx, id)
		}},
	}, n, c, rec)
}
