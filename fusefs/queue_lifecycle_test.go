package fusefs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"yirangmq/testenv"
)

// everyState fills a queue with one message in each state.
const everyState = `
	for m in ready leased delayed dead acked; do echo $m > inbox/$m; done
	mv inbox/leased processing/
	mv inbox/delayed processing/ && mv processing/delayed inbox/ && test -f delayed/delayed
	mv inbox/dead dlq/
	mv inbox/acked processing/ && rm processing/acked && test -f archive/acked
`

const longBackoff = `{"retry": {"limit": 3, "backoff": "fixed", "initialDelaySec": 600, "maxDelaySec": 600}}`

// rm -r QUEUE deletes a queue with its messages in every state; rmdir
// deletes only an empty one; a deleted queue's name can be used again.
func TestDeleteQueue(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "full", longBackoff)
		testenv.MustSh(t, q, everyState)
		for _, s := range []string{"inbox", "processing", "delayed", "dlq", "archive"} {
			if n := len(ls(t, filepath.Join(q, s))); n != 1 {
				t.Fatalf("%s holds %d messages before rm -r", s, n)
			}
		}
		r := testenv.Sh(t, d.Mountpoint, `rmdir full`)
		if r.Code == 0 || !strings.Contains(r.Stderr, "Directory not empty") {
			t.Fatalf("rmdir of a full queue: exit %d, %q", r.Code, r.Stderr)
		}
		testenv.MustSh(t, d.Mountpoint, `rm -r full && test ! -e full`)
		wantNames(t, "mount root", ls(t, d.Mountpoint), ".stats", ".metrics")
		if strings.Contains(readFile(t, d.Path(".stats")), `"full"`) {
			t.Errorf("root .stats still names the deleted queue")
		}

		// ENOTEMPTY as long as any state holds a message, even archive/ or
		// delayed/ alone.
		one := mkq(t, d, "one", longBackoff)
		testenv.MustSh(t, one, `echo a > inbox/a && mv inbox/a processing/ && rm processing/a`)
		wantOut(t, "rmdir with only an archived message", testenv.Sh(t, d.Mountpoint, `rmdir one 2>&1`).Stdout, "rmdir: failed to remove 'one': Directory not empty")
		testenv.MustSh(t, one, `rm archive/a && echo b > inbox/b && mv inbox/b processing/ && mv processing/b inbox/ && test -f delayed/b`)
		wantOut(t, "rmdir with only a delayed message", testenv.Sh(t, d.Mountpoint, `rmdir one 2>&1`).Stdout, "rmdir: failed to remove 'one': Directory not empty")
		testenv.MustSh(t, one, `rm delayed/b`)
		testenv.MustSh(t, d.Mountpoint, `rmdir one && test ! -e one`)

		// The names are free again: a new, empty queue with the default policy.
		for _, name := range []string{"full", "one"} {
			nq := mkq(t, d, name, "")
			for _, s := range []string{"inbox", "processing", "delayed", "dlq", "archive"} {
				wantNames(t, name+"/"+s+" after re-creation", ls(t, filepath.Join(nq, s)))
			}
			for _, key := range []string{"published_total", "acked_total", "archived", "delayed", "dlq"} {
				if got := stat(t, nq, key); got != 0 {
					t.Errorf("%s: .stats %s = %v in the re-created queue", name, key, got)
				}
			}
			if p := readFile(t, filepath.Join(nq, ".policy")); !strings.Contains(p, `"initialDelaySec": 1`) {
				t.Errorf("%s: re-created queue kept the old policy: %s", name, p)
			}
			testenv.MustSh(t, nq, `echo new > inbox/ready && test "$(cat inbox/ready)" = new`)
		}

		// And it stays that way after a restart: nothing of the old queue
		// comes back from the store.
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		d.Restart(t)
		wantNames(t, "full/inbox after restart", ls(t, d.Path("full", "inbox")), "ready")
		for _, s := range []string{"processing", "delayed", "dlq", "archive"} {
			wantNames(t, "full/"+s+" after restart", ls(t, d.Path("full", s)))
		}
	})
}

// A lease taken before a restart can be acked after it: the deadline and
// the lease live in the store.
func TestLeaseSurvivesRestart(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"visibilityTimeoutSec": 300}`)
		testenv.MustSh(t, q, `echo work > inbox/job && echo other > inbox/job2 && mv inbox/job processing/ && mv inbox/job2 processing/`)
		before := xattrs(t, filepath.Join(q, "processing", "job"))
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		d.Restart(t)
		after := xattrs(t, filepath.Join(q, "processing", "job"))
		for _, k := range []string{"id", "lease_deadline", "consumer", "attempts"} {
			if after[k] != before[k] {
				t.Errorf("%s changed across the restart: %q → %q", k, before[k], after[k])
			}
		}
		wantNames(t, "inbox after restart", ls(t, filepath.Join(q, "inbox")))
		testenv.MustSh(t, q, `test "$(cat processing/job)" = work && rm processing/job && test -f archive/job && test ! -e processing/job`)
		// A heartbeat after the restart extends the lease.
		testenv.MustSh(t, q, `touch processing/job2`)
		fi, err := os.Stat(filepath.Join(q, "processing", "job2"))
		if err != nil {
			t.Fatal(err)
		}
		if dl := time.Until(fi.ModTime()); dl < 290*time.Second || dl > 301*time.Second {
			t.Errorf("lease deadline after touch: in %v, want about 300 s", dl)
		}
		if got := stat(t, q, "acked_total"); got != 1 {
			t.Errorf("acked_total = %v", got)
		}
		if got := stat(t, q, "inflight"); got != 1 {
			t.Errorf("inflight = %v, want 1", got)
		}
	})
}
