package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// sampleResults is a small made-up run: one client count, a few systems.
func sampleResults() *suiteResults {
	sn := sysMount("sqlite", "normal")
	sf, ff := sysMount("sqlite", goalSync), sysMount("fs", goalSync)
	r := &suiteResults{
		Mode: "quick", MessageBytes: msgSize,
		Floor: []floorProbe{
			{Before: "start", Clients: 1, USPerRequest: 20, P50US: 10},
			{Before: sn, Clients: 1, USPerRequest: 25, P50US: 12},
		},
		Rows: []row{
			{System: sysPlain, Op: "publish", Clients: 1, OpsPerSec: 10000, RequestsPerOp: -1},
			{System: sysPlainFsync, Op: "publish", Clients: 1, OpsPerSec: 500, RequestsPerOp: -1},
			{System: sn, Op: "publish", Clients: 1, OpsPerSec: 2000, RequestsPerOp: 5, Requests: map[string]float64{"CREATE": 1, "RELEASE": 1}},
			{System: sysGoqite, Op: "publish", Clients: 1, OpsPerSec: 4000, RequestsPerOp: -1},
			{System: sysLoopback, Op: "publish", Clients: 1, OpsPerSec: 2500, RequestsPerOp: 5},
			{System: sn, Op: "roundtrip", Clients: 1, OpsPerSec: 900, RequestsPerOp: 8},
			{System: sysGoqite, Op: "roundtrip", Clients: 1, OpsPerSec: 1500, RequestsPerOp: -1},
			{System: sysInproc("sqlite", "normal"), Op: "roundtrip", Clients: 1, OpsPerSec: 3100, RequestsPerOp: -1},
			{System: sysMQueue, Op: "publish", Clients: 1, OpsPerSec: 500000, RequestsPerOp: -1},
			// Not in the interleaved step: its goal comes from here.
			{System: ff, Op: "publish", Clients: 1, OpsPerSec: 1250, RequestsPerOp: 5},
		},
		// The goals prefer the interleaved figures when both sides have one.
		Interleaved: []row{
			{System: sf, Op: "publish", Clients: 1, OpsPerSec: 3000},
			{System: sysLoopback, Op: "publish", Clients: 1, OpsPerSec: 2000},
			{System: sysGoqite, Op: "roundtrip", Clients: 1, OpsPerSec: 1000},
			{System: sf, Op: "roundtrip", Clients: 1, OpsPerSec: 600},
		},
		Big: []bigRow{
			{System: sysLoopback, Op: "publish", Clients: 4, MiBPerSec: 400},
			{System: sf, Op: "publish", Clients: 4, MiBPerSec: 100},
			{System: sysLoopback, Op: "read", Clients: 4, MiBPerSec: 1000},
			{System: sf, Op: "read", Clients: 4, MiBPerSec: 900},
		},
		Latency: []latencyRow{
			{System: ff, Op: "ack", Clients: 4, PeakRTPerS: 800, RTPerS: 400, Samples: 2000, P99US: 1500, P999US: 12000, StealPct: 7},
			{System: ff, Op: "publish", Clients: 4, PeakRTPerS: 800, RTPerS: 400, Samples: 2000, P99US: 3000, P999US: 9000, StealPct: 7},
			{System: latencyRow{System: ff}.reference(), Op: "publish", Clients: 4, PeakRTPerS: 800, RTPerS: 400, Samples: 2000, P99US: 2500, P999US: 6000, StealPct: 3},
		},
		Wake: []wakeRow{
			{System: sn, Samples: 100, P50US: 600, P99US: 6000},
			{System: sysPlain, Samples: 100, P50US: 60, P99US: 300},
		},
		Expiry:    []expiryRow{{System: sn, Samples: 4, P50MS: 2, MaxMS: 120}},
		Resources: []resourceRow{{System: sn, RSSIdleMiB: 18, IdleSeconds: 60, WakeupsPerSec: 0.2}},
		Scale:     &scaleResult{System: sn, Ready: 100_000, RSSMiB: 40, EmptyRTPerS: 1000, FullRTPerS: 900, Ratio: 0.9},
	}
	r.computeRatios()
	r.Goals = r.computeGoals()
	return r
}

func TestComputeRatios(t *testing.T) {
	r := sampleResults()
	sn := sysMount("sqlite", "normal")
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

func TestComputeGoals(t *testing.T) {
	r := sampleResults()
	byName := map[string]goal{}
	for _, g := range r.Goals {
		byName[g.Name] = g
	}
	sn := sysMount("sqlite", "normal")
	sf, ff := sysMount("sqlite", goalSync), sysMount("fs", goalSync)
	for _, tc := range []struct {
		name    string
		value   float64
		met     bool
		missing bool
	}{
		{sf + " publish, 1 client(s) ÷ loopback", 1.5, true, false},
		{ff + " publish, 1 client(s) ÷ loopback", 0.5, false, false},
		{sf + " ack, 1 client(s) ÷ loopback", 0, false, true},
		{sf + " round trip, 1 client(s) ÷ goqite-style", 0.6, true, false},
		{sf + " round trip, 4 client(s) ÷ goqite-style", 0, false, true},
		{ff + " round trip, 1 client(s) ÷ goqite-style", 0, false, true},
		{sf + " 1 MiB publish bandwidth ÷ loopback", 0.25, false, false},
		{sf + " 1 MiB read bandwidth ÷ loopback", 0.9, true, false},
		{ff + " 1 MiB read bandwidth ÷ loopback", 0, false, true},
		{ff + " ack p99 at half of peak", 1.5, true, false},
		{ff + " ack p99.9 at half of peak", 12, false, false},
		{sf + " ack p99 at half of peak", 0, false, true},
		{"queuecore sqlite/normal in process round trip, 1 client(s) ÷ goqite-style", 2.07, true, false},
		{sn + " .next wake-up p50", 0.6, true, false},
		{sn + " .next wake-up p99", 6, false, false},
		{sn + " lease-expiry redelivery (max)", 120, false, false},
		{sn + " idle RSS after mount", 18, true, false},
		{sn + " idle wakeups", 0.2, true, false},
		{sysMount("fs", "normal") + " idle wakeups", 0, false, true},
		{"daemon RSS with 100k ready", 40, true, false},
		{"mount round trip with 100k ready ÷ empty queue", 0.9, true, false},
	} {
		g, ok := byName[tc.name]
		if !ok {
			t.Errorf("no goal %q", tc.name)
			continue
		}
		if g.Value != tc.value || g.Met != tc.met || g.Missing != tc.missing {
			t.Errorf("%s: value %v met %v missing %v; want %v %v %v", tc.name, g.Value, g.Met, g.Missing, tc.value, tc.met, tc.missing)
		}
	}
	if g := byName[sf+" publish, 1 client(s) ÷ loopback"]; g.Note != "interleaved" {
		t.Errorf("publish ÷ loopback: note %q, want interleaved", g.Note)
	}
	if g := byName[ff+" publish, 1 client(s) ÷ loopback"]; g.Note != "" {
		t.Errorf("fs publish ÷ loopback: note %q; fs has no interleaved publish here, so it is from the main tables", g.Note)
	}
	if g := byName[ff+" ack p99.9 at half of peak"]; !strings.Contains(g.Note, "at 400 of 800 round trips/s, 2000 samples") {
		t.Errorf("latency goal's note %q should say the load and the samples", g.Note)
	}
	// The publish goals' notes carry the plain directory's tail at the
	// same pace, and every latency goal the CPU the machine lost.
	if g := byName[ff+" publish p99 at half of peak"]; !strings.Contains(g.Note, "CPU steal 7%; a plain directory, fdatasync at close, same pace: 2.50 ms") {
		t.Errorf("publish p99 goal's note %q should give the steal and the plain directory's p99", g.Note)
	}
	if g := byName[ff+" publish p99.9 at half of peak"]; !strings.Contains(g.Note, "same pace: 6.00 ms") {
		t.Errorf("publish p99.9 goal's note %q should give the plain directory's p99.9", g.Note)
	}
	if g := byName[ff+" ack p99 at half of peak"]; !strings.Contains(g.Note, "CPU steal 7%") || strings.Contains(g.Note, "plain directory") {
		t.Errorf("ack p99 goal's note %q should give the steal and no plain directory (its ack syncs nothing)", g.Note)
	}
	if _, ok := byName[latencyRow{System: ff}.reference()+" publish p99 at half of peak"]; ok {
		t.Error("the plain directory's reference row became a goal")
	}
	if g := byName["daemon RSS with 100k ready"]; !strings.Contains(g.Note, "not 1M") {
		t.Errorf("the scale goal's note %q should say it did not run with 1M", g.Note)
	}
	var buf bytes.Buffer
	r.reportGoals(&buf)
	for _, want := range []string{"| 0.60 × | ≥ 0.5 × | met |", "| not measured | ≥ 1 × | — |", "| 6.00 ms | < 5 ms | not met |"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("goals table lacks %q:\n%s", want, buf.String())
		}
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
	for _, k := range []string{"started", "seconds", "mode", "million", "floor", "rows", "wakeup", "expiry", "resources", "scale", "big_messages", "latency", "goals", "notes"} {
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
		"| mount sqlite/full | 4 | read | 0 | 900.0 | 0.00 | 0.00 | 0.90 |",
		"| mount fs/full | 4 | ack | 800 | 0 | 400 | 2000 | 0 | 0 | 1500 | 12000 | 0 |",
		"| publish | 1 | — | 2000 | 3000 | 1.50 | — | — |"} {
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
// name or as the same row of the other sync mode, and a goal met then and
// not now is flagged in the table.
func TestComparePrevious(t *testing.T) {
	r := sampleResults()
	sn, sf := sysMount("sqlite", "normal"), sysMount("sqlite", goalSync)
	prev := &suiteResults{Started: "then", Mode: "full", Goals: []goal{
		{Name: sn + " publish, 1 client(s) ÷ loopback", Value: 0.91, Met: false},
		{Name: sn + " .next wake-up p99", Value: 2.8, Met: true},
		{Name: sn + " .next wake-up p50", Value: 0.5, Met: true},
		{Name: sn + " idle wakeups", Missing: true},
	}}
	r.comparePrevious(prev, "results/bench-latest.json")
	byName := map[string]goal{}
	for _, g := range r.Goals {
		byName[g.Name] = g
	}
	if g := byName[sf+" publish, 1 client(s) ÷ loopback"]; !g.HavePrev || g.PrevValue != 0.91 || g.PrevMet || g.PrevAs != sn+" publish, 1 client(s) ÷ loopback" || g.Regressed {
		t.Errorf("publish ÷ loopback compared as %+v", g)
	}
	if g := byName[sn+" .next wake-up p99"]; !g.HavePrev || !g.PrevMet || g.PrevAs != "" || !g.Regressed {
		t.Errorf(".next p99 (met before, 6 ms now): %+v, want regressed", g)
	}
	if g := byName[sn+" .next wake-up p50"]; !g.HavePrev || g.Regressed {
		t.Errorf(".next p50 (met before and now): %+v", g)
	}
	if g := byName[sn+" idle wakeups"]; g.HavePrev {
		t.Errorf("idle wakeups: the previous run did not measure it, yet %+v", g)
	}
	var buf bytes.Buffer
	r.reportGoals(&buf)
	out := buf.String()
	for _, want := range []string{
		"Previous: results/bench-latest.json (full mode, started then).",
		"| 6.00 ms | < 5 ms | not met | 2.80 ms, met — **NO LONGER MET** |",
		"| 1.50 × | ≥ 1 × | met | 0.91 ×, not met (as " + sn + " publish, 1 client(s) ÷ loopback) |",
		"1 goal(s) met in the previous run are not met in this one.",
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

// TestFullOverNormalGoal: "full ÷ normal" takes both publishes from the
// interleaved step when it has them, else from the main tables.
func TestFullOverNormalGoal(t *testing.T) {
	pub := func(sys string, ops float64) row {
		return row{System: sys, Op: "publish", Clients: 4, OpsPerSec: ops}
	}
	sf, sn := sysMount("sqlite", "full"), sysMount("sqlite", "normal")
	r := &suiteResults{
		Rows:        []row{pub(sf, 2400), pub(sn, 5000)},
		Interleaved: []row{pub(sf, 2900), pub(sn, 4300)},
	}
	goalOf := func(r *suiteResults) goal {
		for _, g := range r.computeGoals() {
			if g.Name == "mount sqlite publish, 4 clients, full ÷ normal" {
				return g
			}
		}
		t.Fatal("no full ÷ normal goal")
		return goal{}
	}
	if g := goalOf(r); g.Value != 0.67 || !g.Met || g.Note != "interleaved" {
		t.Errorf("with interleaved rows: %+v, want 0.67 (2900/4300), met, from the interleaved step", g)
	}
	r.Interleaved = nil
	if g := goalOf(r); g.Value != 0.48 || g.Met || g.Note != "" {
		t.Errorf("without interleaved rows: %+v, want 0.48 (2400/5000), not met, from the main tables", g)
	}
}
