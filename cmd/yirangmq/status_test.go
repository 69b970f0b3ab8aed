package main

import (
	"context"
	"encoding/json"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"yirangmq/queuecore"
	"yirangmq/testenv"
)

func TestStatusTable(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	mkqueue(t, d, "mail", "")
	publishN(t, d, "jobs", "1", "2", "3")
	publishN(t, d, "mail", "x")
	mustCLI(t, "", "pause", "--mount", d.Mountpoint, "--queue", "mail")

	out := mustCLI(t, "", "status", "--mount", d.Mountpoint)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("status printed %d lines, want a header, two queues and the disk:\n%s", len(lines), out)
	}
	if disk := lines[3]; !strings.HasPrefix(disk, "disk: ") || !strings.Contains(disk, " free of ") || !strings.Contains(disk, ", floor ") || strings.Contains(disk, "LOW") {
		t.Errorf("disk line %q", disk)
	}
	lines = lines[:3]
	wantCols := []string{"QUEUE", "READY", "INFLIGHT", "DELAYED", "DLQ", "ARCHIVED", "OLDEST", "PUB/s", "LEASE/s", "ACK/s", "PAUSED", "REFUSED"}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != strings.Join(wantCols, " ") {
		t.Errorf("header %q", lines[0])
	}
	rows := map[string][]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		rows[f[0]] = f
	}
	if f := rows["jobs"]; len(f) != len(wantCols) || f[1] != "3" || f[2] != "0" || f[10] != "-" {
		t.Errorf("jobs row %q", f)
	}
	if f := rows["mail"]; len(f) != len(wantCols) || f[1] != "1" || f[10] != "yes" {
		t.Errorf("mail row %q", f)
	}

	out = mustCLI(t, "", "status", "--mount", d.Mountpoint, "--queue", "mail")
	if strings.Contains(out, "jobs") || !strings.Contains(out, "mail") {
		t.Errorf("status --queue mail:\n%s", out)
	}
	r := cli(t, "", "status", "--mount", d.Mountpoint, "--queue", "nope")
	if r.code != 1 || !strings.Contains(r.stderr, "queue nope does not exist") {
		t.Errorf("status of a missing queue: exit %d, %q", r.code, r.stderr)
	}
}

func TestStatusJSON(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	publishN(t, d, "jobs", "1", "2")

	var ds queuecore.DaemonStats
	if err := json.Unmarshal([]byte(mustCLI(t, "", "status", "--mount", d.Mountpoint, "--json")), &ds); err != nil {
		t.Fatal(err)
	}
	if len(ds.Queues) != 1 || ds.Queues[0].Queue != "jobs" || ds.Queues[0].Ready != 2 || ds.Queues[0].PublishedTotal != 2 {
		t.Errorf("status --json: %+v", ds)
	}
	var qs queuecore.QueueStats
	if err := json.Unmarshal([]byte(mustCLI(t, "", "status", "--mount", d.Mountpoint, "--json", "--queue", "jobs")), &qs); err != nil {
		t.Fatal(err)
	}
	if qs.Queue != "jobs" || qs.Ready != 2 {
		t.Errorf("status --json --queue jobs: %+v", qs)
	}
}

func TestStatusWatch(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	// It redraws until interrupted: stop it after its third draw (a
	// loaded machine may take long for each; the deadline is only a bound).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := &drawCounter{mark: clearScreen, after: 3, stop: cancel}
	code := run(ctx, &cliEnv{stdout: out, stderr: io.Discard, stdin: strings.NewReader("")}, []string{"status", "--mount", d.Mountpoint, "--watch", "--interval", "100ms"})
	r := cliResult{stdout: out.String(), code: code}
	if r.code != 0 {
		t.Fatalf("status --watch: exit %d", r.code)
	}
	if n := strings.Count(r.stdout, clearScreen); n < 2 {
		t.Errorf("status --watch drew %d times before it was stopped, want 2 or more:\n%q", n, r.stdout)
	}
	if n := strings.Count(r.stdout, "QUEUE"); n != strings.Count(r.stdout, clearScreen) {
		t.Errorf("not one table per redraw:\n%q", r.stdout)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out = &drawCounter{mark: "\n", after: 2, stop: cancel}
	code = run(ctx, &cliEnv{stdout: out, stderr: io.Discard, stdin: strings.NewReader("")}, []string{"status", "--mount", d.Mountpoint, "--watch", "--json", "--interval", "100ms"})
	r = cliResult{stdout: out.String(), code: code}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) < 2 {
		t.Fatalf("status --watch --json: exit %d, %q", r.code, r.stdout)
	}
	for _, l := range lines {
		var ds queuecore.DaemonStats
		if err := json.Unmarshal([]byte(l), &ds); err != nil {
			t.Errorf("line %q: %v", l, err)
		}
	}
}

func TestStatusPrometheus(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	publishN(t, d, "jobs", "1", "2")
	out := mustCLI(t, "", "status", "--mount", d.Mountpoint, "--prometheus")
	for _, want := range []string{
		"# TYPE yirangmq_ready_messages gauge",
		`yirangmq_ready_messages{queue="jobs"} 2`,
		"# TYPE yirangmq_published_total counter",
		`yirangmq_published_total{queue="jobs"} 2`,
		`yirangmq_dlq_messages{queue="jobs"} 0`,
		`yirangmq_expired_total{queue="jobs"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q:\n%s", want, out)
		}
	}
	// Every sample line is NAME{labels} VALUE, as scrapers expect.
	sample := regexp.MustCompile(`^yirangmq_[a-z_]+(\{queue="[^"]+"\})? [0-9.e+-]+$`)
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(l, "#") && !sample.MatchString(l) {
			t.Errorf("not an exposition line: %q", l)
		}
	}
}

// A message refused at a close nobody checked (bash's builtin echo) shows
// in status, with its name, errno and reason.
func TestStatusShowsRefusals(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", `{"format": "json", "schema": {"type": "object", "properties": {"order": {"type": "number"}}}}`)
	testenv.MustSh(t, d.Path("jobs"), `echo '{"order": "x"}' > inbox/bad-1`) // exits 0: the shell ignores close(2)
	out := mustCLI(t, "", "status", "--mount", d.Mountpoint)
	lines := strings.Split(out, "\n")
	row := strings.Fields(lines[1])
	if len(row) != 12 || row[0] != "jobs" || row[11] != "1" {
		t.Errorf("jobs row %q, want REFUSED 1", lines[1])
	}
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "last refused in jobs") })
	if i < 0 || i+1 >= len(lines) {
		t.Fatalf("status does not list the refusal:\n%s", out)
	}
	if l := lines[i+1]; !strings.Contains(l, `"bad-1"`) || !strings.Contains(l, "EINVAL") || !strings.Contains(l, "schema") {
		t.Errorf("refusal line %q, want the name, EINVAL and the schema's reason", l)
	}
}

// drawCounter collects what a --watch command writes, and calls stop once
// mark has been written after times.
type drawCounter struct {
	mu    sync.Mutex
	b     strings.Builder
	mark  string
	after int
	stop  func()
}

func (w *drawCounter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if strings.Count(w.b.String(), w.mark) >= w.after {
		w.stop()
	}
	return len(p), nil
}

func (w *drawCounter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
