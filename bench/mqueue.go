package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// POSIX message queues are the in-kernel, non-durable floor: what moving
// a 256-byte message between threads costs with nothing on disk. The
// driver is testdata/mqbench.c, built here with gcc.

// mqLine is one line mqbench prints.
type mqLine struct {
	Room    int     `json:"room"`
	Op      string  `json:"op"`
	Clients int     `json:"clients"`
	Ops     int     `json:"ops"`
	Seconds float64 `json:"seconds"`
	P50US   float64 `json:"p50_us"`
	P99US   float64 `json:"p99_us"`
	CPUSec  float64 `json:"cpu_s"`
}

// buildMQBench compiles testdata/mqbench.c into dir.
func buildMQBench(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "mqbench")
	src := filepath.Join(root, "bench", "testdata", "mqbench.c")
	cmd := exec.CommandContext(ctx, "gcc", "-O2", "-Wall", "-o", bin, src, "-lrt", "-lpthread")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("gcc: %v\n%s", err, out)
	}
	return bin, nil
}

// runMQBench runs mqbench with args and returns its lines.
func runMQBench(ctx context.Context, bin string, args ...string) ([]mqLine, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("mqbench %v: %v: %s", args, err, stderr.String())
	}
	return parseMQLines(out)
}

func parseMQLines(out []byte) ([]mqLine, error) {
	var lines []mqLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var l mqLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("mqbench printed %q: %w", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines, sc.Err()
}

// runMQueue measures mq_send (publish), mq_receive (lease) and the round
// trip per client count, and the wake-up of a blocked mq_receive.
func (s *suite) runMQueue(ctx context.Context) error {
	bin, err := buildMQBench(ctx, s.root, s.b.work)
	if err != nil {
		return err
	}
	for _, c := range s.cfg.clients {
		lines, err := runMQBench(ctx, bin, "ops", strconv.Itoa(s.cfg.mqMessages), strconv.Itoa(c))
		if err != nil {
			return err
		}
		for _, l := range lines {
			if l.Op == "" {
				if l.Room < s.cfg.mqMessages {
					s.note(fmt.Sprintf("mqueue: a queue holds %d messages here (fs.mqueue.msg_max, no CAP_SYS_RESOURCE): publishes alternate with untimed receives in runs of %d (leases with untimed sends), and ops/s is scaled by the share of time in the timed call", l.Room, l.Room))
				}
				continue
			}
			r := row{System: sysMQueue, Op: l.Op, Clients: l.Clients, Ops: l.Ops, Seconds: round2(l.Seconds),
				OpsPerSec: round1(float64(l.Ops) / max(l.Seconds, 1e-9)), P50US: l.P50US, P99US: l.P99US,
				CPUSecPer10k: round4(l.CPUSec / float64(max(l.Ops, 1)) * 1e4), RequestsPerOp: -1, FsyncsPerOp: -1}
			s.addRow(r)
		}
	}
	lines, err := runMQBench(ctx, bin, "wake", strconv.Itoa(s.cfg.nextSamples))
	if err != nil {
		return err
	}
	for _, l := range lines {
		if l.Op == "wake" {
			s.res.Wake = append(s.res.Wake, wakeRow{System: sysMQueue, How: "mq_receive blocked, mq_send from another thread",
				Samples: l.Ops, P50US: l.P50US, P99US: l.P99US})
		}
	}
	return nil
}
