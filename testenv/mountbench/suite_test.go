package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"slices"
	"strings"
	"testing"
)

// sampleResults is a small made-up run: one client count, a few systems.
func sampleResults() *suiteResults {
	sn := sysMount("sqlite", "normal")
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
		},
		// The goals prefer the interleaved figures when both sides have one.
		Interleaved: []row{
			{System: sn, Op: "publish", Clients: 1, OpsPerSec: 3000},
			{System: sysLoopback, Op: "publish", Clients: 1, OpsPerSec: 2000},
			{System: sysGoqite, Op: "roundtrip", Clients: 1, OpsPerSec: 1000},
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
	for _, tc := range []struct {
		name    string
		value   float64
		met     bool
		missing bool
	}{
		{sn + " publish, 1 client(s) ÷ loopback", 1.5, true, false},
		{sn + " ack, 1 client(s) ÷ loopback", 0, false, true},
		{sn + " round trip, 1 client(s) ÷ goqite-style", 0.6, true, false},
		{sn + " round trip, 4 client(s) ÷ goqite-style", 0, false, true},
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
	if g := byName[sn+" publish, 1 client(s) ÷ loopback"]; g.Note != "interleaved" {
		t.Errorf("publish ÷ loopback: note %q, want interleaved", g.Note)
	}
	if g := byName[sn+" round trip, 1 client(s) ÷ goqite-style"]; g.Note != "" {
		t.Errorf("round trip ÷ goqite: note %q; the mount has no interleaved round trip here", g.Note)
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
	for _, k := range []string{"started", "seconds", "mode", "million", "floor", "rows", "wakeup", "expiry", "resources", "scale", "goals", "notes"} {
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
	for _, want := range []string{"## Throughput", "| plain dir | 1 | 10000 | — | — | — |", "## Goals"} {
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
