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

// results is what the run writes as JSON.
type results struct {
	Started      string   `json:"started"`
	Seconds      float64  `json:"seconds"`
	Kernel       string   `json:"kernel"`
	CPUs         int      `json:"cpus"`
	GoVersion    string   `json:"go"`
	Workdir      string   `json:"workdir"`
	TopDir       bool     `json:"workdir_is_ext4_topdir"` // chattr +T: each store and plain directory in a block group of its own
	Filesystem   string   `json:"filesystem"`
	LoadBefore   string   `json:"loadavg_before"`
	LoadAfter    string   `json:"loadavg_after"`
	MessageBytes int      `json:"message_bytes"`
	Messages     int      `json:"messages_per_phase"`
	CacheTimeout string   `json:"cache_timeout"`
	CountSource  string   `json:"requests_counted_by"`
	Notes        []string `json:"notes"`

	Mount []opRow      `json:"mount"`
	Next  []nextRow    `json:"next"`
	Plain []plainRow   `json:"plain"`
	Floor []floorRow   `json:"floor"`
	Trace *traceResult `json:"trace,omitempty"`
}

// opRow is one operation through the mount, with what it is compared to.
type opRow struct {
	Op            string             `json:"op"`
	Backend       string             `json:"backend"`
	Sync          string             `json:"sync"`
	Clients       int                `json:"clients"`
	Ops           int                `json:"ops"`
	Seconds       float64            `json:"seconds"`
	OpsPerSec     float64            `json:"ops_per_sec"`
	Latency       summary            `json:"latency"`
	RequestsPerOp float64            `json:"fuse_requests_per_op"` // -1: not counted
	Requests      map[string]float64 `json:"fuse_requests_by_opcode_per_op,omitempty"`
	FsyncsPerOp   float64            `json:"store_fsyncs_per_op"` // -1: not counted
	CPU           cpuUse             `json:"cpu"`

	// PlainOpsPerSec is the same operation on a fresh plain directory,
	// same client count (durable by hand for --sync full); PlainSlowdown
	// is how many times slower the mount is.
	PlainOpsPerSec float64 `json:"plain_ops_per_sec"`
	PlainSlowdown  float64 `json:"plain_slowdown"`
	// FloorUS is the FUSE request floor (µs per request, fstat with
	// caches off, same client count, probed right before this store and
	// sync mode); FloorRatio is the operation's time (1/throughput) over
	// FloorUS × RequestsPerOp. The goal: ≤ 3.
	FloorUS    float64 `json:"floor_us_per_request"`
	FloorRatio float64 `json:"floor_ratio"`
	Within3x   bool    `json:"within_3x_of_floor"`
	// The same with medians: p50 over FloorP50US × the requests the
	// caller waits for (RELEASE is asynchronous: close(2) returns before
	// it is answered).
	FloorP50US     float64 `json:"floor_p50_us_per_request"`
	WaitedRequests float64 `json:"waited_requests_per_op"`
	FloorRatioP50  float64 `json:"floor_ratio_p50"`
}

type nextRow struct {
	Backend           string             `json:"backend"`
	Sync              string             `json:"sync"`
	Samples           int                `json:"samples"`
	Wake              summary            `json:"wake_us"`        // before the publish's open() → reader's read() returns
	AfterClose        summary            `json:"after_close_us"` // publish's close() returned → read() returns (negative: before)
	Unconfirmed       int                `json:"unconfirmed_blocked"`
	RequestsPerSample float64            `json:"fuse_requests_per_sample"` // reader open+read+release, publish, ack
	Requests          map[string]float64 `json:"fuse_requests_by_opcode_per_sample,omitempty"`
	CPU               cpuUse             `json:"cpu"`
	// CriticalRequests is the publish's waited requests plus the READ's
	// answer; FloorRatio is the p50 wake-up over that many floor requests
	// (p50, one client).
	CriticalRequests float64 `json:"critical_path_requests"`
	FloorP50US       float64 `json:"floor_p50_us_per_request"`
	FloorRatio       float64 `json:"floor_ratio_p50"`
}

type plainRow struct {
	Op        string  `json:"op"`
	Clients   int     `json:"clients"`
	Durable   bool    `json:"durable"` // fdatasync of the file, fsync of each changed directory
	Dir       string  `json:"dir"`     // fresh, or churn (same directories right after their files were deleted)
	Ops       int     `json:"ops"`
	Seconds   float64 `json:"seconds"`
	OpsPerSec float64 `json:"ops_per_sec"`
	Latency   summary `json:"latency"`
	CPU       cpuUse  `json:"cpu"`
}

type floorRow struct {
	Probe         string             `json:"probe"`
	When          string             `json:"when"`
	Clients       int                `json:"clients"`
	CacheTimeout  string             `json:"cache_timeout"`
	Ops           int                `json:"ops"`
	OpsPerSec     float64            `json:"ops_per_sec"`
	Latency       summary            `json:"latency"`
	RequestsPerOp float64            `json:"fuse_requests_per_op"`
	Requests      map[string]float64 `json:"fuse_requests_by_opcode_per_op,omitempty"`
	USPerRequest  float64            `json:"us_per_request"`
	CPU           cpuUse             `json:"cpu"`
}

// finish fills in the comparisons.
func (b *bench) finish() {
	b.res.LoadAfter = loadavg()
	for i := range b.res.Mount {
		r := &b.res.Mount[i]
		durable := r.Sync == "full"
		for _, p := range b.res.Plain {
			if p.Op == r.Op && p.Clients == r.Clients && p.Durable == durable && p.Dir == "fresh" {
				r.PlainOpsPerSec = p.OpsPerSec
				if r.OpsPerSec > 0 {
					r.PlainSlowdown = round1(p.OpsPerSec / r.OpsPerSec)
				}
			}
		}
		if byOp, ok := b.traceReq["cold/"+r.Op]; ok && r.RequestsPerOp < 0 {
			r.Requests, r.RequestsPerOp = byOp, 0
			for _, n := range byOp {
				r.RequestsPerOp += n
			}
		}
		if r.FloorUS > 0 && r.RequestsPerOp > 0 && r.OpsPerSec > 0 {
			r.FloorRatio = round2(1e6 / r.OpsPerSec / (r.FloorUS * r.RequestsPerOp))
			r.Within3x = r.FloorRatio <= 3
		}
		if r.RequestsPerOp > 0 {
			r.WaitedRequests = round2(r.RequestsPerOp - r.Requests["RELEASE"])
		}
		if r.FloorP50US > 0 && r.WaitedRequests > 0 {
			r.FloorRatioP50 = round2(r.Latency.P50US / (r.FloorP50US * r.WaitedRequests))
		}
	}
	for i := range b.res.Next {
		r := &b.res.Next[i]
		for _, m := range b.res.Mount {
			if m.Op == "publish" && m.Clients == 1 && m.Backend == r.Backend && m.Sync == r.Sync && m.WaitedRequests > 0 {
				r.CriticalRequests = m.WaitedRequests + 1
			}
		}
		if r.CriticalRequests > 0 && r.FloorP50US > 0 {
			r.FloorRatio = round2(r.Wake.P50US / (r.FloorP50US * r.CriticalRequests))
		}
	}
	b.res.Notes = append(b.res.Notes, []string{
		"ops/s: messages ÷ wall time of the phase, all clients together; p50/p99: per operation, all clients",
		"mount phases run publish (all messages), then lease (all), then ack (all) on a new store per client count, after an untimed warm-up; archive off",
		"plain directories: new directories per client count (fresh); churn = a second pass in the same directories right after their files were unlinked",
		"floor: fstat(2) of the mount root on a --cache-timeout 0s mount = one GETATTR; floor_us_per_request = wall ÷ requests, same client count, probed right before each store and sync mode",
		"floor_ratio = (1 / ops_per_sec) ÷ (floor_us_per_request × fuse_requests_per_op); the issue's goal is ≤ 3",
		"floor_ratio_p50 = p50 ÷ (floor p50 per request × waited requests); waited = all but RELEASE, which close(2) does not wait for",
		"each store (per store, sync mode and client count, and one for .next) and each plain directory is a new directory of a work directory marked chattr +T, so in a block group of its own",
	}...)
}

// report prints the tables in Markdown.
func (b *bench) report(w io.Writer) {
	fmt.Fprintf(w, "\n## Through the mount (%d × %d-byte messages per phase, cache timeout %s; %s; %s)\n\n",
		b.res.Messages, b.res.MessageBytes, b.res.CacheTimeout, b.res.Filesystem, b.res.Kernel)
	fmt.Fprintln(w, "| op | clients | backend | sync | ops/s | p50 µs | p99 µs | plain ops/s | × plain | req/op | floor µs | × (floor·req) | ≤3x | p50 × (floor p50·waited req) | fsync/op | daemon CPU µs/op | others' CPU |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range b.res.Mount {
		fmt.Fprintf(w, "| %s | %d | %s | %s | %.0f | %.0f | %.0f | %.0f | %.1f | %s | %.1f | %.2f | %s | %.2f | %s | %.0f | %.0f%% |\n",
			r.Op, r.Clients, r.Backend, r.Sync, r.OpsPerSec, r.Latency.P50US, r.Latency.P99US,
			r.PlainOpsPerSec, r.PlainSlowdown, num(r.RequestsPerOp), r.FloorUS, r.FloorRatio, yes(r.Within3x),
			r.FloorRatioP50, num(r.FsyncsPerOp), r.CPU.DaemonUSPerOp, 100*r.CPU.OthersShare)
	}
	if len(b.res.Next) > 0 {
		fmt.Fprintln(w, "\n.next wake-up (reader blocked in read(2); from before the publish's open() to read() returning):")
		fmt.Fprintln(w, "\n| backend | sync | samples | p50 µs | p99 µs | p50 after close() returned, µs | critical-path requests | floor p50 µs | × (floor·req), p50 | req/sample (all) | others' CPU |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
		for _, r := range b.res.Next {
			fmt.Fprintf(w, "| %s | %s | %d | %.0f | %.0f | %.0f | %s | %.1f | %.2f | %s | %.0f%% |\n", r.Backend, r.Sync, r.Samples, r.Wake.P50US, r.Wake.P99US,
				r.AfterClose.P50US, num(r.CriticalRequests), r.FloorP50US, r.FloorRatio, num(r.RequestsPerSample), 100*r.CPU.OthersShare)
		}
	}
	if len(b.res.Plain) > 0 {
		fmt.Fprintln(w, "\nPlain directory on the same filesystem (no FUSE):")
		fmt.Fprintln(w, "\n| op | clients | durable | dir | ops/s | p50 µs | p99 µs | client CPU µs/op | others' CPU |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
		for _, r := range b.res.Plain {
			fmt.Fprintf(w, "| %s | %d | %s | %s | %.0f | %.1f | %.1f | %.0f | %.0f%% |\n", r.Op, r.Clients, yes(r.Durable), r.Dir, r.OpsPerSec,
				r.Latency.P50US, r.Latency.P99US, r.CPU.ClientUSPerOp, 100*r.CPU.OthersShare)
		}
	}
	fmt.Fprintln(w, "\nFUSE request floor (--cache-timeout 0s):")
	fmt.Fprintln(w, "\n| probe | when | clients | ops/s | p50 µs | p99 µs | req/op | µs/request | daemon CPU µs/op | others' CPU |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range b.res.Floor {
		fmt.Fprintf(w, "| %s | %s | %d | %.0f | %.1f | %.1f | %s | %.1f | %.1f | %.0f%% |\n", r.Probe, r.When, r.Clients, r.OpsPerSec, r.Latency.P50US, r.Latency.P99US,
			num(r.RequestsPerOp), r.USPerRequest, r.CPU.DaemonUSPerOp, 100*r.CPU.OthersShare)
	}
	fmt.Fprintln(w, "\nFUSE requests per operation, by opcode (counted during the timed run):")
	fmt.Fprintln(w)
	for _, r := range b.res.Mount {
		fmt.Fprintf(w, "- %s c=%d %s/%s: %s\n", r.Op, r.Clients, r.Backend, r.Sync, opcodes(r.Requests))
	}
	for _, r := range b.res.Next {
		fmt.Fprintf(w, "- .next sample %s/%s: %s\n", r.Backend, r.Sync, opcodes(r.Requests))
	}
	if t := b.res.Trace; t != nil {
		fmt.Fprintln(w, "\nRequest sequences from the --debug mount (sqlite, normal):")
		for _, phase := range t.Order {
			for _, s := range t.Phases[phase] {
				seq := make([]string, len(s.Requests))
				for i, r := range s.Requests {
					seq[i] = genericName(r)
				}
				fmt.Fprintf(w, "- %s (%d op(s)): %s\n", phase, s.Ops, strings.Join(seq, "; "))
			}
		}
	}
	fmt.Fprintf(w, "\nRun: %.0f s, load average before %s, after %s. Requests counted by %s.\n", b.res.Seconds, b.res.LoadBefore, b.res.LoadAfter, b.res.CountSource)
}

func num(f float64) string {
	if f < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", f)
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func opcodes(m map[string]float64) string {
	if len(m) == 0 {
		return "n/a"
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func (b *bench) writeJSON() error {
	// A relative --out is the checkout's (results/ at its root), not
	// this module's directory, where `go run .` starts.
	if !filepath.IsAbs(b.cfg.out) {
		if root, err := moduleRoot(); err == nil {
			b.cfg.out = filepath.Join(root, b.cfg.out)
		}
	}
	if err := os.MkdirAll(filepath.Dir(b.cfg.out), 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(b.res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(b.cfg.out, append(data, '\n'), 0o644); err != nil {
		return err
	}
	b.logf("wrote %s", b.cfg.out)
	return nil
}
