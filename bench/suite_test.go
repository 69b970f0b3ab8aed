package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// sampleResults is a small made-up run: one client count, both
// transports, a few systems, three rounds.
func sampleResults() *suiteResults {
	snC, snU := sysMount("sqlite", "normal", transportClassic), sysMount("sqlite", "normal", transportUring)
	sfC, ffC := sysMount("sqlite", goalSync, transportClassic), sysMount("fs", goalSync, transportClassic)
	sfU := sysMount("sqlite", goalSync, transportUring)
	rounds := func(v ...float64) []float64 { return v }
	r := &suiteResults{
		Mode: "quick", MessageBytes: msgSize, Transports: []string{transportClassic, transportUring}, Rounds: 3,
		Floor: []floorProbe{
			{Before: "start", Clients: 1, USPerRequest: 20, P50US: 10},
			{Before: snC, Clients: 1, USPerRequest: 25, P50US: 12},
		},
		Rows: []row{
			{System: sysPlain, Op: "publish", Clients: 1, OpsPerSec: 10000, RequestsPerOp: -1},
			{System: sysPlainFsync, Op: "publish", Clients: 1, OpsPerSec: 500, RequestsPerOp: -1},
			{System: snC, Op: "publish", Clients: 1, OpsPerSec: 2000, RequestsPerOp: 5, Requests: map[string]float64{"CREATE": 1, "RELEASE": 1}},
			{System: snU, Op: "publish", Clients: 1, OpsPerSec: 2600, RequestsPerOp: 5},
			{System: sysGoqite, Op: "publish", Clients: 1, OpsPerSec: 4000, RequestsPerOp: -1},
			{System: sysLoopback, Op: "publish", Clients: 1, OpsPerSec: 2500, RequestsPerOp: 5},
			{System: snC, Op: "roundtrip", Clients: 1, OpsPerSec: 900, RequestsPerOp: 8},
			{System: sysGoqite, Op: "roundtrip", Clients: 1, OpsPerSec: 1500, RequestsPerOp: -1},
			{System: sysInproc("sqlite", "normal"), Op: "roundtrip", Clients: 1, OpsPerSec: 3100, RequestsPerOp: -1},
			{System: sysMQueue, Op: "publish", Clients: 1, OpsPerSec: 500000, RequestsPerOp: -1},
			{System: ffC, Op: "publish", Clients: 1, OpsPerSec: 1250, RequestsPerOp: 5},
		},
		// The goals are medians of the rounds' ratios: round 2 is slow
		// for everybody (a busy machine), which the ratio does not see.
		Interleaved: []row{
			{System: sysLoopback, Op: "publish", Clients: 1, OpsPerSec: 2000, RoundOpsPerSec: rounds(2000, 1000, 2100), DaemonCPUUS: 40, DaemonSwitchesPerOp: 6},
			// Ratios 1.1, 1.2, 0.952…: median 1.1.
			{System: snC, Op: "publish", Clients: 1, OpsPerSec: 2200, RoundOpsPerSec: rounds(2200, 1200, 2000), DaemonCPUUS: 55.5, DaemonSwitchesPerOp: 7.25},
			// Ratios 1.25, 1.3, 1.238…: median 1.25, under uring's 1.3.
			{System: snU, Op: "publish", Clients: 1, OpsPerSec: 2500, RoundOpsPerSec: rounds(2500, 1300, 2600), DaemonCPUUS: 30, DaemonSwitchesPerOp: 3},
			{System: sysLoopbackSync, Op: "publish", Clients: 1, OpsPerSec: 800, RoundOpsPerSec: rounds(800, 400, 900)},
			// Ratios 1.5, 1.5, 0.667: median 1.5.
			{System: sfC, Op: "publish", Clients: 1, OpsPerSec: 1200, RoundOpsPerSec: rounds(1200, 600, 600)},
			// One round fewer than its reference: no ratio.
			{System: sfU, Op: "publish", Clients: 1, OpsPerSec: 1200, RoundOpsPerSec: rounds(1200, 600)},
			{System: sysGoqite, Op: "roundtrip", Clients: 1, OpsPerSec: 1000, RoundOpsPerSec: rounds(1000, 900, 1100)},
			{System: sysInproc("sqlite", "normal"), Op: "roundtrip", Clients: 1, OpsPerSec: 2100, RoundOpsPerSec: rounds(2100, 1700, 2300)},
		},
		Big: []bigRow{
			{System: sysLoopback, Op: "read", Clients: 4, MiBPerSec: 1000, RoundMiBPerSec: rounds(1000, 800, 1200)},
			{System: sfC, Op: "read", Clients: 4, MiBPerSec: 900, RoundMiBPerSec: rounds(900, 800, 600)},
		},
		Latency: []latencyRow{
			{System: ffC, Op: "ack", Clients: 4, PeakRTPerS: 800, RTPerS: 400, Samples: 2000, P99US: 1500, P999US: 12000, StealPct: 7},
			{System: ffC, Op: "publish", Clients: 4, PeakRTPerS: 800, RTPerS: 400, Samples: 2000, P99US: 3000, P999US: 9000, StealPct: 7, RoundP99US: rounds(3000, 2000, 9000)},
			// Ratios 1.5, 2, 1.8: median 1.8.
			{System: latencyRow{System: ffC}.reference(), Op: "publish", Clients: 4, PeakRTPerS: 800, RTPerS: 400, Samples: 2000, P99US: 2500, P999US: 6000, StealPct: 3, RoundP99US: rounds(2000, 1000, 5000)},
			{System: sfC, Op: "publish", Clients: 4, RTPerS: 500, P99US: 1000, RoundP99US: rounds(1000, 1100, 900)},
			// Ratios 1, 1.1, 1.5: median 1.1.
			{System: latencyRow{System: sfC}.reference(), Op: "publish", Clients: 4, RTPerS: 500, P99US: 800, RoundP99US: rounds(1000, 1000, 600)},
		},
		Wake: []wakeRow{
			{System: snC, Samples: 100, P50US: 600, P99US: 6000},
			{System: sysPlain, Samples: 100, P50US: 60, P99US: 300},
		},
		Expiry:    []expiryRow{{System: snC, Samples: 4, P50MS: 2, MaxMS: 120}},
		Resources: []resourceRow{{System: snC, RSSIdleMiB: 18, IdleSeconds: 60, WakeupsPerSec: 0.2}},
		Scales:    []scaleResult{{System: snU, Transport: transportUring, Ready: 100_000, RSSMiB: 40, EmptyRTPerS: 1000, FullRTPerS: 900, Ratio: 0.9}},
	}
	r.computeRatios()
	r.Goals = r.computeGoals()
	return r
}

func TestComputeRatios(t *testing.T) {
	r := sampleResults()
	sn := sysMount("sqlite", "normal", transportClassic)
	for _, tc := range []struct {
		system, op                  string
		xPlain, xFsync, ref, xFloor float64
	}{
		// A mount: its own requests and the floor probed before it.
		// 1e6/2000 = 500 µs per publish; 5 requests × 25 µs = 125 µs.
		{sn, "publish", 5, 0.25, 125, 4},
		// Not a mount: the sqlite/normal mount's requests, the start floor.
		{sysGoqite, "publish", 2.5, 0.125, 100, 2.5},
		{sysPlain, "publish", 1, 0.05, 100, 1},
		{sysMQueue, "publish", 0.02, 0.001, 100, 0.02},
		// No plain round trip in the sample: no plain ratios.
		{sn, "roundtrip", 0, 0, 200, 5.56},
	} {
		x, ok := r.findRow(tc.system, tc.op, 1)
		if !ok {
			t.Fatalf("no row %s %s", tc.system, tc.op)
		}
		if x.XPlain != tc.xPlain || x.XPlainFsync != tc.xFsync || x.FloorRefUS != tc.ref || x.XFloor != tc.xFloor {
			t.Errorf("%s %s: × plain %v, × plain+fsync %v, floor ref %v µs, × floor %v; want %v, %v, %v, %v",
				tc.system, tc.op, x.XPlain, x.XPlainFsync, x.FloorRefUS, x.XFloor, tc.xPlain, tc.xFsync, tc.ref, tc.xFloor)
		}
	}
	w, _ := r.findWake(sn)
	// Critical path: 5 requests − RELEASE + the READ's answer = 5;
	// 600 µs ÷ (12 µs × 5) = 10.
	if w.CriticalRequests != 5 || w.XFloor != 10 || w.XPlain != 10 {
		t.Errorf(".next: critical %v, × floor %v, × plain %v; want 5, 10, 10", w.CriticalRequests, w.XFloor, w.XPlain)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
		ok   bool
	}{
		{nil, 0, false},
		{[]float64{3}, 3, true},
		{[]float64{5, 1, 3}, 3, true},
		{[]float64{4, 1, 3, 2}, 2.5, true},
		{[]float64{9, 1, 8, 2, 7}, 7, true},
	} {
		in := slices.Clone(tc.in)
		got, ok := median(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("median(%v) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
		if !slices.Equal(in, tc.in) {
			t.Errorf("median reordered its input: %v, was %v", tc.in, in)
		}
	}
}

func TestMedianRatio(t *testing.T) {
	for _, tc := range []struct {
		a, b []float64
		want float64
		ok   bool
	}{
		// Round by round: 2/1, 3/2, 4/4 → 2, 1.5, 1 → 1.5; the ratio of
		// the medians (3/2) would be the same here, but not below.
		{[]float64{2, 3, 4}, []float64{1, 2, 4}, 1.5, true},
		// A slow round for both: 1000/500 = 2, 100/100 = 1, 1100/500 = 2.2
		// → 2; the medians' ratio would say 1000/500 = 2 too, the sums'
		// 2200/1100 = 2; the mean of the ratios 1.73.
		{[]float64{1000, 100, 1100}, []float64{500, 100, 500}, 2, true},
		// Rounds that differ: the medians' ratio (4/4 = 1) hides that A
		// lost every round.
		{[]float64{4, 8, 2}, []float64{5, 10, 4}, 0.8, true},
		// A round where one side has nothing is left out.
		{[]float64{2, 0, 6}, []float64{1, 5, 2}, 2.5, true},
		{[]float64{1, 2}, []float64{1, 2, 3}, 0, false},
		{nil, nil, 0, false},
		{[]float64{0}, []float64{1}, 0, false},
	} {
		got, ok := medianRatio(tc.a, tc.b)
		if math.Abs(got-tc.want) > 1e-9 || ok != tc.ok {
			t.Errorf("medianRatio(%v, %v) = %v, %v; want %v, %v", tc.a, tc.b, got, ok, tc.want, tc.ok)
		}
	}
}

func TestComputeGoals(t *testing.T) {
	r := sampleResults()
	byName := map[string]goal{}
	for _, g := range r.Goals {
		if _, dup := byName[g.Name]; dup {
			t.Errorf("two goals named %q", g.Name)
		}
		byName[g.Name] = g
	}
	snC, snU := sysMount("sqlite", "normal", transportClassic), sysMount("sqlite", "normal", transportUring)
	fnC := sysMount("fs", "normal", transportClassic)
	sfC, ffC := sysMount("sqlite", goalSync, transportClassic), sysMount("fs", goalSync, transportClassic)
	sfU, ffU := sysMount("sqlite", goalSync, transportUring), sysMount("fs", goalSync, transportUring)
	for _, tc := range []struct {
		name    string
		value   float64
		target  float64
		cmp     string
		met     bool
		missing bool
	}{
		// Like with like, per transport: classic ≥ 1, io_uring ≥ 1.3.
		{snC + " publish, 1 client(s) ÷ loopback", 1.1, 1, ">=", true, false},
		{snU + " publish, 1 client(s) ÷ loopback", 1.25, 1.3, ">=", false, false},
		{snC + " ack, 1 client(s) ÷ loopback", 0, 1, ">=", false, true},
		{fnC + " publish, 1 client(s) ÷ loopback", 0, 1, ">=", false, true},
		// --sync full against the loopback that syncs at flush.
		{sfC + " publish, 1 client(s) ÷ loopback with fdatasync at flush", 1.5, 1, ">=", true, false},
		{sfU + " publish, 1 client(s) ÷ loopback with fdatasync at flush", 0, 1, ">=", false, true},
		{ffU + " publish, 1 client(s) ÷ loopback with fdatasync at flush", 0, 1, ">=", false, true},
		// The durable publish's p99 against the plain directory's.
		{ffC + " publish p99 at half of peak ÷ plain dir with fdatasync at close", 1.8, 1.5, "<=", false, false},
		{sfC + " publish p99 at half of peak ÷ plain dir with fdatasync at close", 1.1, 1.5, "<=", true, false},
		{sfU + " publish p99 at half of peak ÷ plain dir with fdatasync at close", 0, 1.5, "<=", false, true},
		{ffC + " ack p99 at half of peak", 1.5, 2, "<", true, false},
		{ffC + " ack p99.9 at half of peak", 12, 10, "<", false, false},
		{sfC + " ack p99 at half of peak", 0, 2, "<", false, true},
		// Medians 2.1/1 … : 2.1, 1.889, 2.091 → 2.09.
		{"queuecore sqlite/normal in process round trip, 1 client(s) ÷ goqite-style", 2.09, 2, ">=", true, false},
		{"mount sqlite (classic) publish, 4 clients, full ÷ normal", 0, 0.5, ">=", false, true},
		// 0.9, 1, 0.5 → 0.9.
		{sfC + " 1 MiB read bandwidth ÷ loopback", 0.9, 0.8, ">=", true, false},
		{ffC + " 1 MiB read bandwidth ÷ loopback", 0, 0.8, ">=", false, true},
		{snC + " .next wake-up p50", 0.6, 1, "<", true, false},
		{snC + " .next wake-up p99", 6, 5, "<", false, false},
		{snU + " .next wake-up p99", 0, 5, "<", false, true},
		{snC + " lease-expiry redelivery (max)", 120, 100, "<", false, false},
		{snC + " idle RSS after mount", 18, 20, "<", true, false},
		{snC + " idle wakeups", 0.2, 1, "<", true, false},
		{fnC + " idle wakeups", 0, 1, "<", false, true},
		{"daemon RSS with 100k ready (uring)", 40, 64, "<", true, false},
		{"mount round trip with 100k ready ÷ empty queue (uring)", 0.9, 0.8, ">=", true, false},
		{"daemon RSS with 1M ready (classic)", 0, 64, "<", false, true},
		// Reported, no target, never met.
		{"daemon CPU per publish, 1 client(s): " + snC, 55.5, 0, "report", false, false},
		{"daemon context switches per publish, 1 client(s): " + snU, 3, 0, "report", false, false},
		{"daemon CPU per publish, 1 client(s): " + sysLoopback, 40, 0, "report", false, false},
		{"daemon CPU per lease, 1 client(s): " + snC, 0, 0, "report", false, true},
	} {
		g, ok := byName[tc.name]
		if !ok {
			t.Errorf("no goal %q", tc.name)
			continue
		}
		if g.Value != tc.value || g.Target != tc.target || g.Cmp != tc.cmp || g.Met != tc.met || g.Missing != tc.missing {
			t.Errorf("%s: value %v target %s %v met %v missing %v; want %v %s %v %v %v", tc.name, g.Value, g.Cmp, g.Target, g.Met, g.Missing,
				tc.value, tc.cmp, tc.target, tc.met, tc.missing)
		}
	}
	// No goal compares a mount with goqite-style in process, nor a mount
	// at --sync full with the loopback that syncs nothing, nor the 1 MiB
	// publish (a durable commit against the page cache).
	for name := range byName {
		if strings.HasPrefix(name, "mount ") && strings.Contains(name, "goqite") {
			t.Errorf("goal %q compares a mount with goqite-style", name)
		}
		if strings.Contains(name, "/full") && strings.HasSuffix(name, "÷ loopback") && !strings.Contains(name, "1 MiB read") {
			t.Errorf("goal %q compares a durable publish with the loopback that syncs nothing", name)
		}
		if strings.Contains(name, "1 MiB publish") || strings.Contains(name, "publish p99.9") || strings.HasSuffix(name, "publish p99 at half of peak") {
			t.Errorf("goal %q is not one of issue 42's", name)
		}
	}
	if g := byName[snC+" publish, 1 client(s) ÷ loopback"]; g.Note != "median of 3 rounds" {
		t.Errorf("publish ÷ loopback: note %q, want the rounds", g.Note)
	}
	if g := byName[ffC+" publish p99 at half of peak ÷ plain dir with fdatasync at close"]; !strings.Contains(g.Note, "p99 3.00 ms against 2.50 ms") || !strings.Contains(g.Note, "CPU steal 7%") {
		t.Errorf("publish p99 goal's note %q should give both p99s over all rounds and the steal", g.Note)
	}
	if g := byName[ffC+" ack p99.9 at half of peak"]; !strings.Contains(g.Note, "2000 samples, 4 clients at 400 of 800 round trips/s") {
		t.Errorf("latency goal's note %q should say the load and the samples", g.Note)
	}
	if _, ok := byName[latencyRow{System: ffC}.reference()+" publish p99 at half of peak"]; ok {
		t.Error("the plain directory's reference row became a goal")
	}
	if g := byName["daemon RSS with 100k ready (uring)"]; !strings.Contains(g.Note, "not 1M") {
		t.Errorf("the scale goal's note %q should say it did not run with 1M", g.Note)
	}
	var buf bytes.Buffer
	r.reportGoals(&buf)
	out := buf.String()
	for _, want := range []string{
		"| 1.10 × | ≥ 1 × | met |",
		"| 1.25 × | ≥ 1.3 × | not met |",
		"| 1.80 × | ≤ 1.5 × | not met |",
		"| not measured | ≥ 1 × | — |",
		"| 6.00 ms | < 5 ms | not met |",
		// The reported rows: a table of their own, the systems side by side.
		"| per operation | clients | go-fuse loopback | " + snC + " | " + fnC + " | " + snU + " |",
		"| daemon CPU per publish | 1 | 40.00 µs/op | 55.50 µs/op | — | 30.00 µs/op | — |",
		"| daemon context switches per publish | 1 | 6.00 /op | 7.25 /op | — | 3.00 /op | — |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("goals table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "| daemon CPU per publish, 1 client(s)") {
		t.Errorf("a reported row is in the goals' table:\n%s", out)
	}
}

// TestJSONShape pins the field names that readers of bench-latest.json
// (docs/bench.md, scripts) use.
func TestJSONShape(t *testing.T) {
	data, err := json.Marshal(sampleResults())
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"started", "seconds", "mode", "million", "transports", "rounds", "floor", "rows", "interleaved", "wakeup", "expiry", "resources", "scales", "big_messages", "latency", "goals", "notes"} {
		if _, ok := top[k]; !ok {
			t.Errorf("no top-level %q in %s", k, data)
		}
	}
	var rows []map[string]any
	if err := json.Unmarshal(top["rows"], &rows); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"system", "op", "clients", "ops_per_sec", "p50_us", "p99_us", "cpu_s_per_10k", "fuse_requests_per_op", "x_plain", "x_plain_fsync", "x_floor"} {
		if _, ok := rows[0][k]; !ok {
			t.Errorf("no %q in a row: %v", k, rows[0])
		}
	}
	var goals []map[string]any
	if err := json.Unmarshal(top["goals"], &goals); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range goals[0] {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"cmp", "met", "name", "note", "target", "unit", "value"}; !slices.Equal(keys, want) {
		t.Errorf("goal keys %q, want %q", keys, want)
	}
}

func TestReportAndChart(t *testing.T) {
	r := sampleResults()
	var buf bytes.Buffer
	r.report(&buf)
	for _, want := range []string{"## Throughput", "| plain dir | 1 | 10000 | — | — | — |", "## Goals",
		"| mount sqlite/full (classic) | 4 | read | 0 | 900.0 | 900, 800, 600 | 0.00 | 0.00 | 0.90 |",
		"| mount fs/full (classic) | 4 | publish | 800 | 0 | 400 | 2000 | 0 | 0 | 3000 | 9000 | 0 | 3000, 2000, 9000 | 7% |",
		"| publish | 1 | mount sqlite/normal (classic) | 2200 | 2200, 1200, 2000 | 1.10 | go-fuse loopback | 55.50 | 7.25 | 0.00 |",
		"| publish | 1 | mount sqlite/full (classic) | 1200 | 1200, 600, 600 | 1.50 | go-fuse loopback, fdatasync at flush |",
		"| roundtrip | 1 | queuecore sqlite/normal | 2100 | 2100, 1700, 2300 | 2.09 | goqite-style |"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	data, err := r.chartPNG()
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 400 {
		t.Errorf("chart is %v", b)
	}
}

func TestParseMQLines(t *testing.T) {
	out := []byte(`{"room":10}
{"op":"publish","clients":4,"ops":1000,"seconds":0.002,"p50_us":1.10,"p99_us":2.50,"cpu_s":0.003}

`)
	lines, err := parseMQLines(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || lines[0].Room != 10 || lines[1].Op != "publish" || lines[1].Clients != 4 || lines[1].P99US != 2.5 {
		t.Errorf("parsed %+v", lines)
	}
	if _, err := parseMQLines([]byte("mq_open: Invalid argument\n")); err == nil {
		t.Error("no error for a line that is not JSON")
	}
}

func TestCountName(t *testing.T) {
	for n, want := range map[int]string{1_000_000: "1M", 100_000: "100k", 20_000: "20k", 1500: "1500", 12: "12"} {
		if got := countName(n); got != want {
			t.Errorf("countName(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestComparePrevious: each goal gets the previous run's value, by its
// name or, for a run of one transport, by its name without the
// transport, and a goal met then and not now is flagged in the table.
func TestComparePrevious(t *testing.T) {
	r := sampleResults()
	snC, snU := sysMount("sqlite", "normal", transportClassic), sysMount("sqlite", "normal", transportUring)
	sn := sysMount("sqlite", "normal", "")
	prev := &suiteResults{Started: "then", Mode: "full", Goals: []goal{
		{Name: sn + " publish, 1 client(s) ÷ loopback", Value: 0.91, Met: false},
		{Name: sn + " .next wake-up p99", Value: 2.8, Met: true},
		{Name: snC + " .next wake-up p50", Value: 0.5, Met: true},
		{Name: sn + " .next wake-up p50", Value: 0.7, Met: true},
		{Name: sn + " idle wakeups", Missing: true},
		{Name: "daemon CPU per publish, 1 client(s): " + snC, Value: 60, Cmp: "report"},
	}}
	r.comparePrevious(prev, "results/bench-latest.json")
	byName := map[string]goal{}
	for _, g := range r.Goals {
		byName[g.Name] = g
	}
	for _, name := range []string{snC + " publish, 1 client(s) ÷ loopback", snU + " publish, 1 client(s) ÷ loopback"} {
		if g := byName[name]; !g.HavePrev || g.PrevValue != 0.91 || g.PrevMet || g.PrevAs != sn+" publish, 1 client(s) ÷ loopback" || g.Regressed {
			t.Errorf("%s compared as %+v", name, g)
		}
	}
	if g := byName[snC+" .next wake-up p99"]; !g.HavePrev || !g.PrevMet || g.PrevAs != sn+" .next wake-up p99" || !g.Regressed {
		t.Errorf(".next p99 (met before, 6 ms now): %+v, want regressed", g)
	}
	// Its own name first, then the name without the transport.
	if g := byName[snC+" .next wake-up p50"]; !g.HavePrev || g.PrevValue != 0.5 || g.PrevAs != "" || g.Regressed {
		t.Errorf(".next p50 (met before and now): %+v", g)
	}
	if g := byName[snC+" idle wakeups"]; g.HavePrev {
		t.Errorf("idle wakeups: the previous run did not measure it, yet %+v", g)
	}
	if g := byName["daemon CPU per publish, 1 client(s): "+snC]; !g.HavePrev || g.PrevValue != 60 || g.Regressed {
		t.Errorf("a reported row compared as %+v", g)
	}
	var buf bytes.Buffer
	r.reportGoals(&buf)
	out := buf.String()
	for _, want := range []string{
		"Previous: results/bench-latest.json (full mode, started then).",
		"| 6.00 ms | < 5 ms | not met | 2.80 ms, met (as " + sn + " .next wake-up p99) — **NO LONGER MET** |",
		"| 1.10 × | ≥ 1 × | met | 0.91 ×, not met (as " + sn + " publish, 1 client(s) ÷ loopback) |",
		"| not measured | ≥ 1 × | — | — |",
		"1 goal(s) met in the previous run are not met in this one.",
		"(in brackets: the previous run's)",
		"| daemon CPU per publish | 1 | 40.00 µs/op | 55.50 µs/op (60.00) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("goals table lacks %q:\n%s", want, out)
		}
	}
}

// TestPacedAndBigOnPlainDir runs the latency step's paced load and the
// 1 MiB step's phases on a plain directory: every round trip's three
// operations are timed, every message is gone at the end, and a read
// back checks the bytes.
func TestPacedAndBigOnPlainDir(t *testing.T) {
	dir := t.TempDir()
	q := queueDirs{inbox: filepath.Join(dir, "inbox"), processing: filepath.Join(dir, "processing")}
	for _, p := range []string{q.inbox, q.processing} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	res, err := runPaced(context.Background(), q, "p", 2, 200, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// The latency step's reference: the publish syncs its file.
	synced := q
	synced.syncAtClose = true
	if sres, err := runPaced(context.Background(), synced, "s", 2, 100, 200*time.Millisecond); err != nil || sres.roundTrips == 0 {
		t.Fatalf("paced load with a sync at close: %d round trips, %v", sres.roundTrips, err)
	}
	if res.roundTrips == 0 {
		t.Fatal("no round trip ran")
	}
	for _, op := range []opKind{opPublish, opLease, opAck} {
		if len(res.lat[op]) != res.roundTrips {
			t.Errorf("%s: %d latencies for %d round trips", op, len(res.lat[op]), res.roundTrips)
		}
	}
	for _, p := range []string{q.inbox, q.processing} {
		if left, _ := os.ReadDir(p); len(left) != 0 {
			t.Errorf("%s: %d files left after the round trips", p, len(left))
		}
	}

	body := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	for _, op := range []string{"publish", "read"} {
		ph, err := runBigPhase(context.Background(), q.inbox, op, "b", 6, 4, body)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if len(ph.lat) != 6 {
			t.Errorf("%s: %d latencies, want 6", op, len(ph.lat))
		}
	}
	// A file that differs from what was published fails the read.
	name := filepath.Join(q.inbox, msgName("b", 0, 0))
	if err := os.WriteFile(name, body[:len(body)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readBack(name, make([]byte, len(body)), body); err == nil {
		t.Error("a short file read back without an error")
	}
	if err := os.WriteFile(name, append(slices.Clone(body), 'x'), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readBack(name, make([]byte, len(body)), body); err == nil {
		t.Error("a longer file read back without an error")
	}
}

// TestParseCPUTimes: the total leaves guest time out (it is in user and
// nice already), and steal is the eighth field.
func TestParseCPUTimes(t *testing.T) {
	for _, tc := range []struct {
		stat         string
		total, steal uint64
	}{
		{"cpu  100 2 30 800 5 1 2 60 40 0\ncpu0 50 1 15 400 2 0 1 30 20 0\n", 1000, 60},
		{"cpu  100 2 30 800 5 1 2 60\n", 1000, 60},
		{"cpu  100 2 30 800 5 1 2\n", 0, 0}, // no steal field: not counted
		{"cpu0 100 2 30 800 5 1 2 60\n", 0, 0},
		{"cpu  100 x 30 800 5 1 2 60\n", 0, 0},
		{"", 0, 0},
	} {
		if total, steal := parseCPUTimes(tc.stat); total != tc.total || steal != tc.steal {
			t.Errorf("parseCPUTimes(%q) = %d, %d; want %d, %d", tc.stat, total, steal, tc.total, tc.steal)
		}
	}
	if got := stealPct(1000, 60, 2000, 110); got != 5 {
		t.Errorf("stealPct = %v, want 5", got)
	}
	if got := stealPct(1000, 60, 1000, 60); got != 0 {
		t.Errorf("stealPct over no time = %v, want 0", got)
	}
	if total, _ := cpuTimes(); total == 0 {
		t.Error("cpuTimes read nothing from /proc/stat")
	}
}

// TestFullOverNormalGoal: "full ÷ normal" is the median of the rounds'
// ratios of both publishes in the interleaved step; without the step it
// is not measured (the main tables' figures, minutes apart, are no
// ratio).
func TestFullOverNormalGoal(t *testing.T) {
	pub := func(sys string, ops float64, rounds ...float64) row {
		return row{System: sys, Op: "publish", Clients: 4, OpsPerSec: ops, RoundOpsPerSec: rounds}
	}
	sf, sn := sysMount("sqlite", "full", transportClassic), sysMount("sqlite", "normal", transportClassic)
	r := &suiteResults{
		Rows:        []row{pub(sf, 2400), pub(sn, 5000)},
		Interleaved: []row{pub(sf, 2900, 2900, 1000, 3000), pub(sn, 4300, 4300, 4000, 4400)},
	}
	goalOf := func(r *suiteResults) goal {
		for _, g := range r.computeGoals() {
			if g.Name == "mount sqlite (classic) publish, 4 clients, full ÷ normal" {
				return g
			}
		}
		t.Fatal("no full ÷ normal goal")
		return goal{}
	}
	// 0.674, 0.25, 0.682: median 0.67.
	if g := goalOf(r); g.Value != 0.67 || !g.Met || g.Note != "median of 3 rounds" {
		t.Errorf("with interleaved rows: %+v, want 0.67, met, the median of 3 rounds", g)
	}
	r.Interleaved = nil
	if g := goalOf(r); !g.Missing || g.Met {
		t.Errorf("without interleaved rows: %+v, want not measured", g)
	}
}
