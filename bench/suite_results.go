package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// The suite's results, the ratios between them and the goals, kept free
// of measuring so that suite_test.go can check them on made-up figures.

// System names, as the tables and the chart show them.
const (
	sysPlain      = "plain dir"
	sysPlainFsync = "plain dir + fsync"
	// sysPlainSyncClose is the latency step's reference: a publish that
	// fdatasyncs its file before close, at a store's paced rate.
	sysPlainSyncClose = "plain dir, fdatasync at close"
	sysLoopback       = "go-fuse loopback"
	// sysLoopbackSync is the loopback whose daemon fdatasyncs a written
	// file at FLUSH (loopbackd --sync-at-flush): close(2) returns with
	// the bytes on disk, as a publish on a --sync full mount.
	sysLoopbackSync = "go-fuse loopback, fdatasync at flush"
	sysGoqite       = "goqite-style"
	sysMQueue       = "POSIX mqueue"
)

// sysMount names a yirangmq mount: "mount sqlite/normal (uring)". An
// empty transport leaves the tag out (the names of runs from before the
// suite measured both transports).
func sysMount(store, sync, transport string) string {
	name := "mount " + store + "/" + sync
	if transport != "" {
		name += " (" + transport + ")"
	}
	return name
}

// withoutTransport drops the transport tags of a system or goal name:
// the name the same row had in a run of one transport.
func withoutTransport(name string) string {
	for _, t := range []string{transportClassic, transportUring} {
		name = strings.ReplaceAll(name, " ("+t+")", "")
	}
	return name
}

// goalSync is the sync mode of the mounts in the latency and 1 MiB
// goals: the daemon's default (yirangmq mount --sync full), as its users
// run it.
const goalSync = "full"

func sysInproc(store, sync string) string { return "queuecore " + store + "/" + sync }

// Operations, in table order.
var suiteOps = []string{"publish", "lease", "ack", "roundtrip"}

// suiteResults is what a run writes as JSON (results/bench-*.json).
type suiteResults struct {
	Started      string  `json:"started"`
	Seconds      float64 `json:"seconds"`
	Mode         string  `json:"mode"` // full or quick
	Million      bool    `json:"million"`
	Kernel       string  `json:"kernel"`
	CPUs         int     `json:"cpus"`
	GoVersion    string  `json:"go"`
	Filesystem   string  `json:"filesystem"`
	Workdir      string  `json:"workdir"`
	LoadBefore   string  `json:"loadavg_before"`
	LoadAfter    string  `json:"loadavg_after"`
	MessageBytes int     `json:"message_bytes"`
	CacheTimeout string  `json:"cache_timeout"`
	CountSource  string  `json:"requests_counted_by"`
	// Transports are the daemon's transports the run measured (classic,
	// uring); Rounds the rounds of the steps whose systems take turns.
	Transports []string `json:"transports"`
	Rounds     int      `json:"rounds"`

	Floor []floorProbe `json:"floor"`
	Rows  []row        `json:"rows"`
	// Interleaved are the goals' systems measured again taking turns,
	// round after round (suite_interleaved.go): the goals' ratios are
	// the medians of their rounds' ratios.
	Interleaved []row         `json:"interleaved"`
	Wake        []wakeRow     `json:"wakeup"`
	Expiry      []expiryRow   `json:"expiry"`
	Resources   []resourceRow `json:"resources"`
	Churn       *churnResult  `json:"churn,omitempty"`
	Scales      []scaleResult `json:"scales"` // one per transport
	Big         []bigRow      `json:"big_messages"`
	Latency     []latencyRow  `json:"latency"`
	Goals       []goal        `json:"goals"`
	// Previous is the run the goals were compared with (its
	// bench-latest.json), when there was one.
	Previous *previousRun `json:"previous,omitempty"`
	Notes    []string     `json:"notes"`
}

// floorProbe is the FUSE request floor measured before a system ran:
// fstat(2) on a --cache-timeout 0s mount, one GETATTR per call.
type floorProbe struct {
	Before       string  `json:"before"`
	Clients      int     `json:"clients"`
	USPerRequest float64 `json:"us_per_request"` // wall ÷ requests
	P50US        float64 `json:"p50_us_per_request"`
}

// row is one operation of one system at one client count.
type row struct {
	System        string             `json:"system"`
	Op            string             `json:"op"` // publish, lease, ack, roundtrip
	Clients       int                `json:"clients"`
	Ops           int                `json:"ops"`
	Seconds       float64            `json:"seconds"`
	OpsPerSec     float64            `json:"ops_per_sec"`
	P50US         float64            `json:"p50_us"`
	P99US         float64            `json:"p99_us"`
	ClientCPUUS   float64            `json:"client_cpu_us_per_op"`
	DaemonCPUUS   float64            `json:"daemon_cpu_us_per_op"`
	CPUSecPer10k  float64            `json:"cpu_s_per_10k"`        // (client + daemon) CPU seconds per 10,000 operations
	RequestsPerOp float64            `json:"fuse_requests_per_op"` // -1: not a mount, or not counted
	Requests      map[string]float64 `json:"fuse_requests_by_opcode_per_op,omitempty"`
	FsyncsPerOp   float64            `json:"fsyncs_per_op"` // on the store's files; -1: not counted
	OthersShare   float64            `json:"others_cpu_share"`
	// DaemonSwitchesPerOp is the daemon's context switches (voluntary
	// and not, all threads) per operation.
	DaemonSwitchesPerOp float64 `json:"daemon_switches_per_op,omitempty"`
	// RoundOpsPerSec is each round's ops/s, in the interleaved step
	// (whose OpsPerSec is their median).
	RoundOpsPerSec []float64 `json:"round_ops_per_sec,omitempty"`

	// XPlain is how many times the plain directory's time (no fsync,
	// same op and clients) this operation takes: plain ops/s ÷ ops/s.
	// XPlainFsync the same against the Maildir-careful directory.
	XPlain      float64 `json:"x_plain"`
	XPlainFsync float64 `json:"x_plain_fsync"`
	// FloorRefUS is the FUSE request floor (µs per request, same
	// clients) × the requests this operation needs through a mount (its
	// own count for a mount, the sqlite/normal mount's otherwise); XFloor
	// is the operation's time (1 ÷ ops/s) over it.
	FloorRefUS float64 `json:"floor_ref_us"`
	XFloor     float64 `json:"x_floor"`
}

// wakeRow is the wake-up of a blocked consumer when a message arrives.
type wakeRow struct {
	System           string  `json:"system"`
	How              string  `json:"how"`
	Samples          int     `json:"samples"`
	P50US            float64 `json:"p50_us"`
	P99US            float64 `json:"p99_us"`
	Unconfirmed      int     `json:"unconfirmed_blocked,omitempty"`
	CriticalRequests float64 `json:"critical_path_requests,omitempty"`
	XPlain           float64 `json:"x_plain"` // p50 ÷ the plain directory's (inotify) p50
	XFloor           float64 `json:"x_floor"` // p50 ÷ (floor p50 × critical-path requests)
}

// expiryRow is the lease-expiry redelivery delay: from the lease deadline
// (user.yirangmq.lease_deadline) to .next returning the message again.
type expiryRow struct {
	System  string  `json:"system"`
	Samples int     `json:"samples"`
	P50MS   float64 `json:"p50_ms"`
	MaxMS   float64 `json:"max_ms"`
	MinMS   float64 `json:"min_ms"`
}

// resourceRow is what a daemon costs when it does nothing.
type resourceRow struct {
	System        string  `json:"system"`
	PID           int     `json:"-"`
	RSSIdleMiB    float64 `json:"rss_after_mount_mib"`                // VmRSS right after the mount was ready
	RSSAnonMiB    float64 `json:"rss_anon_after_mount_mib,omitempty"` // its RssAnon
	RSSFileMiB    float64 `json:"rss_file_after_mount_mib,omitempty"` // its RssFile (binary and libraries)
	RSSEndMiB     float64 `json:"rss_after_idle_mib"`                 // VmRSS at the end of the idle window
	RSSEndAnonMiB float64 `json:"rss_anon_after_idle_mib,omitempty"`
	RSSEndFileMiB float64 `json:"rss_file_after_idle_mib,omitempty"`
	IdleSeconds   float64 `json:"idle_seconds"`         // length of the idle window
	IdleCPUMSPerS float64 `json:"idle_cpu_ms_per_s"`    // utime+stime over the window
	WakeupsPerSec float64 `json:"idle_wakeups_per_sec"` // context switches of all threads over the window
}

// churnResult: the sqlite/normal daemon after many round trips.
type churnResult struct {
	System       string  `json:"system"`
	Messages     int     `json:"messages"`
	Clients      int     `json:"clients"`
	Seconds      float64 `json:"seconds"`
	OpsPerSec    float64 `json:"roundtrips_per_sec"`
	CPUSecPer10k float64 `json:"cpu_s_per_10k"`
	RSSBeforeMiB float64 `json:"rss_before_mib"`
	RSSAfterMiB  float64 `json:"rss_after_mib"`
}

// scaleResult: a daemon on a store with many ready messages.
type scaleResult struct {
	System       string  `json:"system"`
	Transport    string  `json:"transport"`
	Ready        int     `json:"ready"`
	How          string  `json:"how"`
	FillSeconds  float64 `json:"fill_seconds"`
	MountSeconds float64 `json:"mount_seconds"` // start to ready
	RSSMiB       float64 `json:"rss_after_mount_mib"`
	RSSAfterMiB  float64 `json:"rss_after_roundtrips_mib"`
	RoundTrips   int     `json:"roundtrips_per_queue"`
	EmptyRTPerS  float64 `json:"empty_queue_roundtrips_per_sec"`
	FullRTPerS   float64 `json:"full_queue_roundtrips_per_sec"`
	Ratio        float64 `json:"ratio"` // full ÷ empty
}

// goal is one of the targets with what the run measured.
type goal struct {
	Name    string  `json:"name"`
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
	Cmp     string  `json:"cmp"` // ">=", "<=", "<", or "report" (no target: shown, never met)
	Target  float64 `json:"target"`
	Met     bool    `json:"met"`
	Missing bool    `json:"missing,omitempty"` // not measured in this run
	Note    string  `json:"note,omitempty"`

	// The same goal in the previous run, when it had it: its value and
	// whether it was met. PrevAs names the goal it was measured as when
	// the previous run had it under another name (without the transport:
	// a run of one transport). Regressed: met then, not met now.
	HavePrev  bool    `json:"have_previous,omitempty"`
	PrevValue float64 `json:"previous_value,omitempty"`
	PrevMet   bool    `json:"previous_met,omitempty"`
	PrevAs    string  `json:"previous_as,omitempty"`
	Regressed bool    `json:"regressed,omitempty"`
}

// previousRun says which run the goals were compared with.
type previousRun struct {
	File    string `json:"file"`
	Started string `json:"started"`
	Mode    string `json:"mode"`
}

func round4(f float64) float64 { return math.Round(f*1e4) / 1e4 }

// sig3 rounds a ratio to 3 significant digits: ratios here run from
// 0.001 (mqueue against fsync) to 100.
func sig3(f float64) float64 {
	if f == 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return f
	}
	scale := math.Pow(10, 2-math.Floor(math.Log10(math.Abs(f))))
	return math.Round(f*scale) / scale
}

// findRow returns the row of system, op and clients.
func (r *suiteResults) findRow(system, op string, clients int) (row, bool) {
	return findIn(r.Rows, system, op, clients)
}

func findIn(rows []row, system, op string, clients int) (row, bool) {
	for _, x := range rows {
		if x.System == system && x.Op == op && x.Clients == clients {
			return x, true
		}
	}
	return row{}, false
}

// floorFor is the floor probed right before system (or at the start),
// for clients.
func (r *suiteResults) floorFor(system string, clients int) (floorProbe, bool) {
	var start floorProbe
	found := false
	for _, f := range r.Floor {
		if f.Clients != clients {
			continue
		}
		if f.Before == system {
			return f, true
		}
		if f.Before == "start" {
			start, found = f, true
		}
	}
	return start, found
}

// isMount tells whether a system's operations go through FUSE.
func isMount(system string) bool {
	return strings.HasPrefix(system, "mount ") || system == sysLoopback
}

// computeRatios fills in each row's comparisons with the plain
// directory and the FUSE floor, and each wake-up's.
func (r *suiteResults) computeRatios() {
	// The requests of an operation off a mount: the sqlite/normal
	// mount's (the first transport's).
	ref := ""
	for _, x := range r.Rows {
		if strings.HasPrefix(x.System, sysMount("sqlite", "normal", "")) {
			ref = x.System
			break
		}
	}
	for i := range r.Rows {
		x := &r.Rows[i]
		x.XPlain, x.XPlainFsync, x.FloorRefUS, x.XFloor = 0, 0, 0, 0
		if x.OpsPerSec <= 0 {
			continue
		}
		if p, ok := r.findRow(sysPlain, x.Op, x.Clients); ok && p.OpsPerSec > 0 {
			x.XPlain = sig3(p.OpsPerSec / x.OpsPerSec)
		}
		if p, ok := r.findRow(sysPlainFsync, x.Op, x.Clients); ok && p.OpsPerSec > 0 {
			x.XPlainFsync = sig3(p.OpsPerSec / x.OpsPerSec)
		}
		req := x.RequestsPerOp
		if !isMount(x.System) || req <= 0 {
			req = 0
			if m, ok := r.findRow(ref, x.Op, x.Clients); ok {
				req = m.RequestsPerOp
			}
		}
		f, ok := r.floorFor(x.System, x.Clients)
		if ok && req > 0 && f.USPerRequest > 0 {
			x.FloorRefUS = round1(f.USPerRequest * req)
			x.XFloor = sig3(1e6 / x.OpsPerSec / x.FloorRefUS)
		}
	}
	var plainP50 float64
	for _, w := range r.Wake {
		if w.System == sysPlain {
			plainP50 = w.P50US
		}
	}
	for i := range r.Wake {
		w := &r.Wake[i]
		w.XPlain, w.XFloor = 0, 0
		if plainP50 > 0 && w.P50US > 0 {
			w.XPlain = sig3(w.P50US / plainP50)
		}
		if !strings.HasPrefix(w.System, "mount ") {
			continue
		}
		// The critical path: the publish's requests that its writer
		// waits for (RELEASE is answered after close returns) and the
		// answer to the blocked READ.
		if p, ok := r.findRow(w.System, "publish", 1); ok && p.RequestsPerOp > 0 {
			w.CriticalRequests = round2(p.RequestsPerOp - p.Requests["RELEASE"] + 1)
		}
		if f, ok := r.floorFor(w.System, 1); ok && f.P50US > 0 && w.CriticalRequests > 0 {
			w.XFloor = sig3(w.P50US / (f.P50US * w.CriticalRequests))
		}
	}
}

// Goal targets (issue 42): the mount at --sync normal against the
// go-fuse loopback (which syncs nothing), per transport; at --sync full
// against the loopback that syncs at FLUSH; the durable publish's tail
// against a plain directory's at the same pace.
const (
	targetNormalClassic = 1.0 // ≥, mount ÷ loopback on the classic transport
	targetNormalUring   = 1.3 // ≥, on io_uring: faster than any classic FUSE server here
	targetFullSync      = 1.0 // ≥, --sync full publish ÷ loopback with fdatasync at flush
	targetP99Plain      = 1.5 // ≤, publish p99 ÷ a plain directory's with fdatasync at close
)

// median is the median of xs (the mean of the middle two for an even
// count); false for none.
func median(xs []float64) (float64, bool) {
	if len(xs) == 0 {
		return 0, false
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2], true
	}
	return (s[n/2-1] + s[n/2]) / 2, true
}

// medianRatio is the median over rounds of a[i] ÷ b[i]: the two
// systems' figures of the same round, measured minutes apart at most,
// so a drift of the machine moves both. Rounds where either figure is
// missing (not positive) are left out; false if the lists differ in
// length or no round is left.
func medianRatio(a, b []float64) (float64, bool) {
	if len(a) != len(b) {
		return 0, false
	}
	var ratios []float64
	for i := range a {
		if a[i] > 0 && b[i] > 0 {
			ratios = append(ratios, a[i]/b[i])
		}
	}
	return median(ratios)
}

// interleavedRatio is the goal value of system a against b for op and
// clients: the median of their rounds' ops/s ratios in the interleaved
// step, and how many rounds it rests on.
func (r *suiteResults) interleavedRatio(a, b, op string, c int) (float64, bool, string) {
	ra, okA := findIn(r.Interleaved, a, op, c)
	rb, okB := findIn(r.Interleaved, b, op, c)
	if !okA || !okB {
		return 0, false, ""
	}
	v, ok := medianRatio(ra.RoundOpsPerSec, rb.RoundOpsPerSec)
	if !ok {
		return 0, false, ""
	}
	return v, true, fmt.Sprintf("median of %d rounds", len(ra.RoundOpsPerSec))
}

// transportList is the run's transports; a run from before they were
// recorded measured one, taken as classic.
func (r *suiteResults) transportList() []string {
	if len(r.Transports) == 0 {
		return []string{transportClassic}
	}
	return r.Transports
}

// computeGoals compares the run with the goals. Every ratio
// between two systems is the median of the rounds' ratios of a step
// whose systems take turns; a goal whose step did not run is "not
// measured".
func (r *suiteResults) computeGoals() []goal {
	var gs []goal
	add := func(name string, value float64, ok bool, unit, cmp string, target float64, note string) {
		g := goal{Name: name, Value: value, Unit: unit, Cmp: cmp, Target: target, Note: note, Missing: !ok}
		if ok {
			g.Value = round2(value)
			switch cmp {
			case ">=":
				g.Met = value >= target
			case "<=":
				g.Met = value <= target
			case "<":
				g.Met = value < target
			}
		}
		gs = append(gs, g)
	}
	clients := r.clientCounts()
	transports := r.transportList()
	stores := []string{"sqlite", "fs"}
	// Like with like: --sync normal syncs nothing at a publish, nor does
	// the loopback.
	for _, t := range transports {
		target := targetNormalClassic
		if t == transportUring {
			target = targetNormalUring
		}
		for _, store := range stores {
			m := sysMount(store, "normal", t)
			for _, op := range suiteOps {
				for _, c := range clients {
					v, ok, note := r.interleavedRatio(m, sysLoopback, op, c)
					add(fmt.Sprintf("%s %s, %d client(s) ÷ loopback", m, op, c), v, ok, "×", ">=", target, note)
				}
			}
		}
	}
	// --sync full: the message on disk when close(2) returns, on both
	// sides.
	for _, t := range transports {
		for _, store := range stores {
			m := sysMount(store, "full", t)
			for _, c := range clients {
				v, ok, note := r.interleavedRatio(m, sysLoopbackSync, "publish", c)
				add(fmt.Sprintf("%s publish, %d client(s) ÷ loopback with fdatasync at flush", m, c), v, ok, "×", ">=", targetFullSync, note)
			}
		}
	}
	// The durable publish's tail at half of peak against the disk's own
	// (a plain directory, fdatasync at close, same pace, rounds taking
	// turns); lease and ack against fixed bounds.
	for _, t := range transports {
		for _, store := range stores {
			m := sysMount(store, goalSync, t)
			l, ok := r.findLatency(m, "publish")
			plain, okP := r.findLatency(l.reference(), "publish")
			v, okR := medianRatio(l.RoundP99US, plain.RoundP99US)
			note := ""
			if ok && okP {
				note = fmt.Sprintf("median of %d rounds; all rounds: p99 %.2f ms against %.2f ms; %d clients at %.0f of %.0f round trips/s, CPU steal %.0f%%",
					len(l.RoundP99US), l.P99US/1000, plain.P99US/1000, l.Clients, l.RTPerS, l.PeakRTPerS, l.StealPct)
			}
			add(fmt.Sprintf("%s publish p99 at half of peak ÷ plain dir with fdatasync at close", m), v, ok && okP && okR, "×", "<=", targetP99Plain, note)
			for _, op := range []string{"lease", "ack"} {
				l, ok := r.findLatency(m, op)
				note := ""
				if ok {
					note = fmt.Sprintf("all rounds: %d samples, %d clients at %.0f of %.0f round trips/s, CPU steal %.0f%%", l.Samples, l.Clients, l.RTPerS, l.PeakRTPerS, l.StealPct)
				}
				add(fmt.Sprintf("%s %s p99 at half of peak", m, op), l.P99US/1000, ok, "ms", "<", 2, note)
				add(fmt.Sprintf("%s %s p99.9 at half of peak", m, op), l.P999US/1000, ok, "ms", "<", 10, note)
			}
		}
	}
	for _, c := range clients {
		v, ok, note := r.interleavedRatio(sysInproc("sqlite", "normal"), sysGoqite, "roundtrip", c)
		add(fmt.Sprintf("queuecore sqlite/normal in process round trip, %d client(s) ÷ goqite-style", c), v, ok, "×", ">=", 2, note)
	}
	for _, t := range transports {
		for _, store := range stores {
			v, ok, note := r.interleavedRatio(sysMount(store, "full", t), sysMount(store, "normal", t), "publish", 4)
			add(fmt.Sprintf("mount %s (%s) publish, 4 clients, full ÷ normal", store, t), v, ok, "×", ">=", 0.5, note)
		}
	}
	for _, t := range transports {
		for _, store := range stores {
			m := sysMount(store, goalSync, t)
			mb, okM := r.findBig(m, "read")
			lb, okL := r.findBig(sysLoopback, "read")
			v, ok := medianRatio(mb.RoundMiBPerSec, lb.RoundMiBPerSec)
			note := ""
			if okM && okL {
				note = fmt.Sprintf("median of %d rounds, %d clients; all rounds: %.0f vs %.0f MiB/s", len(mb.RoundMiBPerSec), mb.Clients, mb.MiBPerSec, lb.MiBPerSec)
			}
			add(fmt.Sprintf("%s 1 MiB read bandwidth ÷ loopback", m), v, ok && okM && okL, "×", ">=", 0.8, note)
		}
	}
	for _, t := range transports {
		for _, store := range stores {
			sys := sysMount(store, "normal", t)
			w, ok := r.findWake(sys)
			add(sys+" .next wake-up p50", w.P50US/1000, ok, "ms", "<", 1, "")
			add(sys+" .next wake-up p99", w.P99US/1000, ok, "ms", "<", 5, "")
		}
	}
	for _, t := range transports {
		for _, store := range stores {
			sys := sysMount(store, "normal", t)
			e, ok := r.findExpiry(sys)
			add(sys+" lease-expiry redelivery (max)", e.MaxMS, ok && e.Samples > 0, "ms", "<", 100, fmt.Sprintf("%d samples, p50 %.1f ms", e.Samples, e.P50MS))
		}
	}
	for _, t := range transports {
		for _, store := range stores {
			sys := sysMount(store, "normal", t)
			res, ok := r.findResource(sys)
			add(sys+" idle RSS after mount", res.RSSIdleMiB, ok && res.RSSIdleMiB > 0, "MiB", "<", 20, "")
			add(sys+" idle wakeups", res.WakeupsPerSec, ok && res.IdleSeconds > 0, "/s", "<", 1, fmt.Sprintf("over %.0f s", res.IdleSeconds))
		}
	}
	for _, t := range transports {
		s, ok := r.findScale(t)
		note, ready := "", countName(s.Ready)
		if !ok {
			ready = "1M"
		} else if s.Ready < 1_000_000 {
			note = fmt.Sprintf("measured with %d ready, not 1M (make bench BENCH_MILLION=1)", s.Ready)
		}
		add(fmt.Sprintf("daemon RSS with %s ready (%s)", ready, t), s.RSSMiB, ok && s.RSSMiB > 0, "MiB", "<", 64, note)
		add(fmt.Sprintf("mount round trip with %s ready ÷ empty queue (%s)", ready, t), s.Ratio, ok && s.Ratio > 0, "×", ">=", 0.8, note)
	}
	gs = append(gs, r.costGoals()...)
	return gs
}

// costSystems are the systems whose daemon's CPU and context switches
// per operation the goals report: the loopback and the mounts at --sync
// normal, which sync nothing either.
func (r *suiteResults) costSystems() []string {
	systems := []string{sysLoopback}
	for _, t := range r.transportList() {
		for _, store := range []string{"sqlite", "fs"} {
			systems = append(systems, sysMount(store, "normal", t))
		}
	}
	return systems
}

// costGoals are the reported rows (no target): the daemon's CPU time
// and context switches per publish, lease and ack, from the interleaved
// step's rounds together.
func (r *suiteResults) costGoals() []goal {
	var gs []goal
	for _, op := range []string{"publish", "lease", "ack"} {
		for _, c := range r.clientCounts() {
			for _, sys := range r.costSystems() {
				x, ok := findIn(r.Interleaved, sys, op, c)
				gs = append(gs,
					goal{Name: costGoalName("CPU", op, c, sys), Value: x.DaemonCPUUS, Unit: "µs/op", Cmp: "report", Missing: !ok},
					goal{Name: costGoalName("context switches", op, c, sys), Value: x.DaemonSwitchesPerOp, Unit: "/op", Cmp: "report", Missing: !ok})
			}
		}
	}
	return gs
}

func costGoalName(what, op string, c int, system string) string {
	return fmt.Sprintf("daemon %s per %s, %d client(s): %s", what, op, c, system)
}

func (r *suiteResults) clientCounts() []int {
	var cs []int
	// The interleaved rows too: with --only interleaved they are all
	// there is.
	for _, x := range slices.Concat(r.Rows, r.Interleaved) {
		if !slices.Contains(cs, x.Clients) {
			cs = append(cs, x.Clients)
		}
	}
	slices.Sort(cs)
	return cs
}

func (r *suiteResults) findBig(system, op string) (bigRow, bool) {
	for _, x := range r.Big {
		if x.System == system && x.Op == op {
			return x, true
		}
	}
	return bigRow{}, false
}

func (r *suiteResults) findLatency(system, op string) (latencyRow, bool) {
	for _, x := range r.Latency {
		if x.System == system && x.Op == op {
			return x, true
		}
	}
	return latencyRow{}, false
}

// comparePrevious sets each goal's previous value from prev, the run read
// from file. A goal the previous run did not have by its name is looked
// up without its transport tags: the same row of a run that measured one
// transport (the runs before both were measured, or an old build's).
func (r *suiteResults) comparePrevious(prev *suiteResults, file string) {
	r.Previous = &previousRun{File: file, Started: prev.Started, Mode: prev.Mode}
	byName := map[string]goal{}
	for _, g := range prev.Goals {
		if !g.Missing {
			byName[g.Name] = g
		}
	}
	for i := range r.Goals {
		g := &r.Goals[i]
		p, ok := byName[g.Name]
		if !ok {
			alias := withoutTransport(g.Name)
			if p, ok = byName[alias]; ok {
				g.PrevAs = alias
			}
		}
		if !ok {
			continue
		}
		g.HavePrev, g.PrevValue, g.PrevMet = true, p.Value, p.Met
		g.Regressed = p.Met && !g.Missing && !g.Met
	}
}

func (r *suiteResults) findWake(system string) (wakeRow, bool) {
	for _, w := range r.Wake {
		if w.System == system {
			return w, true
		}
	}
	return wakeRow{}, false
}

func (r *suiteResults) findExpiry(system string) (expiryRow, bool) {
	for _, e := range r.Expiry {
		if e.System == system {
			return e, true
		}
	}
	return expiryRow{}, false
}

func (r *suiteResults) findScale(transport string) (scaleResult, bool) {
	for _, x := range r.Scales {
		if x.Transport == transport {
			return x, true
		}
	}
	return scaleResult{}, false
}

func (r *suiteResults) findResource(system string) (resourceRow, bool) {
	for _, x := range r.Resources {
		if x.System == system {
			return x, true
		}
	}
	return resourceRow{}, false
}

// countName writes 1000000 as 1M and 100000 as 100k.
func countName(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// systemRank orders systems: the baselines first, then ours.
func systemRank(s string) int {
	switch {
	case s == sysPlain:
		return 0
	case s == sysPlainFsync:
		return 1
	case s == sysMQueue:
		return 2
	case s == sysGoqite:
		return 3
	case strings.HasPrefix(s, "queuecore "):
		return 4
	case s == sysLoopback || s == sysLoopbackSync:
		return 5
	}
	return 6
}

// systemOrder is the order of systems in tables and the chart: the
// baselines first, then ours.
func (r *suiteResults) systemOrder() []string {
	rank := systemRank
	var out []string
	for _, x := range r.Rows {
		if !slices.Contains(out, x.System) {
			out = append(out, x.System)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return rank(a) - rank(b) })
	return out
}
