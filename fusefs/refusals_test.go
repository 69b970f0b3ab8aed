package fusefs_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// lastRefusals reads QUEUE/.stats: refused_total and last_refusals.
func lastRefusals(t *testing.T, qdir string) (int, []map[string]any) {
	t.Helper()
	var s struct {
		Total int              `json:"refused_total"`
		Last  []map[string]any `json:"last_refusals"`
	}
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(qdir, ".stats"))), &s); err != nil {
		t.Fatal(err)
	}
	return s.Total, s.Last
}

// A rejection is visible without the daemon's log (issue 40): a shell's
// builtin echo ignores the EINVAL of close(2), so the refused message and
// the refused policy exit 0; .stats lists the refusal with its name, errno
// and reason, and .policy reads back with its refusal until a valid one
// is written. A redrive of a message that fails the schema is refused
// (EINVAL) and listed too, and never reaches a consumer.
func TestRefusalsAreVisible(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal"}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "jobs", `{"format": "json", "schema": {"type": "object", "required": ["order"], "properties": {"order": {"type": "number"}}}}`)
		testenv.MustSh(t, q, `echo '{"order": "x"}' > inbox/bad-1`) // exits 0
		total, last := lastRefusals(t, q)
		if total != 1 || len(last) != 1 {
			t.Fatalf(".stats: refused_total %d, last_refusals %v; want the one refusal", total, last)
		}
		r := last[0]
		if r["name"] != "bad-1" || r["errno"] != "EINVAL" || !strings.Contains(fmt.Sprint(r["reason"]), "schema") || r["at"] == "" {
			t.Errorf("refusal %v, want bad-1, EINVAL, the schema's reason and a time", r)
		}
		wantNames(t, "dlq", ls(t, filepath.Join(q, "dlq")), "bad-1")
		// MOUNT/.stats, which every user of the mount reads, counts the
		// refusals of each queue but does not name them: QUEUE/.stats is
		// behind the queue directory's permissions.
		root := readFile(t, d.Path(".stats"))
		if strings.Contains(root, "last_refusals") || strings.Contains(root, "bad-1") || !strings.Contains(root, `"refused_total": 1`) {
			t.Errorf("MOUNT/.stats lists refusals, or does not count them:\n%s", root)
		}

		// A policy refused at a close nobody checks.
		testenv.MustSh(t, q, `echo '{"visibilityTimeoutSec": "abc"}' > .policy`)
		var p map[string]any
		if err := json.Unmarshal([]byte(readFile(t, filepath.Join(q, ".policy"))), &p); err != nil {
			t.Fatal(err)
		}
		if p["visibilityTimeoutSec"] != 30.0 {
			t.Errorf("visibilityTimeoutSec = %v after a refused policy, want 30", p["visibilityTimeoutSec"])
		}
		refused, _ := p["lastRefused"].(map[string]any)
		if refused["errno"] != "EINVAL" || !strings.Contains(fmt.Sprint(refused["reason"]), "visibilityTimeoutSec") {
			t.Errorf(".policy lastRefused = %v, want EINVAL naming visibilityTimeoutSec", p["lastRefused"])
		}
		if _, last = lastRefusals(t, q); last[0]["name"] != ".policy" {
			t.Errorf("newest refusal %v, want the .policy", last[0])
		}

		// The redrive of the invalid message: EINVAL, which GNU mv
		// (after trying rename(2) again without RENAME_NOREPLACE) calls
		// a move into a subdirectory of itself.
		if err := unix.Rename(filepath.Join(q, "dlq", "bad-1"), filepath.Join(q, "inbox", "bad-1")); err != unix.EINVAL {
			t.Errorf("rename dlq/bad-1 inbox/: %v, want EINVAL", err)
		}
		if r2 := testenv.Sh(t, q, `mv dlq/bad-1 inbox/`); r2.Code == 0 {
			t.Errorf("mv dlq/bad-1 inbox/ succeeded")
		}
		wantNames(t, "dlq after the redrive", ls(t, filepath.Join(q, "dlq")), "bad-1")
		fd, err := unix.Open(filepath.Join(q, ".next"), unix.O_RDONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 512)
		n, err := unix.Read(fd, buf)
		unix.Close(fd)
		if err != unix.EAGAIN {
			t.Errorf("a consumer's .next after the redrive: %q, %v; want EAGAIN", buf[:max(n, 0)], err)
		}
		total, last = lastRefusals(t, q)
		if total < 4 || last[0]["name"] != "bad-1" || last[0]["errno"] != "EINVAL" || !strings.Contains(fmt.Sprint(last[0]["reason"]), "validation") {
			t.Errorf("after the redrives: %d refusals, newest %v; want 4 or more, bad-1 refused for its validation", total, last[0])
		}

		// A valid policy: the refusal no longer shows in .policy (it
		// stays among the queue's last refusals).
		testenv.MustSh(t, q, `echo '{"format": "json"}' > .policy`)
		if strings.Contains(readFile(t, filepath.Join(q, ".policy")), "lastRefused") {
			t.Errorf(".policy still shows the refusal after a valid policy was written")
		}
	})
}

// Refusals of bad input are rate-limited per kind and per uid: a flood of
// refused operations (a stress tool wrote 14,300 lines in 3 s, issue 40)
// leaves the log small, and another user's refusal in the middle of it
// still gets its line.
func TestRefusalFloodKeepsTheLogSmall(t *testing.T) {
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Sync: "normal", Args: []string{"-o", "allow_other"}})
	openPath(t, d)
	q := mkq(t, d, "q", "")
	if err := unix.Chmod(q, 0o777); err != nil {
		t.Fatal(err)
	}
	testenv.MustSh(t, q, `echo m > inbox/m`)
	before := len(d.Log())
	const rounds = 3000
	kinds := []struct {
		what string
		op   func(i int) error
	}{
		{"create in processing/", func(i int) error {
			fd, err := unix.Open(filepath.Join(q, "processing", fmt.Sprint("x", i)), unix.O_CREAT|unix.O_WRONLY, 0o644)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"open a message for writing", func(int) error {
			fd, err := unix.Open(filepath.Join(q, "inbox", "m"), unix.O_WRONLY, 0)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"create at the top", func(i int) error {
			fd, err := unix.Open(filepath.Join(d.Mountpoint, fmt.Sprint("f", i)), unix.O_CREAT|unix.O_WRONLY, 0o644)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"mkdir of a bad queue name", func(i int) error { return unix.Mkdir(filepath.Join(d.Mountpoint, fmt.Sprint("a b", i)), 0o755) }},
		{"rename to another name", func(i int) error {
			return unix.Rename(filepath.Join(q, "inbox", "m"), filepath.Join(q, "dlq", fmt.Sprint("n", i)))
		}},
	}
	for _, k := range kinds {
		for i := range rounds {
			if err := k.op(i); err == nil {
				t.Fatalf("%s: accepted", k.what)
			}
		}
	}
	// Another user, in the middle of the flood.
	if r := asUser(t, nobody, q, `if echo x > processing/other; then exit 1; fi`); r.Code != 0 {
		t.Fatalf("create in processing/ as nobody: %d %s", r.Code, r.Stderr)
	}
	testenv.MustRetryUntil(t, 5*time.Second, "the line of the other user's refusal", func() bool {
		return strings.Contains(d.Log()[before:], fmt.Sprintf("uid=%d", nobody))
	})
	log := d.Log()[before:]
	lines := strings.Count(log, "\n")
	t.Logf("%d refused operations of %d kinds (and one of another user) wrote %d log lines, %d bytes", rounds*len(kinds), len(kinds), lines, len(log))
	// A burst of 5 per kind and uid, and at most one more per 10 s each.
	if limit := (len(kinds) + 1) * 10; lines > limit {
		t.Errorf("%d log lines for %d refusals of %d kinds, want at most %d:\n%.3000s", lines, rounds*len(kinds), len(kinds), limit, log)
	}
	if total, _ := lastRefusals(t, q); total < 3*rounds {
		t.Errorf("refused_total %d, want every refusal of the queue counted (%d and more)", total, 3*rounds)
	}
}
