package main

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestChooseTransports(t *testing.T) {
	const off = uringParam + " is N"
	for _, tc := range []struct {
		name                     string
		asked                    []string
		explicit, binHas, kernel bool
		want                     []string
		why, err                 string
	}{
		{"default, both offered", nil, false, true, true, []string{"classic", "uring"}, "", ""},
		{"default, kernel off", nil, false, true, false, []string{"classic"}, "kernel does not offer FUSE over io_uring (" + off + ")", ""},
		{"default, old build", nil, false, false, true, []string{"classic"}, "the build has no --transport", ""},
		{"old build, classic asked", []string{"classic"}, true, false, true, []string{"classic"}, "", ""},
		{"old build, uring asked", []string{"classic", "uring"}, true, false, true, nil, "", "no --transport flag"},
		{"uring asked, kernel off", []string{"uring"}, true, true, false, nil, "", "echo Y > " + uringParam},
		{"uring first", []string{"uring", "classic"}, true, true, true, []string{"uring", "classic"}, "", ""},
		{"unknown", []string{"auto"}, true, true, true, nil, "", `"auto": want classic or uring`},
		{"twice", []string{"classic", "classic"}, true, true, true, nil, "", "classic twice"},
		{"none", []string{}, true, true, true, nil, "", "none given"},
	} {
		got, why, err := chooseTransports(tc.asked, tc.explicit, tc.binHas, tc.kernel, off)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: transports %q, want %q", tc.name, got, tc.want)
		}
		if (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
			t.Errorf("%s: why %q, want it to say %q", tc.name, why, tc.why)
		}
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.err)
		}
	}
}

// TestOldBuildGetsNoTransportFlag: a build without --transport (classic
// only) is started without the flag; a build with it always gets one,
// since its default (auto) may be either transport.
func TestOldBuildGetsNoTransportFlag(t *testing.T) {
	oldHelp := "Usage: yirangmq mount [OPTIONS] MOUNTPOINT\n      --sync string   durability\n"
	newHelp := oldHelp + "      --transport string   how requests travel (default \"auto\")\n"
	if helpHasTransport(oldHelp) || !helpHasTransport(newHelp) {
		t.Fatalf("helpHasTransport: old %v, new %v", helpHasTransport(oldHelp), helpHasTransport(newHelp))
	}
	for _, tc := range []struct {
		binHas    bool
		transport string
		want      []string // the flags after --cache-timeout 1s
	}{
		{false, transportClassic, []string{"MNT"}},
		{true, transportClassic, []string{"--transport", "classic", "MNT"}},
		{true, transportUring, []string{"--transport", "uring", "MNT"}},
	} {
		s := &suite{cfg: suiteConfig{cacheTimeout: time.Second}, binHasTransport: tc.binHas}
		args := s.spec("fs", "normal", tc.transport).args("STORE", "MNT")
		want := append([]string{"mount", "--backend", "fs", "--store", "STORE", "--sync", "normal", "--cache-timeout", "1s"}, tc.want...)
		if !slices.Equal(args, want) {
			t.Errorf("build with --transport %v, %s: %q, want %q", tc.binHas, tc.transport, args, want)
		}
	}
}

func TestSystemNames(t *testing.T) {
	if got := sysMount("fs", "full", transportUring); got != "mount fs/full (uring)" {
		t.Errorf("sysMount = %q", got)
	}
	if got := sysMount("fs", "full", ""); got != "mount fs/full" {
		t.Errorf("sysMount without a transport = %q", got)
	}
	for in, want := range map[string]string{
		"mount sqlite/normal (classic) publish, 1 client(s) ÷ loopback":  "mount sqlite/normal publish, 1 client(s) ÷ loopback",
		"daemon RSS with 100k ready (uring)":                             "daemon RSS with 100k ready",
		"mount fs (uring) publish, 4 clients, full ÷ normal":             "mount fs publish, 4 clients, full ÷ normal",
		"queuecore sqlite/normal in process round trip, 1 client(s) ÷ x": "queuecore sqlite/normal in process round trip, 1 client(s) ÷ x",
	} {
		if got := withoutTransport(in); got != want {
			t.Errorf("withoutTransport(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestInterleaveAccumRow: a system's ops/s is the median of its rounds',
// the daemon's CPU and context switches per operation are over all
// rounds together (10 ms ticks: one round's few ticks would be coarse).
func TestInterleaveAccumRow(t *testing.T) {
	var a interleaveAccum
	for _, r := range []struct {
		ops            int
		wall           time.Duration
		cpu            time.Duration
		switches, reqs int64
	}{
		{1000, 500 * time.Millisecond, 30 * time.Millisecond, 7000, 5000},   // 2000/s
		{1000, 2 * time.Second, 40 * time.Millisecond, 9000, 5000},          // 500/s: a busy round
		{1000, 400 * time.Millisecond, 20 * time.Millisecond, 5000, 5000},   // 2500/s
		{1000, 1000 * time.Millisecond, 30 * time.Millisecond, 6000, 5000},  // 1000/s
		{1000, 625 * time.Millisecond, 30 * time.Millisecond, 10000, 10000}, // 1600/s
	} {
		lat := make(latencies, r.ops)
		for i := range lat {
			lat[i] = time.Duration(i+1) * time.Microsecond
		}
		a.add(measured{phase: phaseResult{wall: r.wall, lat: lat},
			cpu:    cpuUse{daemonCPU: r.cpu, daemonSwitches: r.switches},
			counts: &counts{Requests: map[string]int64{"total": r.reqs}}})
	}
	x := a.row("mount fs/normal (uring)", "lease", 4)
	if !slices.Equal(x.RoundOpsPerSec, []float64{2000, 500, 2500, 1000, 1600}) {
		t.Errorf("rounds %v", x.RoundOpsPerSec)
	}
	// Ops/s: the median round (1600), not the sum (5000 in 4.525 s: 1105).
	// CPU: 150 ms over 5000 = 30 µs; switches 37000/5000 = 7.4;
	// requests 30000/5000 = 6.
	if x.OpsPerSec != 1600 || x.Ops != 5000 || x.DaemonCPUUS != 30 || x.DaemonSwitchesPerOp != 7.4 || x.RequestsPerOp != 6 || x.P50US != 500 {
		t.Errorf("row %+v", x)
	}
}

// TestPacedAccumRows: the latency rows' quantiles are over every
// round's samples, and each round's p99 is kept for the goal's median.
func TestPacedAccumRows(t *testing.T) {
	var a pacedAccum
	for round := range 3 {
		var res pacedResult
		res.lat = map[opKind]latencies{}
		for _, op := range []opKind{opPublish, opLease, opAck} {
			for i := range 100 {
				// Round 1 is ten times slower.
				d := time.Duration(i+1) * time.Millisecond
				if round == 1 {
					d *= 10
				}
				res.lat[op] = append(res.lat[op], d)
			}
		}
		res.roundTrips, res.wall, res.late = 100, time.Second, round
		a.addRound(res, 1000, 10)
	}
	rows := a.rows(latencyRow{System: "S", Clients: 4, PeakRTPerS: 200, PacedRTPerS: 100})
	if len(rows) != 3 {
		t.Fatalf("%d rows", len(rows))
	}
	p := rows[0]
	if p.Op != "publish" || p.Samples != 300 || p.Late != 3 || p.RTPerS != 100 || p.StealPct != 1 {
		t.Errorf("publish row %+v", p)
	}
	if !slices.Equal(p.RoundP99US, []float64{99000, 990000, 99000}) {
		t.Errorf("rounds' p99 %v", p.RoundP99US)
	}
	// Over all 300 samples: the p99 is the 297th, the fourth largest
	// (970 ms, of the slow round); the p50 the 150th (72 ms: 2 × 72 of
	// the fast rounds and 7 of the slow one are at most that).
	if p.P99US != 970000 || p.MaxUS != 1000000 || p.P50US != 72000 {
		t.Errorf("p50 %v p99 %v max %v", p.P50US, p.P99US, p.MaxUS)
	}
}

// TestDaemonCounters: the per-operation cost rows read a process's time
// on a CPU (all threads, ns) and its context switches; both grow with
// what the process does. Here the process is the test itself.
func TestDaemonCounters(t *testing.T) {
	pid := os.Getpid()
	run0, sw0 := procRunTime(pid), procSwitches(pid)
	if run0 <= 0 {
		t.Skip("the kernel keeps no /proc/PID/task/*/schedstat")
	}
	// Spin until utime+stime says 60 ms more, then sleep a few times
	// (each a voluntary switch of this thread).
	cpu0, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if cpu, _ := procCPU(pid); cpu-cpu0 >= 60*time.Millisecond {
			break
		}
	}
	for range 5 {
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
	run1, sw1 := procRunTime(pid), procSwitches(pid)
	// utime+stime are 10 ms ticks, scaled by the kernel to the run
	// time it keeps in ns (cputime_adjust), so they agree only roughly:
	// half of it at least.
	if run1-run0 < 30*time.Millisecond {
		t.Errorf("time on a CPU moved by %v while utime+stime moved by 60 ms", run1-run0)
	}
	if sw1-sw0 < 5 {
		t.Errorf("context switches moved by %d over 5 sleeps", sw1-sw0)
	}
}
