package fusefs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"yirangmq/testenv"
)

// The errnos of docs/contract.md §2 at close(2), write(2) and create, seen by a
// legacy C program, and where the message ends up.

// A body the queue's format rejects fails its close with EINVAL and is kept
// in dlq/ with reason VALIDATION_ERROR, so a producer that ignores close()
// loses nothing.
func TestCloseEINVALOnFormatAndSchema(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		cases := []struct {
			queue, policy, body, reasonHas string
		}{
			{"fmt", `{"format": "json"}`, `{oops`, "JSON"},
			{"schema", `{"format": "json", "schema": {"type": "object", "required": ["id"]}}`, `{"x": 1}`, "schema"},
			{"env", `{"format": "envelope"}`, `{"payload": {}, "typo": 1}`, "typo"},
		}
		for _, c := range cases {
			q := mkq(t, d, c.queue, c.policy)
			wantOut(t, c.queue+": publish", client(t, q, "publish", "inbox/bad", c.body), "open=OK\nwrite=OK\nclose=EINVAL")
			wantNames(t, c.queue+": inbox", ls(t, filepath.Join(q, "inbox")))
			wantNames(t, c.queue+": dlq", ls(t, filepath.Join(q, "dlq")), "bad")
			if got := readFile(t, filepath.Join(q, "dlq", "bad")); got != c.body {
				t.Errorf("%s: dlq/bad = %q, want the producer's bytes %q", c.queue, got, c.body)
			}
			a := xattrs(t, filepath.Join(q, "dlq", "bad"))
			if a["reason"] != "VALIDATION_ERROR" {
				t.Errorf("%s: reason = %q, want VALIDATION_ERROR", c.queue, a["reason"])
			}
			if !strings.Contains(a["reason_message"], c.reasonHas) {
				t.Errorf("%s: reason_message = %q, want it to mention %q", c.queue, a["reason_message"], c.reasonHas)
			}
			for key, want := range map[string]float64{"rejected_total": 1, "published_total": 0, "ready": 0, "dlq": 1} {
				if got := stat(t, q, key); got != want {
					t.Errorf("%s: .stats %s = %v, want %v", c.queue, key, got, want)
				}
			}
			// The name is taken by the dead letter: the producer cannot
			// silently publish it again over the rejected one.
			wantOut(t, c.queue+": republish", client(t, q, "publish", "inbox/bad", "{}"), "open=EEXIST")
		}
		// A good body in the same queues goes through.
		wantOut(t, "good json", client(t, d.Path("fmt"), "publish", "inbox/good", `{"ok": true}`), "open=OK\nwrite=OK\nclose=OK")
		wantOut(t, "good schema", client(t, d.Path("schema"), "publish", "inbox/good", `{"id": 7}`), "open=OK\nwrite=OK\nclose=OK")
	})
}

// A write past maxMessageBytes fails at write(2) with EFBIG and nothing is
// committed: no empty message, no half message, anywhere.
func TestWriteEFBIG(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"maxMessageBytes": 1000}`)
		// The first 4 KiB write is already too big.
		wantOut(t, "publish-big 5000", client(t, q, "publish-big", "inbox/big", "5000"), "open=OK\nwrite=EFBIG\nclose=EFBIG")
		// 4 KiB fit under 5000, the next write does not: the 4 KiB written
		// must not be committed as a message either.
		q2 := mkq(t, d, "q2", `{"maxMessageBytes": 5000}`)
		wantOut(t, "publish-big 9000", client(t, q2, "publish-big", "inbox/half", "9000"), "open=OK\nwrite=EFBIG\nclose=EFBIG")
		// RELEASE is asynchronous: give a wrong late commit the time to show.
		time.Sleep(200 * time.Millisecond)
		for _, dir := range []string{q, q2} {
			for _, s := range []string{"inbox", "processing", "delayed", "dlq", "archive"} {
				wantNames(t, filepath.Base(dir)+"/"+s, ls(t, filepath.Join(dir, s)))
			}
			for _, key := range []string{"published_total", "rejected_total", "bytes"} {
				if got := stat(t, dir, key); got != 0 {
					t.Errorf("%s: .stats %s = %v after a refused message", filepath.Base(dir), key, got)
				}
			}
			r := testenv.Sh(t, dir, `test -e inbox/big || test -e inbox/half`)
			if r.Code == 0 {
				t.Errorf("%s: the refused file is still visible in inbox/", filepath.Base(dir))
			}
		}
		// The names are free again, and a message at the limit goes through.
		wantOut(t, "at the limit", client(t, q, "publish-big", "inbox/big", "1000"), "open=OK\nwrite=OK\nclose=OK")
		if got := len(readFile(t, filepath.Join(q, "inbox", "big"))); got != 1000 {
			t.Fatalf("inbox/big holds %d bytes, want 1000", got)
		}
		if !strings.Contains(d.Log(), "maxMessageBytes") {
			t.Errorf("no log line for the refused write")
		}
	})
}

// A create in a queue that holds maxReady ready messages fails with EDQUOT;
// once one is leased there is room again.
func TestCreateEDQUOT(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"maxReady": 2}`)
		wantOut(t, "first", client(t, q, "publish", "inbox/m1", "1"), "open=OK\nwrite=OK\nclose=OK")
		wantOut(t, "second", client(t, q, "publish", "inbox/m2", "2"), "open=OK\nwrite=OK\nclose=OK")
		wantOut(t, "third", client(t, q, "publish", "inbox/m3", "3"), "open=EDQUOT")
		r := testenv.Sh(t, q, `echo 3 > inbox/m3`)
		if r.Code == 0 || !strings.Contains(r.Stderr, "quota") {
			t.Errorf("echo into a full queue: exit %d, %q; want Disk quota exceeded", r.Code, r.Stderr)
		}
		wantNames(t, "inbox", ls(t, filepath.Join(q, "inbox")), "m1", "m2")
		testenv.MustSh(t, q, `mv inbox/m1 processing/`)
		wantOut(t, "after a lease", client(t, q, "publish", "inbox/m3", "3"), "open=OK\nwrite=OK\nclose=OK")
	})
}

// .policy: an invalid document fails the close with EINVAL and the old
// policy stays in effect; a valid one is in effect at once.
func TestPolicyWriteErrnos(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"visibilityTimeoutSec": 45}`)
		policy := func() map[string]any {
			var p map[string]any
			if err := json.Unmarshal([]byte(readFile(t, filepath.Join(q, ".policy"))), &p); err != nil {
				t.Fatalf("parse .policy: %v", err)
			}
			return p
		}
		for _, bad := range []string{
			`{"visibilityTimeoutSec": "soon"}`,
			`{"visibilityTimeoutSec": 10, "noSuchField": 1}`,
			`{"format": "xml"}`,
			`{"retry": {"limit": -1}}`,
			`{"fanout": ["q"]}`,
			`not json`,
		} {
			wantOut(t, "invalid policy "+bad, client(t, q, "write-policy", ".policy", bad), "open=OK\nwrite=OK\nclose=EINVAL")
			if p := policy(); p["visibilityTimeoutSec"] != 45.0 || p["format"] != "raw" {
				t.Fatalf("after invalid %s: policy in effect is %v", bad, p)
			}
		}
		wantOut(t, "valid policy", client(t, q, "write-policy", ".policy", `{"visibilityTimeoutSec": 12, "format": "json", "maxReady": 7}`), "open=OK\nwrite=OK\nclose=OK")
		p := policy()
		if p["visibilityTimeoutSec"] != 12.0 || p["format"] != "json" || p["maxReady"] != 7.0 {
			t.Fatalf("valid policy not in effect: %v", p)
		}
		// Defaults are filled in for what the document left out.
		if p["maxMessageBytes"] != 262144.0 {
			t.Errorf("maxMessageBytes = %v, want the default 262144", p["maxMessageBytes"])
		}
		// In effect: the new format rejects what raw accepted.
		wantOut(t, "publish under the new policy", client(t, q, "publish", "inbox/x", "not json"), "open=OK\nwrite=OK\nclose=EINVAL")
	})
}

// Creating a name that is live elsewhere in the queue is EEXIST; the
// kernel, not the daemon, refuses a name longer than 255 bytes.
func TestCreateNames(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"retry": {"limit": 3, "backoff": "fixed", "initialDelaySec": 600, "maxDelaySec": 600}}`)
		testenv.MustSh(t, q, `
			for m in leased delayed dead acked; do echo $m > inbox/$m; done
			mv inbox/leased processing/
			mv inbox/delayed processing/ && mv processing/delayed inbox/ && test -f delayed/delayed
			mv inbox/dead dlq/
			mv inbox/acked processing/ && rm processing/acked && test -f archive/acked
		`)
		for _, name := range []string{"leased", "delayed", "dead"} {
			wantOut(t, "create of a name live in "+name, client(t, q, "publish", "inbox/"+name, "again"), "open=EEXIST")
		}
		// An acked name is no longer live: it can be published again.
		wantOut(t, "create of an acked name", client(t, q, "publish", "inbox/acked", "again"), "open=OK\nwrite=OK\nclose=OK")

		long := strings.Repeat("n", 255)
		wantOut(t, "255-byte name", client(t, q, "publish", "inbox/"+long, "long"), "open=OK\nwrite=OK\nclose=OK")
		testenv.MustSh(t, q, fmt.Sprintf(`test "$(cat inbox/%[1]s)" = long && mv inbox/%[1]s processing/ && rm processing/%[1]s && test -f archive/%[1]s`, long))
		tooLong := strings.Repeat("n", 256)
		wantOut(t, "256-byte name", client(t, q, "publish", "inbox/"+tooLong, "long"), "open=ENAMETOOLONG")
		for _, script := range []string{
			`echo x > inbox/` + tooLong,
			`stat inbox/` + tooLong,
			`mv inbox/acked inbox/` + tooLong,
			`mkdir ../` + tooLong,
		} {
			r := testenv.Sh(t, q, script)
			if r.Code == 0 || !strings.Contains(r.Stderr, "too long") {
				t.Errorf("%.40s…: exit %d, %q; want File name too long", script, r.Code, r.Stderr)
			}
		}
	})
}

// One daemon per store: a second mount of the same store fails at once and
// names the holder's pid and mountpoint; the first mount is unharmed.
func TestSecondMountOfAStore(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		other := filepath.Join(t.TempDir(), "other")
		testenv.MustSh(t, "/", "mkdir -p "+other)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, testenv.Binary(t), "mount", "--backend", filepath.Base(t.Name()), "--store", d.Store, other)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		start := time.Now()
		err := cmd.Run()
		took := time.Since(start)
		if testenv.IsMounted(other) {
			testenv.Unmount(other)
			t.Fatalf("a second mount of %s succeeded", d.Store)
		}
		if err == nil || ctx.Err() != nil {
			t.Fatalf("second mount: err %v (ctx %v); want a quick failure", err, ctx.Err())
		}
		if took > 5*time.Second {
			t.Errorf("second mount took %v to fail; want at once", took)
		}
		msg := stderr.String()
		if !strings.Contains(msg, fmt.Sprintf("pid %d", d.Pid())) || !strings.Contains(msg, d.Mountpoint) {
			t.Errorf("second mount said %q; want the holder's pid %d and mountpoint %s", msg, d.Pid(), d.Mountpoint)
		}
		wantOut(t, "first mount still serves", client(t, q, "publish", "inbox/m", "x"), "open=OK\nwrite=OK\nclose=OK")
	})
}
