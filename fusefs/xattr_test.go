package fusefs_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"yirangmq/testenv"
)

// xattrs runs getfattr -d on a file and returns its user.yirangmq.*
// attributes without the prefix.
func xattrs(t *testing.T, path string) map[string]string {
	t.Helper()
	out := testenv.MustSh(t, "/", `getfattr -d --absolute-names -- '`+path+`'`)
	a := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		k, ok = strings.CutPrefix(k, "user.yirangmq.")
		if !ok {
			t.Fatalf("getfattr shows an attribute outside user.yirangmq: %q", line)
		}
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		}
		a[k] = v
	}
	return a
}

// wantKeys checks that a holds exactly the keys want.
func wantKeys(t *testing.T, what string, a map[string]string, want ...string) {
	t.Helper()
	var got []string
	for k := range a {
		got = append(got, k)
	}
	wantNames(t, what+" xattr keys", sorted(got), sorted(want)...)
}

func wantTime(t *testing.T, what, v string, lo, hi time.Time) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		t.Fatalf("%s = %q: not an RFC 3339 time: %v", what, v, err)
	}
	if ts.Before(lo) || ts.After(hi) {
		t.Errorf("%s = %v, want between %v and %v", what, ts, lo, hi)
	}
	return ts
}

// holdOpen starts the C client on path: it creates the file, writes body
// and keeps the descriptor open until the returned func is called, which
// closes it and returns the client's report of the close.
func holdOpen(t *testing.T, dir, path, body string) (closeIt func() string) {
	t.Helper()
	cmd := exec.Command(testenv.CClient(t), "publish-hold", path, body)
	cmd.Dir = dir
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	r := bufio.NewReader(out)
	var head strings.Builder
	for !strings.HasSuffix(head.String(), "held\n") {
		line, err := r.ReadString('\n')
		head.WriteString(line)
		if err != nil {
			t.Fatalf("publish-hold %s: %q: %v", path, head.String(), err)
		}
	}
	wantOut(t, "publish-hold "+path, head.String(), "open=OK\nwrite=OK\nheld")
	return func() string {
		in.Write([]byte("go\n"))
		in.Close()
		rest, _ := io.ReadAll(r)
		cmd.Wait()
		return strings.TrimSpace(string(rest))
	}
}

// getfattr -d in every state shows the keys docs/contract.md §4 gives that state,
// with plain-text values that mean what they say.
func TestXattrsInEveryState(t *testing.T) {
	policy := `{"visibilityTimeoutSec": 120, "retry": {"limit": 3, "backoff": "fixed", "initialDelaySec": 300, "maxDelaySec": 300}}`
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", policy)
		before := time.Now().Add(-time.Second)
		testenv.MustSh(t, q, `
			for m in acked first second leased delayed dead; do echo $m > inbox/$m; done
			mv inbox/acked processing/ && rm processing/acked
			mv inbox/leased processing/
			mv inbox/delayed processing/ && mv processing/delayed inbox/
			mv inbox/dead dlq/
		`)
		after := time.Now().Add(time.Second)
		common := []string{"id", "attempts", "published_at", "redrives"}

		// Ready: place in line and expected wait (there is an ack rate now).
		for i, name := range []string{"first", "second"} {
			a := xattrs(t, filepath.Join(q, "inbox", name))
			wantKeys(t, "inbox/"+name, a, append(common, "position", "eta_sec")...)
			if a["position"] != strconv.Itoa(i) {
				t.Errorf("inbox/%s position = %q, want %d", name, a["position"], i)
			}
			if eta, err := strconv.ParseFloat(a["eta_sec"], 64); err != nil || eta < 0 {
				t.Errorf("inbox/%s eta_sec = %q, want a number of seconds", name, a["eta_sec"])
			}
			if a["attempts"] != "0" || a["redrives"] != "0" || a["id"] == "" {
				t.Errorf("inbox/%s: %v", name, a)
			}
			wantTime(t, "published_at", a["published_at"], before, after)
		}
		if a, b := xattrs(t, filepath.Join(q, "inbox", "first")), xattrs(t, filepath.Join(q, "inbox", "second")); a["id"] == b["id"] {
			t.Errorf("two messages share the id %q", a["id"])
		}

		// Leased: deadline and who leased it (uid, pid, command mv).
		a := xattrs(t, filepath.Join(q, "processing", "leased"))
		wantKeys(t, "processing/leased", a, append(common, "lease_deadline", "consumer")...)
		wantTime(t, "lease_deadline", a["lease_deadline"], before.Add(120*time.Second), after.Add(120*time.Second))
		if c := a["consumer"]; !strings.Contains(c, "uid="+strconv.Itoa(os.Getuid())) || !strings.Contains(c, "pid=") || !strings.Contains(c, "cmd=mv") {
			t.Errorf("consumer = %q, want the leaser's uid, pid and command mv", c)
		}
		fi, err := os.Stat(filepath.Join(q, "processing", "leased"))
		if err != nil {
			t.Fatal(err)
		}
		if dl := wantTime(t, "lease_deadline", a["lease_deadline"], before, after.Add(time.Hour)); fi.ModTime().Sub(dl).Abs() > time.Second {
			t.Errorf("processing mtime %v and lease_deadline %v disagree", fi.ModTime(), dl)
		}

		// Delayed after a nack: due time, attempt counted, last leaser kept.
		a = xattrs(t, filepath.Join(q, "delayed", "delayed"))
		wantKeys(t, "delayed/delayed", a, append(common, "due_at", "consumer", "reason", "reason_message", "failed_at")...)
		wantTime(t, "due_at", a["due_at"], before.Add(300*time.Second), after.Add(300*time.Second))
		if a["attempts"] != "1" || a["reason"] != "NACKED" {
			t.Errorf("delayed/delayed: attempts %q reason %q, want 1 and NACKED", a["attempts"], a["reason"])
		}
		wantTime(t, "failed_at", a["failed_at"], before, after)

		// Dead letter: why and when.
		a = xattrs(t, filepath.Join(q, "dlq", "dead"))
		wantKeys(t, "dlq/dead", a, append(common, "reason", "reason_message", "failed_at")...)
		if a["reason"] != "MANUAL" || a["reason_message"] == "" {
			t.Errorf("dlq/dead: reason %q, message %q", a["reason"], a["reason_message"])
		}
		wantTime(t, "failed_at", a["failed_at"], before, after)

		// Archived: the common keys (and its last leaser).
		a = xattrs(t, filepath.Join(q, "archive", "acked"))
		wantKeys(t, "archive/acked", a, append(common, "consumer")...)

		// Redrive: counted, attempts reset, first publish time kept.
		pub := xattrs(t, filepath.Join(q, "dlq", "dead"))["published_at"]
		testenv.MustSh(t, q, `mv dlq/dead inbox/ && mv inbox/dead processing/ && mv processing/dead dlq/ && mv dlq/dead inbox/`)
		a = xattrs(t, filepath.Join(q, "inbox", "dead"))
		if a["redrives"] != "2" || a["attempts"] != "0" || a["published_at"] != pub || a["position"] != "2" {
			t.Errorf("after two redrives: %v; want redrives 2, attempts 0, published_at %s, position 2", a, pub)
		}
	})
}

// A consumer sets user.yirangmq.reason on a leased message; dlq/ records
// it, after a dead-lettering by hand and after a nack that spends the
// retries. Everything else is refused with the right errno.
func TestSetxattr(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"retry": {"limit": 0}}`)
		testenv.MustSh(t, q, `
			for m in byhand nacked ready; do echo $m > inbox/$m; done
			mv inbox/byhand processing/
			setfattr -n user.yirangmq.reason -v BAD_INPUT processing/byhand
			setfattr -n user.yirangmq.reason_message -v 'field x missing' processing/byhand
			mv processing/byhand dlq/
			mv inbox/nacked processing/
			setfattr -n user.yirangmq.reason -v TIMEOUT processing/nacked
			mv processing/nacked inbox/
		`)
		a := xattrs(t, filepath.Join(q, "dlq", "byhand"))
		if a["reason"] != "BAD_INPUT" || a["reason_message"] != "field x missing" {
			t.Errorf("dlq/byhand: reason %q message %q, want BAD_INPUT and the consumer's message", a["reason"], a["reason_message"])
		}
		if a := xattrs(t, filepath.Join(q, "dlq", "nacked")); a["reason"] != "TIMEOUT" {
			t.Errorf("dlq/nacked: reason %q, want TIMEOUT (set before the nack)", a["reason"])
		}
		testenv.MustSh(t, q, `mv inbox/ready processing/`)
		cases := []struct{ script, want string }{
			// reason belongs to a leased message
			{`setfattr -n user.yirangmq.reason -v X dlq/byhand`, "Operation not permitted"},
			// read-only keys
			{`setfattr -n user.yirangmq.attempts -v 0 processing/ready`, "Operation not permitted"},
			{`setfattr -n user.yirangmq.id -v x processing/ready`, "Operation not permitted"},
			{`setfattr -n user.yirangmq.lease_deadline -v 2030-01-01T00:00:00Z processing/ready`, "Operation not permitted"},
			{`setfattr -x user.yirangmq.attempts processing/ready`, "Operation not permitted"},
			// a committed message's delay and dedup key are fixed
			{`setfattr -n user.yirangmq.delay_sec -v 5 processing/ready`, "Operation not permitted"},
			// unknown keys and namespaces
			{`setfattr -n user.yirangmq.foo -v 1 processing/ready`, "Operation not supported"},
			{`setfattr -n user.other -v 1 processing/ready`, "Operation not supported"},
		}
		testenv.MustSh(t, q, `echo r > inbox/r2`)
		cases = append(cases, struct{ script, want string }{`setfattr -n user.yirangmq.reason -v X inbox/r2`, "Operation not permitted"})
		for _, c := range cases {
			r := testenv.Sh(t, q, c.script)
			if r.Code == 0 || !strings.Contains(r.Stderr, c.want) {
				t.Errorf("%s: exit %d, %q; want %q", c.script, r.Code, strings.TrimSpace(r.Stderr), c.want)
			}
		}
		// The same through the C client, by errno.
		wantOut(t, "C: reason on inbox/", client(t, q, "setxattr", "inbox/r2", "user.yirangmq.reason", "X"), "setxattr=EPERM")
		wantOut(t, "C: unknown key", client(t, q, "setxattr", "inbox/r2", "user.yirangmq.foo", "1"), "setxattr=ENOTSUP")
		wantOut(t, "C: read-only key", client(t, q, "setxattr", "inbox/r2", "user.yirangmq.position", "0"), "setxattr=EPERM")
		wantOut(t, "C: missing key", client(t, q, "getxattr", "inbox/r2", "user.yirangmq.lease_deadline"), "getxattr=ENODATA")
		wantOut(t, "C: attempts", client(t, q, "getxattr", "inbox/r2", "user.yirangmq.attempts"), "getxattr=OK\nvalue=0")
		// Nothing moved or changed.
		if a := xattrs(t, filepath.Join(q, "processing", "ready")); a["attempts"] != "0" || a["reason"] != "" {
			t.Errorf("processing/ready after refused setfattr: %v", a)
		}
	})
}

// user.yirangmq.delay_sec set from another process while the file is still
// open for writing: the message waits in delayed/ that long, then is ready.
func TestDelaySecOnOpenFile(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal"}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		closeIt := holdOpen(t, q, "inbox/later", "body")
		testenv.MustSh(t, q, `setfattr -n user.yirangmq.delay_sec -v 2 inbox/later`)
		out := testenv.MustSh(t, q, `getfattr --only-values -n user.yirangmq.delay_sec inbox/later`)
		wantOut(t, "delay_sec before the commit", out, "2")
		r := testenv.Sh(t, q, `setfattr -n user.yirangmq.delay_sec -v soon inbox/later`)
		if r.Code == 0 || !strings.Contains(r.Stderr, "Invalid argument") {
			t.Errorf("delay_sec=soon: exit %d %q, want Invalid argument", r.Code, r.Stderr)
		}
		committed := time.Now()
		wantOut(t, "close", closeIt(), "close=OK")
		wantNames(t, "inbox right after the commit", ls(t, filepath.Join(q, "inbox")))
		wantNames(t, "delayed right after the commit", ls(t, filepath.Join(q, "delayed")), "later")
		a := xattrs(t, filepath.Join(q, "delayed", "later"))
		wantTime(t, "due_at", a["due_at"], committed.Add(time.Second), committed.Add(3*time.Second))
		if stat(t, q, "delayed") != 1 {
			t.Errorf(".stats delayed != 1")
		}
		if !testenv.RetryUntil(10*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(q, "inbox", "later"))
			return err == nil
		}) {
			t.Fatal("delayed message never reached inbox/")
		}
		if waited := time.Since(committed); waited < 1900*time.Millisecond {
			t.Errorf("message was ready after %v, before its 2 s delay", waited)
		}
		wantOut(t, "body", readFile(t, filepath.Join(q, "inbox", "later")), "body")
		wantNames(t, "delayed after the delay", ls(t, filepath.Join(q, "delayed")))
	})
}

// With dedupWindowSec, a second publish with the same dedup_key is
// accepted (close OK) and dropped (not in inbox/, counted).
func TestDedupKey(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal"}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"dedupWindowSec": 60}`)
		publish := func(name, key string) string {
			closeIt := holdOpen(t, q, "inbox/"+name, name)
			if key != "" {
				testenv.MustSh(t, q, fmt.Sprintf(`setfattr -n user.yirangmq.dedup_key -v %s inbox/%s`, key, name))
			}
			return closeIt()
		}
		wantOut(t, "first", publish("m1", "device-1:100"), "close=OK")
		wantOut(t, "duplicate", publish("m2", "device-1:100"), "close=OK")
		wantOut(t, "other key", publish("m3", "device-1:101"), "close=OK")
		wantOut(t, "no key", publish("m4", ""), "close=OK")
		wantNames(t, "inbox", ls(t, filepath.Join(q, "inbox")), "m1", "m3", "m4")
		if _, err := os.Stat(filepath.Join(q, "inbox", "m2")); !os.IsNotExist(err) {
			t.Errorf("stat inbox/m2 after it was dropped: %v", err)
		}
		for key, want := range map[string]float64{"deduplicated_total": 1, "published_total": 3, "ready": 3} {
			if got := stat(t, q, key); got != want {
				t.Errorf(".stats %s = %v, want %v", key, got, want)
			}
		}
		if a := xattrs(t, filepath.Join(q, "inbox", "m1")); a["dedup_key"] != "device-1:100" {
			t.Errorf("inbox/m1 dedup_key = %q", a["dedup_key"])
		}
		// A dropped duplicate does not hold its name.
		wantOut(t, "m2 again with a new key", publish("m2", "device-1:102"), "close=OK")
		// Envelope deduplicationKey shares the window with the xattr.
		testenv.MustSh(t, q, `echo '{"format": "envelope", "dedupWindowSec": 60}' > .policy`)
		wantOut(t, "envelope dup", client(t, q, "publish", "inbox/e1", `{"deduplicationKey": "device-1:100", "payload": 1}`), "open=OK\nwrite=OK\nclose=OK")
		wantOut(t, "envelope new", client(t, q, "publish", "inbox/e2", `{"deduplicationKey": "device-1:200", "payload": 2}`), "open=OK\nwrite=OK\nclose=OK")
		wantNames(t, "inbox", ls(t, filepath.Join(q, "inbox")), "m1", "m3", "m4", "m2", "e2")
		if got := stat(t, q, "deduplicated_total"); got != 2 {
			t.Errorf("deduplicated_total = %v, want 2", got)
		}
	})
}

// The envelope format through the mount: priority ordering in ls -f,
// messageId and timestamp filled in, attributes.delaySec.
func TestEnvelope(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal"}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "telemetry", `{"format": "envelope"}`)
		bodies := []struct{ name, body string }{
			{"p0a", `{"payload": {"n": 1}}`},
			{"p3a", `{"attributes": {"priority": 3}, "payload": {"n": 2}}`},
			{"p1a", `{"attributes": {"priority": 1}, "payload": {"n": 3}}`},
			{"p3b", `{"attributes": {"priority": 3}, "payload": {"n": 4}}`},
			{"neg", `{"attributes": {"priority": -2}, "payload": {"n": 5}}`},
			{"p0b", `{"attributes": {"priority": 0}, "payload": {"n": 6}}`},
			{"p1b", `{"attributes": {"priority": 1}, "payload": {"n": 7}}`},
			{"given", `{"messageId": "my-id-1", "timestamp": "2026-01-13T10:21:00+09:00", "queue": "telemetry", "type": "sensor.reading", "version": 1, "traceId": "t1", "payload": {}}`},
		}
		for _, b := range bodies {
			testenv.MustSh(t, q, fmt.Sprintf(`printf '%%s' '%s' > inbox/%s`, b.body, b.name))
		}
		out := testenv.MustSh(t, q, `ls -f inbox`)
		var order []string
		for _, n := range strings.Fields(out) {
			if n != "." && n != ".." {
				order = append(order, n)
			}
		}
		wantNames(t, "ls -f inbox", order, "p3a", "p3b", "p1a", "p1b", "p0a", "p0b", "given", "neg")
		// .next and mv leases follow the same order.
		wantOut(t, ".next", testenv.MustSh(t, q, `cat .next`), "processing/p3a")

		// messageId and timestamp are filled in when absent.
		var env map[string]any
		raw := testenv.MustSh(t, q, `cat inbox/p0a`)
		if err := json.Unmarshal([]byte(raw), &env); err != nil {
			t.Fatalf("cat inbox/p0a: %q: %v", raw, err)
		}
		id, _ := env["messageId"].(string)
		if id == "" {
			t.Errorf("messageId not filled in: %s", raw)
		}
		if ts, _ := env["timestamp"].(string); ts == "" {
			t.Errorf("timestamp not filled in: %s", raw)
		} else {
			wantTime(t, "timestamp", ts, time.Now().Add(-time.Minute), time.Now().Add(time.Second))
		}
		if p, _ := env["payload"].(map[string]any); p["n"] != 1.0 {
			t.Errorf("payload lost: %s", raw)
		}
		if got := xattrs(t, filepath.Join(q, "inbox", "p0a"))["id"]; got != id {
			t.Errorf("user.yirangmq.id = %q, want the envelope's messageId %q", got, id)
		}
		// A producer's own messageId and timestamp are kept as sent.
		given := bodies[len(bodies)-1].body
		wantOut(t, "cat inbox/given", readFile(t, filepath.Join(q, "inbox", "given")), given)
		if got := xattrs(t, filepath.Join(q, "inbox", "given"))["id"]; got != "my-id-1" {
			t.Errorf("user.yirangmq.id = %q, want my-id-1", got)
		}

		// attributes.delaySec: the message waits in delayed/.
		testenv.MustSh(t, q, `echo '{"attributes": {"delaySec": 1}, "payload": "soon"}' > inbox/delayed1`)
		wantNames(t, "delayed", ls(t, filepath.Join(q, "delayed")), "delayed1")
		if _, err := os.Stat(filepath.Join(q, "inbox", "delayed1")); !os.IsNotExist(err) {
			t.Errorf("stat inbox/delayed1 right after publish: %v", err)
		}
		if !testenv.RetryUntil(10*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(q, "inbox", "delayed1"))
			return err == nil
		}) {
			t.Fatal("delayed envelope never reached inbox/")
		}

		// Envelope errors fail the close and the message goes to dlq/.
		for name, body := range map[string]string{
			"wrongq":  `{"queue": "other", "payload": 1}`,
			"badprio": `{"attributes": {"priority": "high"}, "payload": 1}`,
			"nopay":   `{"type": "x"}`,
			"badts":   `{"timestamp": "yesterday", "payload": 1}`,
		} {
			wantOut(t, "envelope "+name, client(t, q, "publish", "inbox/"+name, body), "open=OK\nwrite=OK\nclose=EINVAL")
			if a := xattrs(t, filepath.Join(q, "dlq", name)); a["reason"] != "VALIDATION_ERROR" {
				t.Errorf("dlq/%s reason = %q", name, a["reason"])
			}
		}
	})
}
