package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

const archivePolicy = `{"archive": {"enabled": true, "retentionSec": 3600, "maxMessages": 100}}`

func publishN(t *testing.T, d *testenv.Daemon, queue string, bodies ...string) []string {
	t.Helper()
	var out []string
	for _, b := range bodies {
		out = append(out, strings.TrimSpace(mustCLI(t, b, "publish", "--mount", d.Mountpoint, "--queue", queue)))
	}
	return out
}

func xattr(t *testing.T, path, key string) string {
	t.Helper()
	v, err := getXattr(path, key)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestConsumeAck(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", archivePolicy)
	published := publishN(t, d, "jobs", "one", "two", "three")
	seen := filepath.Join(t.TempDir(), "seen")
	handler := `printf '%s=' "$YIRANGMQ_MESSAGE" >> "$SEEN"; cat >> "$SEEN"; echo >> "$SEEN"; echo handled`
	t.Setenv("SEEN", seen)
	r := cli(t, "", "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--drain", "--", "sh", "-c", handler)
	if r.code != 0 {
		t.Fatalf("consume: exit %d, %q", r.code, r.stderr)
	}
	if r.stdout != "handled\nhandled\nhandled\n" {
		t.Errorf("handler stdout came out as %q", r.stdout)
	}
	b, _ := os.ReadFile(seen)
	want := ""
	for i, n := range published {
		want += msgPath(d, "jobs", "processing", n) + "=" + []string{"one", "two", "three"}[i] + "\n"
	}
	if string(b) != want {
		t.Errorf("handlers saw\n%s\nwant\n%s", b, want)
	}
	if got := names(t, d, "jobs", "archive"); len(got) != 3 {
		t.Errorf("archive holds %q, want the three acked", got)
	}
	for _, dir := range []string{"inbox", "processing", "delayed", "dlq"} {
		if got := names(t, d, "jobs", dir); len(got) != 0 {
			t.Errorf("%s holds %q", dir, got)
		}
	}
	if s := queueStats(t, d, "jobs"); s.AckedTotal != 3 || s.LeasedTotal != 3 {
		t.Errorf("acked %d, leased %d; want 3 and 3", s.AckedTotal, s.LeasedTotal)
	}
}

func TestConsumeFailToDLQ(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", `{"retry": {"limit": 0}}`)
	name := publishN(t, d, "jobs", "payload")[0]
	r := cli(t, "", "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--max-messages", "1", "--",
		"sh", "-c", "cat >/dev/null; echo first line >&2; echo disk on fire >&2; exit 3")
	if r.code != 0 {
		t.Fatalf("consume: exit %d, %q", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "disk on fire") {
		t.Errorf("the handler's stderr was not passed on: %q", r.stderr)
	}
	dead := msgPath(d, "jobs", "dlq", name)
	if got := names(t, d, "jobs", "dlq"); len(got) != 1 || got[0] != name {
		t.Fatalf("dlq holds %q, want [%s]", got, name)
	}
	if v := xattr(t, dead, "reason"); v != "HANDLER_FAILED" {
		t.Errorf("reason %q", v)
	}
	if v := xattr(t, dead, "reason_message"); v != "exit status 3: disk on fire" {
		t.Errorf("reason_message %q", v)
	}
}

func TestConsumeFailRetries(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", `{"retry": {"limit": 3, "backoff": "fixed", "initialDelaySec": 60, "maxDelaySec": 60}}`)
	name := publishN(t, d, "jobs", "payload")[0]
	r := cli(t, "", "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--max-messages", "1", "--", "sh", "-c", "exit 42")
	if r.code != 0 {
		t.Fatalf("consume: exit %d, %q", r.code, r.stderr)
	}
	if got := names(t, d, "jobs", "delayed"); len(got) != 1 || got[0] != name {
		t.Fatalf("delayed holds %q, want [%s] (waiting out the backoff)", got, name)
	}
	p := msgPath(d, "jobs", "delayed", name)
	if v := xattr(t, p, "attempts"); v != "1" {
		t.Errorf("attempts %q, want 1", v)
	}
	if v := xattr(t, p, "reason"); v != "HANDLER_FAILED" {
		t.Errorf("reason %q", v)
	}
	if v := xattr(t, p, "reason_message"); v != "exit status 42" {
		t.Errorf("reason_message %q", v)
	}
}

func TestConsumeMaxMessages(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	publishN(t, d, "jobs", "1", "2", "3", "4", "5")
	done := make(chan cliResult, 1)
	go func() {
		done <- cli(t, "", "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--concurrency", "3", "--max-messages", "2", "--", "cat")
	}()
	select {
	case r := <-done:
		if r.code != 0 {
			t.Fatalf("consume: exit %d, %q", r.code, r.stderr)
		}
		if len(r.stdout) != 2 { // two one-byte bodies
			t.Errorf("handlers printed %q, want two bodies", r.stdout)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("consume --max-messages 2 did not return")
	}
	if s := queueStats(t, d, "jobs"); s.AckedTotal != 2 || s.LeasedTotal != 2 || s.Ready != 3 || s.Inflight != 0 {
		t.Errorf("stats: acked %d leased %d ready %d inflight %d; want 2 2 3 0", s.AckedTotal, s.LeasedTotal, s.Ready, s.Inflight)
	}
}

func TestConsumeDrainEmpty(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	start := time.Now()
	r := cli(t, "", "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--drain", "--concurrency", "4", "--", "true")
	if r.code != 0 || time.Since(start) > 5*time.Second {
		t.Errorf("consume --drain of an empty queue: exit %d after %s, %q", r.code, time.Since(start), r.stderr)
	}
	// With several workers, messages nacked by one are not lost to the
	// exit of the others: all of them end acked.
	publishN(t, d, "jobs", "a", "b", "c", "d", "e", "f")
	r = cli(t, "", "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--drain", "--concurrency", "3", "--", "cat")
	if r.code != 0 || len(r.stdout) != 6 {
		t.Errorf("consume --drain: exit %d, out %q, err %q", r.code, r.stdout, r.stderr)
	}
	if s := queueStats(t, d, "jobs"); s.Ready+s.Inflight != 0 || s.AckedTotal != 6 {
		t.Errorf("after drain: %+v", s)
	}
}

// TestConsumeHeartbeat: a handler that runs past the visibility timeout
// keeps its lease.
func TestConsumeHeartbeat(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", `{"visibilityTimeoutSec": 1}`)
	publishN(t, d, "jobs", "slow")
	r := cli(t, "", "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--max-messages", "1", "--", "sh", "-c", "sleep 2.5")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("consume: exit %d, %q", r.code, r.stderr)
	}
	if s := queueStats(t, d, "jobs"); s.ExpiredTotal != 0 || s.AckedTotal != 1 || s.LeasedTotal != 1 {
		t.Errorf("expired %d, acked %d, leased %d; want 0 1 1", s.ExpiredTotal, s.AckedTotal, s.LeasedTotal)
	}
}

// TestConsumeCancelIdle: workers blocked on .next stop at once, taking no
// lease.
func TestConsumeCancelIdle(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan cliResult, 1)
	go func() {
		done <- cliCtx(ctx, t, "", "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--concurrency", "4", "--", "cat")
	}()
	time.Sleep(300 * time.Millisecond) // let the workers block on .next first; nothing outside shows it
	cancel()
	select {
	case r := <-done:
		if r.code != 0 {
			t.Errorf("consume: exit %d, %q", r.code, r.stderr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("consume did not stop when cancelled")
	}
	publishN(t, d, "jobs", "after")
	time.Sleep(100 * time.Millisecond) // a lease taken after the stop would show by now
	if s := queueStats(t, d, "jobs"); s.LeasedTotal != 0 || s.Ready != 1 {
		t.Errorf("leased %d, ready %d after the stop; want 0 and 1", s.LeasedTotal, s.Ready)
	}
}

// TestConsumeSIGTERM runs the binary: SIGTERM interrupts the idle
// workers, is passed on to the running handler, which finishes, and no
// lease is left.
func TestConsumeSIGTERM(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", archivePolicy)
	mark := filepath.Join(t.TempDir(), "mark")
	handler := `trap 'touch "$MARK.term"' TERM; cat >/dev/null; touch "$MARK"; i=0; while [ $i -lt 10 ]; do sleep 0.1; i=$((i+1)); done; exit 0`
	c := startChild(t, []string{"MARK=" + mark}, "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--concurrency", "3", "--", "sh", "-c", handler)

	name := publishN(t, d, "jobs", "work")[0]
	testenv.MustRetryUntil(t, 10*time.Second, "the handler never started", func() bool {
		_, err := os.Stat(mark)
		return err == nil
	})
	c.stop(t)
	if _, err := os.Stat(mark + ".term"); err != nil {
		t.Errorf("the handler did not get SIGTERM: %v", err)
	}
	if got := names(t, d, "jobs", "processing"); len(got) != 0 {
		t.Errorf("processing holds %q after SIGTERM", got)
	}
	if got := names(t, d, "jobs", "archive"); len(got) != 1 || got[0] != name {
		t.Errorf("archive holds %q, want the finished message", got)
	}
	if s := queueStats(t, d, "jobs"); s.LeasedTotal != 1 {
		t.Errorf("leased %d times, want 1:\n%s", s.LeasedTotal, c.out.String())
	}
}

// TestReadNextInterrupt: a blocked read of .next stops when told, with
// no lease taken.
func TestReadNextInterrupt(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	stop := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		_, err := readNext(stop, d.Path("jobs", ".next"), false)
		res <- err
	}()
	time.Sleep(200 * time.Millisecond) // let readNext block first; nothing outside shows it
	close(stop)
	select {
	case err := <-res:
		if err != errStopped {
			t.Errorf("readNext: %v, want errStopped", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("readNext did not stop")
	}
	if _, err := readNext(make(chan struct{}), d.Path("jobs", ".next"), true); err == nil || !strings.Contains(err.Error(), unix.EAGAIN.Error()) {
		t.Errorf("nonblocking readNext of an empty queue: %v, want EAGAIN", err)
	}
	name := publishN(t, d, "jobs", "x")[0]
	got, err := readNext(make(chan struct{}), d.Path("jobs", ".next"), false)
	if err != nil || got != name {
		t.Errorf("readNext: %q, %v; want %q", got, err, name)
	}
}

// TestConsumeSIGTERMReleases: a handler stopped by the consumer's SIGTERM
// gives its message back at once, its attempts unchanged (reason
// RELEASED): a deploy must not push messages towards the dlq. A nack by
// hand still counts.
func TestConsumeSIGTERMReleases(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", `{"retry": {"limit": 3, "backoff": "fixed", "initialDelaySec": 60, "maxDelaySec": 60}}`)
	mark := filepath.Join(t.TempDir(), "mark")
	c := startChild(t, []string{"MARK=" + mark}, "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--", "sh", "-c", `cat >/dev/null; touch "$MARK"; sleep 30`)

	name := publishN(t, d, "jobs", "work")[0]
	testenv.MustRetryUntil(t, 10*time.Second, "the handler never started", func() bool {
		_, err := os.Stat(mark)
		return err == nil
	})
	c.stop(t)
	if got := names(t, d, "jobs", "inbox"); len(got) != 1 || got[0] != name {
		t.Fatalf("inbox holds %q, want [%s] back at once:\n%s", got, name, c.out.String())
	}
	p := msgPath(d, "jobs", "inbox", name)
	if v := xattr(t, p, "attempts"); v != "0" {
		t.Errorf("attempts %q after SIGTERM, want 0", v)
	}
	if v := xattr(t, p, "reason"); v != "RELEASED" {
		t.Errorf("reason %q after SIGTERM, want RELEASED", v)
	}
	if s := queueStats(t, d, "jobs"); s.NackedTotal != 0 {
		t.Errorf("nacked_total %d after SIGTERM, want 0", s.NackedTotal)
	}
	// A nack by hand (no reason set) counts an attempt, as always.
	lease := msgPath(d, "jobs", "processing", name)
	if err := os.Rename(p, lease); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(lease, p); err != nil {
		t.Fatal(err)
	}
	delayed := msgPath(d, "jobs", "delayed", name)
	if v := xattr(t, delayed, "attempts"); v != "1" {
		t.Errorf("attempts %q after a nack, want 1", v)
	}
	if v := xattr(t, delayed, "reason"); v != "NACKED" {
		t.Errorf("reason %q after a nack, want NACKED", v)
	}
}

// consume uses the exact name .next gives: names that differ only by
// spaces, that hold newlines or start with dashes are each handled with
// their own body and acked under their own name, never another's.
func TestConsumeExactNames(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "exact", archivePolicy)
	names := []string{"victim ", "victim", " victim", "a\nb", "a", "tail\n", "-rf", "--help", "- x", "sp ace"}
	for i, n := range names {
		if err := os.WriteFile(d.Path("exact", "inbox", n), []byte{byte('A' + i)}, 0o644); err != nil {
			t.Fatalf("publish %q: %v", n, err)
		}
	}
	seen := filepath.Join(t.TempDir(), "seen")
	t.Setenv("SEEN", seen)
	// Each handler records its body and the path it was given, NUL-ended.
	r := cli(t, "", "consume", "--mount", d.Mountpoint, "--queue", "exact", "--drain", "--",
		"sh", "-c", `{ cat; printf '%s\0' "$YIRANGMQ_MESSAGE"; } >> "$SEEN"`)
	if r.code != 0 {
		t.Fatalf("consume: exit %d, %q", r.code, r.stderr)
	}
	b, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, rec := range strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00") {
		got[filepath.Base(rec[1:])] = rec[:1]
	}
	for i, n := range names {
		if want := string(rune('A' + i)); got[n] != want {
			t.Errorf("message %q: its handler read %q, want %q", n, got[n], want)
		}
	}
	if len(got) != len(names) {
		t.Errorf("%d handlers for %d messages: %q", len(got), len(names), got)
	}
	archived, err := os.ReadDir(d.Path("exact", "archive"))
	if err != nil {
		t.Fatal(err)
	}
	var arch []string
	for _, e := range archived {
		arch = append(arch, e.Name())
	}
	sort.Strings(arch)
	want := append([]string(nil), names...)
	sort.Strings(want)
	if strings.Join(arch, "\x00") != strings.Join(want, "\x00") {
		t.Errorf("archive/ holds %q, want %q", arch, want)
	}
	for i, n := range names {
		if b, err := os.ReadFile(d.Path("exact", "archive", n)); err != nil || string(b) != string(rune('A'+i)) {
			t.Errorf("archive/%q: %q %v", n, b, err)
		}
	}
}

// child is the binary run in the background by a test, with its output.
type child struct {
	cmd    *exec.Cmd
	out    *testenv.SyncBuffer
	exited chan error
}

// startChild runs the binary with args and env added to the test's, and
// kills it when the test ends.
func startChild(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(testenv.Binary(t), args...), out: &testenv.SyncBuffer{}, exited: make(chan error, 1)}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.exited <- c.cmd.Wait() }()
	t.Cleanup(func() { c.cmd.Process.Kill() })
	return c
}

// stop sends SIGTERM and wants a clean exit within 10 s.
func (c *child) stop(t *testing.T) {
	t.Helper()
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.exited:
		if err != nil {
			t.Errorf("%s exited with %v:\n%s", c.cmd.Args[1], err, c.out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit after SIGTERM:\n%s", c.cmd.Args[1], c.out.String())
	}
}

// consume --drain waits for what `yirangmq drain` waits for: a message
// that fails is retried after its backoff until it is dead-lettered, and
// the final failure says so (issue 40: --drain returned 0 with the
// message waiting in delayed/, and the last failure read "nacked").
func TestConsumeDrainMeansWhatDrainMeans(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", `{"retry": {"limit": 2, "backoff": "fixed", "initialDelaySec": 0.3, "maxDelaySec": 0.3}}`)
	name := publishN(t, d, "jobs", "payload")[0]
	r := cli(t, "", "consume", "--mount", d.Mountpoint, "--queue", "jobs", "--drain", "--", "sh", "-c", "echo no >&2; exit 3")
	if r.code != 0 {
		t.Fatalf("consume --drain: exit %d, %q", r.code, r.stderr)
	}
	if s := queueStats(t, d, "jobs"); s.Ready+s.Inflight+s.Delayed != 0 || s.DLQ != 1 {
		t.Errorf("after consume --drain: ready %d, in flight %d, delayed %d, dlq %d; want only the dead letter", s.Ready, s.Inflight, s.Delayed, s.DLQ)
	}
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	var got []string
	for _, l := range lines {
		if strings.HasPrefix(l, "yirangmq consume: "+name+": ") {
			got = append(got, l)
		}
	}
	if len(got) != 3 || !strings.Contains(got[0], ": nacked (retried after its backoff): exit status 3: no") ||
		!strings.Contains(got[1], ": nacked") || !strings.Contains(got[2], ": dead-lettered (its retries are spent; see dlq/): exit status 3: no") {
		t.Errorf("consume said:\n%s\nwant two nacks, then the dead-lettering", strings.Join(got, "\n"))
	}
	// yirangmq drain agrees at once.
	if r := cli(t, "", "drain", "--mount", d.Mountpoint, "--queue", "jobs", "--timeout", "5s"); r.code != 0 {
		t.Errorf("drain after consume --drain: exit %d, %q", r.code, r.stderr)
	}
}

// The command comes after --: a word before it is refused, not run.
func TestConsumeNeedsTheDashes(t *testing.T) {
	for _, args := range [][]string{
		{"consume", "--queue", "jobs", "/bin/true"},
		{"consume", "--queue", "jobs", "/bin/true", "--", "x"},
	} {
		r := cli(t, "", args...)
		if r.code != 2 || !strings.Contains(r.stderr, "--") || r.stdout != "" {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a line about --", args, r.code, r.stderr)
		}
	}
}
