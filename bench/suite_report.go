package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// report prints the suite's tables in Markdown.
func (r *suiteResults) report(w io.Writer) {
	fmt.Fprintf(w, "\n# yirangmq benchmark suite (%s mode, %d-byte messages; %s; kernel %s, %d CPUs; %s)\n",
		r.Mode, r.MessageBytes, r.Filesystem, r.Kernel, r.CPUs, r.Started)
	if r.Rounds > 0 { // a run from before issue 42 recorded neither
		fmt.Fprintf(w, "\nThe daemon's transports: %s; %d rounds in the steps whose systems take turns.\n", strings.Join(r.transportList(), ", "), r.Rounds)
	}

	fmt.Fprintln(w, "\n## Throughput, messages per second")
	fmt.Fprintln(w, "\n| system | clients | publish | lease | ack | round trip | round trip p50 µs | CPU s per 10k round trips |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, c := range r.clientCounts() {
		for _, sys := range r.systemOrder() {
			cells := make([]string, len(suiteOps))
			any := false
			for i, op := range suiteOps {
				cells[i] = "—"
				if x, ok := r.findRow(sys, op, c); ok {
					cells[i] = fmt.Sprintf("%.0f", x.OpsPerSec)
					any = true
				}
			}
			if !any {
				continue
			}
			rt, _ := r.findRow(sys, "roundtrip", c)
			fmt.Fprintf(w, "| %s | %d | %s | %.0f | %s |\n", sys, c, strings.Join(cells, " | "), rt.P50US, cpuCell(rt.CPUSecPer10k))
		}
	}

	fmt.Fprintln(w, "\n## Every operation, with its ratios")
	fmt.Fprintln(w, "\n× plain: times the plain directory's time for the same operation (plain ops/s ÷ ops/s; below 1 is faster); × plain+fsync: the same against the Maildir-careful directory; × floor: the operation's time ÷ (FUSE request floor × requests per operation through a mount).")
	fmt.Fprintln(w, "\n| op | clients | system | ops/s | p50 µs | p99 µs | CPU s/10k | × plain | × plain+fsync | FUSE req/op | fsync/op | × floor | others' CPU |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, op := range suiteOps {
		for _, c := range r.clientCounts() {
			for _, sys := range r.systemOrder() {
				x, ok := r.findRow(sys, op, c)
				if !ok {
					continue
				}
				fmt.Fprintf(w, "| %s | %d | %s | %.0f | %.1f | %.1f | %s | %s | %s | %s | %s | %s | %.0f%% |\n",
					op, c, sys, x.OpsPerSec, x.P50US, x.P99US, cpuCell(x.CPUSecPer10k), ratioCell(x.XPlain), ratioCell(x.XPlainFsync),
					num(x.RequestsPerOp), num(x.FsyncsPerOp), ratioCell(x.XFloor), 100*x.OthersShare)
			}
		}
	}

	if len(r.Interleaved) > 0 {
		r.reportInterleaved(w)
	}
	if len(r.Big) > 0 {
		fmt.Fprintln(w, "\n## 1 MiB messages (MiB/s, taking turns; bytes counted at the client)")
		fmt.Fprintln(w, "\n| system | clients | op | messages | MiB/s | rounds' MiB/s | p50 ms | p99 ms | ÷ loopback (median of the rounds' ratios) |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
		for _, x := range r.Big {
			rel := "—"
			if l, ok := r.findBig(sysLoopback, x.Op); ok && x.System != sysLoopback {
				if v, ok := medianRatio(x.RoundMiBPerSec, l.RoundMiBPerSec); ok {
					rel = fmt.Sprintf("%.2f", v)
				}
			}
			var rounds []string
			for _, v := range x.RoundMiBPerSec {
				rounds = append(rounds, fmt.Sprintf("%.0f", v))
			}
			fmt.Fprintf(w, "| %s | %d | %s | %d | %.1f | %s | %.2f | %.2f | %s |\n", x.System, x.Clients, x.Op, x.Messages, x.MiBPerSec, strings.Join(rounds, ", "), x.P50MS, x.P99MS, rel)
		}
	}
	if len(r.Latency) > 0 {
		fmt.Fprintln(w, "\n## Latency at half of peak throughput (round trips paced on a timetable; each operation timed on its own)")
		fmt.Fprintln(w, "\n| system | clients | op | peak round trips/s | paced at | achieved | samples | late starts | p50 µs | p99 µs | p99.9 µs | max µs | rounds' p99 µs | CPU steal |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, x := range r.Latency {
			var rounds []string
			for _, v := range x.RoundP99US {
				rounds = append(rounds, fmt.Sprintf("%.0f", v))
			}
			fmt.Fprintf(w, "| %s | %d | %s | %.0f | %.0f | %.0f | %d | %d | %.0f | %.0f | %.0f | %.0f | %s | %.0f%% |\n", x.System, x.Clients, x.Op,
				x.PeakRTPerS, x.PacedRTPerS, x.RTPerS, x.Samples, x.Late, x.P50US, x.P99US, x.P999US, x.MaxUS, strings.Join(rounds, ", "), x.StealPct)
		}
	}
	if len(r.Wake) > 0 {
		fmt.Fprintln(w, "\n## Wake-up of a blocked consumer (from before the publish to the consumer's return)")
		fmt.Fprintln(w, "\n| system | how | samples | p50 µs | p99 µs | × plain (inotify) p50 | critical-path FUSE requests | × floor p50 |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
		for _, x := range r.Wake {
			fmt.Fprintf(w, "| %s | %s | %d | %.0f | %.0f | %s | %s | %s |\n", x.System, x.How, x.Samples, x.P50US, x.P99US,
				ratioCell(x.XPlain), dash(x.CriticalRequests), ratioCell(x.XFloor))
		}
	}
	if len(r.Expiry) > 0 {
		fmt.Fprintln(w, "\n## Lease-expiry redelivery (visibility timeout 1 s, no backoff; from the lease deadline to `.next` returning the message)")
		fmt.Fprintln(w, "\n| system | samples | min ms | p50 ms | max ms |")
		fmt.Fprintln(w, "|---|---|---|---|---|")
		for _, x := range r.Expiry {
			fmt.Fprintf(w, "| %s | %d | %.1f | %.1f | %.1f |\n", x.System, x.Samples, x.MinMS, x.P50MS, x.MaxMS)
		}
	}
	if len(r.Resources) > 0 {
		fmt.Fprintln(w, "\n## Daemons: memory and idle cost")
		fmt.Fprintln(w, "\n| daemon | RSS after mount MiB (anon + file) | RSS after the idle window MiB (anon + file) | idle window s | idle CPU ms/s | idle wakeups/s | CPU s per 10k round trips, by clients |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
		for _, x := range r.Resources {
			var cpu []string
			for _, c := range r.clientCounts() {
				if rt, ok := r.findRow(x.System, "roundtrip", c); ok {
					cpu = append(cpu, fmt.Sprintf("%d: %s", c, cpuCell(rt.CPUSecPer10k)))
				}
			}
			fmt.Fprintf(w, "| %s | %.1f (%.1f + %.1f) | %.1f (%.1f + %.1f) | %.0f | %.2f | %.2f | %s |\n", x.System, x.RSSIdleMiB, x.RSSAnonMiB, x.RSSFileMiB,
				x.RSSEndMiB, x.RSSEndAnonMiB, x.RSSEndFileMiB, x.IdleSeconds,
				x.IdleCPUMSPerS, x.WakeupsPerSec, strings.Join(cpu, ", "))
		}
	}
	if c := r.Churn; c != nil {
		fmt.Fprintf(w, "\n%s after %d messages published and consumed (round trips, %d clients): RSS %.1f MiB (%.1f before); %.0f round trips/s, %s CPU s per 10k.\n",
			c.System, c.Messages, c.Clients, c.RSSAfterMiB, c.RSSBeforeMiB, c.OpsPerSec, cpuCell(c.CPUSecPer10k))
	}
	for _, s := range r.Scales {
		fmt.Fprintf(w, "\n%s with %d ready messages (%s, %.1f s; mount ready in %.2f s): RSS %.1f MiB after mount, %.1f MiB after the round trips; round trips through the mount, 1 client, %d per queue alternated: %.0f/s with the queue full, %.0f/s on an empty queue of the same daemon: %.2f×.\n",
			s.System, s.Ready, s.How, s.FillSeconds, s.MountSeconds, s.RSSMiB, s.RSSAfterMiB, s.RoundTrips, s.FullRTPerS, s.EmptyRTPerS, s.Ratio)
	}

	fmt.Fprintln(w, "\n## FUSE request floor (fstat on a --cache-timeout 0s mount, 1 GETATTR)")
	fmt.Fprintln(w, "\n| probed before | clients | µs/request (wall ÷ requests) | p50 µs |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, f := range r.Floor {
		fmt.Fprintf(w, "| %s | %d | %.1f | %.1f |\n", f.Before, f.Clients, f.USPerRequest, f.P50US)
	}

	fmt.Fprintln(w, "\n## Goals")
	r.reportGoals(w)
	fmt.Fprintf(w, "\nRun: %.0f s, load average before %s, after %s. FUSE requests counted by %s.\n", r.Seconds, r.LoadBefore, r.LoadAfter, r.CountSource)
}

// reportInterleaved prints the interleaved step: each system's ops/s
// (the median of its rounds', and the rounds'), and its ratio to what
// its goals compare it with (the median of the rounds' ratios).
func (r *suiteResults) reportInterleaved(w io.Writer) {
	var systems []string
	for _, x := range r.Interleaved {
		if !slices.Contains(systems, x.System) {
			systems = append(systems, x.System)
		}
	}
	slices.SortStableFunc(systems, func(a, b string) int { return systemRank(a) - systemRank(b) })
	fmt.Fprintf(w, "\n## The goals' systems again, taking turns (ops/s, median of %d rounds; the goals' ratios, median of the rounds' ratios)\n", r.Rounds)
	fmt.Fprintln(w, "\n| op | clients | system | ops/s | rounds' ops/s | ÷ | compared with | daemon CPU µs/op | daemon context switches/op | FUSE req/op |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, op := range suiteOps {
		for _, c := range r.clientCounts() {
			for _, sys := range systems {
				x, ok := findIn(r.Interleaved, sys, op, c)
				if !ok {
					continue
				}
				ratio, ref := "—", interleavedRef(sys, op)
				if ref != "" {
					if v, ok, _ := r.interleavedRatio(sys, ref, op, c); ok {
						ratio = fmt.Sprintf("%.2f", v)
					}
				} else {
					ref = "—"
				}
				var rounds []string
				for _, v := range x.RoundOpsPerSec {
					rounds = append(rounds, fmt.Sprintf("%.0f", v))
				}
				fmt.Fprintf(w, "| %s | %d | %s | %.0f | %s | %s | %s | %s | %s | %s |\n", op, c, sys, x.OpsPerSec, strings.Join(rounds, ", "), ratio, ref,
					dash(x.DaemonCPUUS), dash(x.DaemonSwitchesPerOp), num(x.RequestsPerOp))
			}
		}
	}
}

// interleavedRef is what a system of the interleaved step is compared
// with for op ("" for nothing).
func interleavedRef(system, op string) string {
	switch {
	case system == sysInproc("sqlite", "normal"):
		return sysGoqite
	case strings.HasPrefix(system, "mount ") && strings.Contains(system, "/normal"):
		return sysLoopback
	case strings.HasPrefix(system, "mount ") && op == "publish":
		return sysLoopbackSync
	}
	return ""
}

// reportCost prints the goals' reported rows (cmp "report"): the
// daemon's CPU and context switches per operation, the systems side by
// side, each cell with the previous run's value when there was one.
func (r *suiteResults) reportCost(w io.Writer) {
	var report []goal
	for _, g := range r.Goals {
		if g.Cmp == "report" {
			report = append(report, g)
		}
	}
	if len(report) == 0 {
		return
	}
	byName := map[string]goal{}
	for _, g := range report {
		byName[g.Name] = g
	}
	systems := r.costSystems()
	fmt.Fprint(w, "\nReported, no target: the daemon's time on a CPU (all threads, /proc/PID/task/*/schedstat) and context switches (voluntary and not, all threads) per operation, from the interleaved step's rounds together")
	if r.Previous != nil {
		fmt.Fprint(w, " (in brackets: the previous run's)")
	}
	fmt.Fprintf(w, ".\n\n| per operation | clients | %s |\n|---|---|%s\n", strings.Join(systems, " | "), strings.Repeat("---|", len(systems)))
	for _, what := range []string{"CPU", "context switches"} {
		for _, op := range []string{"publish", "lease", "ack"} {
			for _, c := range r.clientCounts() {
				cells := []string{fmt.Sprintf("daemon %s per %s", what, op), fmt.Sprint(c)}
				for _, sys := range systems {
					g, ok := byName[costGoalName(what, op, c, sys)]
					cell := "—"
					if ok && !g.Missing {
						cell = fmt.Sprintf("%.2f %s", g.Value, g.Unit)
					}
					if ok && g.HavePrev {
						cell += fmt.Sprintf(" (%.2f)", g.PrevValue)
					}
					cells = append(cells, cell)
				}
				fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
			}
		}
	}
}

// reportGoals prints the goals, with the previous run's value of each
// when the run was compared with one; a goal met then and not now says
// so.
func (r *suiteResults) reportGoals(w io.Writer) {
	if p := r.Previous; p != nil {
		fmt.Fprintf(w, "\nPrevious: %s (%s mode, started %s).\n", p.File, p.Mode, p.Started)
		fmt.Fprintln(w, "\n| goal | measured | target | met | previous |")
		fmt.Fprintln(w, "|---|---|---|---|---|")
	} else {
		fmt.Fprintln(w, "\n| goal | measured | target | met |")
		fmt.Fprintln(w, "|---|---|---|---|")
	}
	regressed := 0
	for _, g := range r.Goals {
		if g.Cmp == "report" {
			continue
		}
		cmp := map[string]string{">=": "≥", "<=": "≤", "<": "<"}[g.Cmp]
		val, met := fmt.Sprintf("%.2f %s", g.Value, g.Unit), "not met"
		switch {
		case g.Missing:
			val, met = "not measured", "—"
		case g.Met:
			met = "met"
		}
		name := g.Name
		if g.Note != "" {
			name += " (" + g.Note + ")"
		}
		line := fmt.Sprintf("| %s | %s | %s %g %s | %s |", name, val, cmp, g.Target, g.Unit, met)
		if r.Previous != nil {
			prev := "—"
			if g.HavePrev {
				prev = fmt.Sprintf("%.2f %s", g.PrevValue, g.Unit)
				if g.PrevMet {
					prev += ", met"
				} else {
					prev += ", not met"
				}
				if g.PrevAs != "" {
					prev += " (as " + g.PrevAs + ")"
				}
				if g.Regressed {
					prev += " — **NO LONGER MET**"
					regressed++
				}
			}
			line += " " + prev + " |"
		}
		fmt.Fprintln(w, line)
	}
	if regressed > 0 {
		fmt.Fprintf(w, "\n%d goal(s) met in the previous run are not met in this one.\n", regressed)
	}
	r.reportCost(w)
}

// readResults reads a suite's JSON.
func readResults(path string) (*suiteResults, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r suiteResults
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

func cpuCell(f float64) string {
	if f <= 0 {
		return "—"
	}
	if f < 0.1 {
		return fmt.Sprintf("%.3f", f)
	}
	return fmt.Sprintf("%.2f", f)
}

func ratioCell(f float64) string {
	switch {
	case f <= 0:
		return "—"
	case f < 0.01:
		return fmt.Sprintf("%.4f", f)
	case f < 0.1:
		return fmt.Sprintf("%.3f", f)
	}
	return fmt.Sprintf("%.2f", f)
}

func dash(f float64) string {
	if f <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", f)
}

// reportMain prints the tables of a suite's JSON again and redraws its
// chart: mountbench report RESULTS.json [CHART.png].
func reportMain(args []string) int {
	if len(args) < 1 || len(args) > 2 {
		fmt.Fprintln(os.Stderr, "usage: (cd bench && go run . report RESULTS.json [CHART.png])")
		return 2
	}
	data, err := os.ReadFile(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var r suiteResults
	if err := json.Unmarshal(data, &r); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", args[0], err)
		return 1
	}
	r.report(os.Stdout)
	if len(args) == 2 {
		png, err := r.chartPNG()
		if err == nil {
			err = os.WriteFile(args[1], png, 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "chart:", err)
			return 1
		}
	}
	return 0
}

// marshal is the run's JSON, indented.
func (r *suiteResults) marshal() ([]byte, error) {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// writeJSON writes the run's JSON to path.
func (r *suiteResults) writeJSON(path string) error {
	data, err := r.marshal()
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// writeFiles writes the JSON and the chart: bench-STAMP.{json,png} and
// bench-latest.{json,png} in dir. It returns the paths written.
func (r *suiteResults) writeFiles(dir, stamp string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	data, err := r.marshal()
	if err != nil {
		return nil, err
	}
	png, err := r.chartPNG()
	if err != nil {
		return nil, fmt.Errorf("chart: %w", err)
	}
	var written []string
	for _, name := range []string{"bench-" + stamp, "bench-latest"} {
		for _, f := range []struct {
			ext  string
			data []byte
		}{{".json", data}, {".png", png}} {
			p := filepath.Join(dir, name+f.ext)
			if err := os.WriteFile(p, f.data, 0o644); err != nil {
				return written, err
			}
			written = append(written, p)
		}
	}
	return written, nil
}
