package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"yirangmq/queuecore"
	"yirangmq/testenv"
)

// Helpers shared by the tests of the client commands: a real mount, and
// the commands run in-process.

func startMount(t *testing.T) *testenv.Daemon {
	t.Helper()
	return testenv.StartDaemon(t, testenv.DaemonOptions{Sync: "normal"})
}

// cliResult is what an in-process command did.
type cliResult struct {
	stdout, stderr string
	code           int
}

// cli runs a command in-process with stdin, as main would.
func cli(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	return cliCtx(context.Background(), t, stdin, args...)
}

func cliCtx(ctx context.Context, t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(ctx, &cliEnv{stdout: &out, stderr: &errb, stdin: strings.NewReader(stdin)}, args)
	return cliResult{stdout: out.String(), stderr: errb.String(), code: code}
}

// mustCLI runs a command that must exit 0 and returns its stdout.
func mustCLI(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	r := cli(t, stdin, args...)
	if r.code != 0 {
		t.Fatalf("yirangmq %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// mkqueue creates a queue with mkdir and gives it a policy.
func mkqueue(t *testing.T, d *testenv.Daemon, name, policy string) {
	t.Helper()
	if err := os.Mkdir(d.Path(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if policy != "" {
		if err := os.WriteFile(d.Path(name, ".policy"), []byte(policy), 0o644); err != nil {
			t.Fatalf("write policy: %v", err)
		}
	}
}

// names lists a state directory in readdir order.
func names(t *testing.T, d *testenv.Daemon, queue, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(d.Path(queue, dir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func queueStats(t *testing.T, d *testenv.Daemon, queue string) queuecore.QueueStats {
	t.Helper()
	b, err := os.ReadFile(d.Path(queue, ".stats"))
	if err != nil {
		t.Fatal(err)
	}
	var s queuecore.QueueStats
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPauseResume(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", `{"visibilityTimeoutSec": 7}`)
	mustCLI(t, "one", "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--name", "m1")

	if out := mustCLI(t, "", "pause", "--mount", d.Mountpoint, "--queue", "jobs"); out != "jobs paused\n" {
		t.Errorf("pause said %q", out)
	}
	if !queueStats(t, d, "jobs").Paused {
		t.Error("stats do not say paused")
	}
	b, _ := os.ReadFile(d.Path("jobs", ".policy"))
	var p queuecore.Policy
	if err := json.Unmarshal(b, &p); err != nil || !p.Paused || p.VisibilityTimeoutSec != 7 {
		t.Errorf("policy after pause: %s (err %v); want paused and the rest kept", b, err)
	}
	err := os.Rename(d.Path("jobs", "inbox", "m1"), d.Path("jobs", "processing", "m1"))
	if !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("lease while paused: %v, want EAGAIN", err)
	}
	// Publishing goes on.
	mustCLI(t, "two", "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--name", "m2")

	if out := mustCLI(t, "", "resume", "--mount", d.Mountpoint, "--queue", "jobs"); out != "jobs resumed\n" {
		t.Errorf("resume said %q", out)
	}
	if err := os.Rename(d.Path("jobs", "inbox", "m1"), d.Path("jobs", "processing", "m1")); err != nil {
		t.Fatalf("lease after resume: %v", err)
	}
	if queueStats(t, d, "jobs").Paused {
		t.Error("stats still say paused")
	}
}

func TestPauseUnknownQueue(t *testing.T) {
	d := startMount(t)
	r := cli(t, "", "pause", "--mount", d.Mountpoint, "--queue", "nope")
	if r.code != 1 || !strings.Contains(r.stderr, "queue nope does not exist") {
		t.Errorf("pause of a missing queue: exit %d, %q", r.code, r.stderr)
	}
	r = cli(t, "", "pause", "--mount", t.TempDir(), "--queue", "nope")
	if r.code != 1 || !strings.Contains(r.stderr, "no yirangmq mount at") {
		t.Errorf("pause without a mount: exit %d, %q", r.code, r.stderr)
	}
	r = cli(t, "", "pause", "--mount", d.Mountpoint)
	if r.code != 1 || !strings.Contains(r.stderr, "--queue is required") {
		t.Errorf("pause without --queue: exit %d, %q", r.code, r.stderr)
	}
}

func TestMountFromEnv(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	t.Setenv(mountEnv, d.Mountpoint)
	mustCLI(t, "", "pause", "--queue", "jobs")
	if !queueStats(t, d, "jobs").Paused {
		t.Error("pause with $YIRANGMQ_MOUNT did not pause")
	}
}

func TestDrain(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	for _, n := range []string{"a", "b", "c"} {
		mustCLI(t, n, "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--name", n)
	}

	r := cli(t, "", "drain", "--mount", d.Mountpoint, "--queue", "jobs", "--timeout", "300ms")
	if r.code != 1 || !strings.Contains(r.stderr, "not drained after 300ms: jobs: 3 ready") {
		t.Errorf("drain --timeout on a full queue: exit %d, %q", r.code, r.stderr)
	}

	done := make(chan cliResult, 1)
	go func() { done <- cli(t, "", "drain", "--mount", d.Mountpoint, "--queue", "jobs", "--timeout", "20s") }()
	for _, n := range []string{"a", "b", "c"} {
		time.Sleep(100 * time.Millisecond) // give a drain that returns too early the time to show
		select {
		case r := <-done:
			t.Fatalf("drain returned with messages left: %+v", r)
		default:
		}
		lease := d.Path("jobs", "processing", n)
		if err := os.Rename(d.Path("jobs", "inbox", n), lease); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(lease); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case r := <-done:
		if r.code != 0 || !strings.HasPrefix(r.stdout, "jobs drained in ") {
			t.Errorf("drain: exit %d, %q %q", r.code, r.stdout, r.stderr)
		}
		if !strings.Contains(r.stderr, "jobs: 3 ready, 0 in flight, 0 delayed") {
			t.Errorf("drain printed no progress: %q", r.stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("drain did not return once the queue was empty")
	}
}

// TestHelp: every client command answers --help with its usage and exit 0.
func TestHelp(t *testing.T) {
	for _, c := range []string{"publish", "consume", "status", "dlq", "pause", "resume", "drain"} {
		r := cli(t, "", c, "--help")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "Usage: yirangmq "+c) || !strings.Contains(r.stdout, "--mount") {
			t.Errorf("%s --help: exit %d, %q", c, r.code, r.stdout)
		}
	}
	if r := cli(t, "", "--help"); !strings.Contains(r.stdout, "consume") {
		t.Errorf("yirangmq --help does not list consume: %q", r.stdout)
	}
}

// path of a message in a queue, for the tests.
func msgPath(d *testenv.Daemon, queue, dir, name string) string {
	return filepath.Join(d.Mountpoint, queue, dir, name)
}
