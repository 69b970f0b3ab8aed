package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Latency under a steady load: per store, at the daemon's default options
// (--sync full), on a new daemon, 4 clients (the most asked for). First
// the peak: round trips (publish, lease, ack of one message) from all
// clients as fast as they go. Then the load at half of that: each client
// starts its round trips on a fixed timetable (client c's i-th at
// t0 + c·interval/clients + i·interval, interval = clients ÷ (peak/2)),
// sleeping until its slot, and times each of the three operations
// separately. A client behind its timetable starts at once (it does not
// skip a slot); the count of such late starts is reported. Each
// operation's latency is from its own first system call to its last
// one's return.

// latencyRow is one operation's latency under the paced load.
type latencyRow struct {
	System      string  `json:"system"`
	Op          string  `json:"op"` // publish, lease, ack
	Clients     int     `json:"clients"`
	PeakRTPerS  float64 `json:"peak_roundtrips_per_sec"`
	PacedRTPerS float64 `json:"paced_roundtrips_per_sec"` // the rate asked for: half the peak
	RTPerS      float64 `json:"achieved_roundtrips_per_sec"`
	Seconds     float64 `json:"seconds"`
	Samples     int     `json:"samples"`
	Late        int     `json:"late_starts"` // round trips started more than one interval behind the timetable
	P50US       float64 `json:"p50_us"`
	P99US       float64 `json:"p99_us"`
	P999US      float64 `json:"p99_9_us"`
	MaxUS       float64 `json:"max_us"`
	// StealPct is the share of the machine's CPU time the hypervisor took
	// during the paced load (/proc/stat), which delays every thread.
	StealPct float64 `json:"steal_pct"`
	// RoundP99US is each round's p99 (the quantiles above are over all
	// rounds' samples together).
	RoundP99US []float64 `json:"round_p99_us,omitempty"`
}

// reference is the system name of the plain-directory row run at the
// pace of mount row l.
func (l latencyRow) reference() string {
	return sysPlainSyncClose + " (" + l.System + "'s pace)"
}

// cpuTimes reads the machine's CPU time (all states) and the part of it
// stolen by the hypervisor, in clock ticks, from /proc/stat.
func cpuTimes() (total, steal uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	return parseCPUTimes(string(b))
}

// parseCPUTimes parses the "cpu" line of /proc/stat: user nice system idle
// iowait irq softirq steal guest guest_nice. Guest time is counted in
// user and nice already, so it is left out of the total.
func parseCPUTimes(stat string) (total, steal uint64) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0
		}
		total += n
		if i == 7 {
			steal = n
		}
	}
	return total, steal
}

// stealPct is the stolen share of the CPU time between two cpuTimes.
func stealPct(total0, steal0, total1, steal1 uint64) float64 {
	if total1 <= total0 || steal1 < steal0 {
		return 0
	}
	return round1(100 * float64(steal1-steal0) / float64(total1-total0))
}

// quantileUS is the p-quantile of sorted s, in µs.
func quantileUS(s latencies, p float64) float64 {
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s))*p+0.999999) - 1
	return round1(float64(s[max(0, min(i, len(s)-1))]) / 1e3)
}

func (s *suite) runLatency(ctx context.Context) error {
	if s.cfg.latencyLength <= 0 {
		return nil
	}
	c := slices.Max(s.cfg.clients)
	for _, t := range s.transports {
		for _, store := range []string{"sqlite", "fs"} {
			if err := s.latencyOf(ctx, store, t, c); err != nil {
				return err
			}
		}
	}
	s.note(fmt.Sprintf("latency under load: per transport and store at --sync %s, a new daemon, %d clients, after a sync(2) (untimed) that writes back what earlier steps left dirty; the peak is %d round trips as fast as they go, then %s of round trips paced at half of it (each client on a fixed timetable, never skipping a slot), each operation timed on its own, in %d rounds that alternate with the same pace on a plain directory of the same disk (a new one each round) whose publish fdatasyncs the file before close(2) (what --sync full promises; its lease and ack sync nothing, as the mount's): the disk's and the machine's own tail; the publish goal is the median of the rounds' p99 ratios, the quantiles in the table over all rounds' samples; CPU steal is the hypervisor's share of the machine's CPU time during the paced loads (/proc/stat)", goalSync, c, s.cfg.latencyPeak, s.cfg.latencyLength, s.cfg.rounds))
	return nil
}

// latencyOf measures one store and transport: its peak, then the rounds
// of paced load, the mount's and the plain directory's taking turns
// (which goes first alternates).
func (s *suite) latencyOf(ctx context.Context, store, transport string, c int) error {
	system := sysMount(store, goalSync, transport)
	// The steps before leave the page cache dirty (the loopback's 1 MiB
	// files are never synced: about 320 MiB), and the kernel writes it
	// back over the next seconds, under this step's fsyncs. Each store
	// starts on a written-back disk, untimed.
	t0 := time.Now()
	unix.Sync()
	s.logf("%s: sync(2) before the latency step: %.0f ms", system, time.Since(t0).Seconds()*1000)
	d, err := s.b.mount(s.spec(store, goalSync, transport), "latency")
	if err != nil {
		return err
	}
	qdir := filepath.Join(d.mnt, "lat")
	if err := setupQueue(qdir); err != nil {
		return err
	}
	q := queueDirs{inbox: filepath.Join(qdir, "inbox"), processing: filepath.Join(qdir, "processing")}
	if _, err := runPhase(ctx, q, opRoundTrip, "lat-warmup", s.cfg.warmup, 1); err != nil {
		return fmt.Errorf("%s: warm-up: %w", system, err)
	}
	peak, err := runPhase(ctx, q, opRoundTrip, "lat-peak", s.cfg.latencyPeak, c)
	if err != nil {
		return fmt.Errorf("%s: peak: %w", system, err)
	}
	peakRate := opsPerSec(len(peak.lat), peak.wall)
	if peakRate <= 0 {
		return fmt.Errorf("%s: no peak rate", system)
	}
	mountRow := latencyRow{System: system, Clients: c, PeakRTPerS: peakRate, PacedRTPerS: round1(peakRate / 2)}
	ref := mountRow
	ref.System = mountRow.reference()
	var mountAcc, plainAcc pacedAccum
	length := s.cfg.latencyLength / time.Duration(s.cfg.rounds)
	for round := range s.cfg.rounds {
		pass := fmt.Sprintf("lat-r%d", round)
		mountTurn := func() error {
			if err := mountAcc.run(ctx, q, pass, mountRow, length); err != nil {
				return fmt.Errorf("%s: paced load: %w", system, err)
			}
			return nil
		}
		// The same pace on a plain directory of the same disk, each
		// publish synced before its close: what the disk and the
		// machine give a durable publish without the queue. A new one
		// each round, as the mount's files are new.
		plainTurn := func() error {
			root, err := s.newWorkDir(fmt.Sprintf("latency-plain-%s-%s-r%d", store, transport, round))
			if err != nil {
				return err
			}
			pq := queueDirs{inbox: filepath.Join(root, "inbox"), processing: filepath.Join(root, "processing"), syncAtClose: true}
			for _, dir := range []string{pq.inbox, pq.processing} {
				if err := os.Mkdir(dir, 0o755); err != nil {
					return err
				}
			}
			if err := plainAcc.run(ctx, pq, pass, ref, length); err != nil {
				return fmt.Errorf("%s: paced load: %w", ref.System, err)
			}
			return nil
		}
		turns := []func() error{mountTurn, plainTurn}
		if round%2 == 1 {
			turns[0], turns[1] = turns[1], turns[0]
		}
		for _, turn := range turns {
			if err := turn(); err != nil {
				return err
			}
		}
	}
	if err := d.stop(); err != nil {
		return err
	}
	for _, r := range slices.Concat(mountAcc.rows(mountRow), plainAcc.rows(ref)) {
		s.res.Latency = append(s.res.Latency, r)
		s.logf("%-24s %-7s at %.0f of %.0f round trips/s: p50 %.0f µs p99 %.0f µs p99.9 %.0f µs (%d samples, %d late, %.0f%% CPU stolen); rounds' p99 %v",
			r.System, r.Op, r.RTPerS, r.PeakRTPerS, r.P50US, r.P99US, r.P999US, r.Samples, r.Late, r.StealPct, r.RoundP99US)
	}
	return nil
}

// pacedAccum adds up the rounds of one system's paced load.
type pacedAccum struct {
	lat          [3]latencies // by operation (opPublish, opLease, opAck)
	roundP99     [3][]float64
	roundTrips   int
	late         int
	wall         time.Duration
	total, steal uint64 // the machine's CPU ticks, and the stolen ones, during the loads
}

// run runs one round of paced load at row's pace on q for length.
func (a *pacedAccum) run(ctx context.Context, q queueDirs, pass string, row latencyRow, length time.Duration) error {
	total0, steal0 := cpuTimes()
	res, err := runPaced(ctx, q, pass, row.Clients, row.PacedRTPerS, length)
	if err != nil {
		return err
	}
	total1, steal1 := cpuTimes()
	if total1 > total0 && steal1 >= steal0 {
		a.addRound(res, total1-total0, steal1-steal0)
	} else {
		a.addRound(res, 0, 0)
	}
	return nil
}

// addRound adds a round's paced load, during which the machine had
// total CPU ticks, steal of them stolen.
func (a *pacedAccum) addRound(res pacedResult, total, steal uint64) {
	a.total += total
	a.steal += steal
	for _, op := range []opKind{opPublish, opLease, opAck} {
		l := slices.Clone(res.lat[op])
		slices.Sort(l)
		a.roundP99[op] = append(a.roundP99[op], quantileUS(l, 0.99))
		a.lat[op] = append(a.lat[op], res.lat[op]...)
	}
	a.roundTrips += res.roundTrips
	a.late += res.late
	a.wall += res.wall
}

// rows are the accumulated rounds' rows, one per operation, from base's
// system, clients and rates.
func (a *pacedAccum) rows(base latencyRow) []latencyRow {
	var out []latencyRow
	for _, op := range []opKind{opPublish, opLease, opAck} {
		l := slices.Clone(a.lat[op])
		slices.Sort(l)
		r := base
		r.Op, r.RTPerS, r.Seconds, r.Samples, r.Late = op.String(), opsPerSec(a.roundTrips, a.wall), round2(a.wall.Seconds()), len(l), a.late
		r.P50US, r.P99US, r.P999US, r.MaxUS = quantileUS(l, 0.50), quantileUS(l, 0.99), quantileUS(l, 0.999), quantileUS(l, 1)
		r.StealPct = stealPct(0, 0, a.total, a.steal)
		r.RoundP99US = a.roundP99[op]
		out = append(out, r)
	}
	return out
}

// pacedResult is what a paced load measured.
type pacedResult struct {
	lat        map[opKind]latencies
	roundTrips int
	late       int
	wall       time.Duration
}

// runPaced runs round trips from clients goroutines at rate round trips
// per second in all, for dur, and times each operation.
func runPaced(ctx context.Context, q queueDirs, pass string, clients int, rate float64, dur time.Duration) (pacedResult, error) {
	interval := time.Duration(float64(clients) / rate * float64(time.Second))
	body := make([]byte, msgSize)
	type clientResult struct {
		lat        [3]latencies
		roundTrips int
		late       int
		err        error
	}
	results := make([]clientResult, clients)
	var wg sync.WaitGroup
	t0 := time.Now().Add(10 * time.Millisecond)
	end := t0.Add(dur)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[c]
			offset := time.Duration(c) * interval / time.Duration(clients)
			for i := 0; ; i++ {
				slot := t0.Add(offset + time.Duration(i)*interval)
				if !slot.Before(end) {
					return
				}
				if wait := time.Until(slot); wait > 0 {
					if err := sleepCtx(ctx, wait); err != nil {
						r.err = err
						return
					}
				} else if -wait > interval {
					r.late++
				}
				name := msgName(pass, c, i)
				for _, op := range []opKind{opPublish, opLease, opAck} {
					s := time.Now()
					err := q.do(op, name, body, -1, -1)
					r.lat[op] = append(r.lat[op], time.Since(s))
					if err != nil {
						r.err = fmt.Errorf("%s %s: %w", op, name, err)
						return
					}
				}
				r.roundTrips++
			}
		}()
	}
	wg.Wait()
	out := pacedResult{lat: map[opKind]latencies{}, wall: time.Since(t0)}
	var errs []error
	for _, r := range results {
		for op := range r.lat {
			out.lat[opKind(op)] = append(out.lat[opKind(op)], r.lat[op]...)
		}
		out.roundTrips += r.roundTrips
		out.late += r.late
		errs = append(errs, r.err)
	}
	return out, errors.Join(errs...)
}
