// Package byhand tests the fs store the way a person uses it: the daemon
// stopped, the store's tree read with ls, cat and getfattr and changed
// with mv, cp, rm and a shell's redirections, the daemon started again
// and every change checked through the mount.
package byhand

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"yirangmq/testenv"
)

func TestMain(m *testing.M) {
	testenv.CleanLeftoverMounts()
	os.Exit(m.Run())
}

// fill makes queue q (and other) through the mount: 10 ready, 5 leased, 3
// dead letters (one with a reason its consumer set), 2 acked into the
// archive.
func fill(t *testing.T, d *testenv.Daemon) {
	t.Helper()
	testenv.MustSh(t, d.Mountpoint, `
		mkdir q other
		for i in 00 01 02 03 04 05 06 07 08 09 10 11 12 13 14 15 16 17 18 19; do
			printf 'body of m%s\n' $i > q/inbox/m$i
		done
		for i in 00 01 02 03 04; do mv q/inbox/m$i q/processing/; done
		mv q/inbox/m05 q/processing/
		setfattr -n user.yirangmq.reason -v BAD_INPUT q/processing/m05
		setfattr -n user.yirangmq.reason_message -v 'field x missing' q/processing/m05
		mv q/processing/m05 q/dlq/
		mv q/inbox/m06 q/dlq/
		mv q/inbox/m07 q/dlq/
		for i in 08 09; do mv q/inbox/m$i q/processing/ && rm q/processing/m$i; done
	`)
}

// TestChangesByHand stops the daemon, changes the store's tree as a person
// would, starts the daemon again and checks each change through the mount.
func TestChangesByHand(t *testing.T) {
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "fs"})
	fill(t, d)
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	qs := filepath.Join(d.Store, "queues")

	// The tree at rest says everything, readable with standard tools.
	got := testenv.MustSh(t, qs, `getfattr -n user.yirangmq.reason --only-values q/dlq/m05; echo
		getfattr -n user.yirangmq.reason_message --only-values q/dlq/m05; echo
		getfattr -d q/dlq/m06
		cat q/processing/m03
		ls q/inbox q/processing q/dlq q/archive | tr '\n' ' '`)
	for _, want := range []string{"BAD_INPUT\nfield x missing\n", `user.yirangmq.reason="MANUAL"`, `user.yirangmq.state="dlq"`,
		"body of m03", "m10 m11", "m00 m01 m02 m03 m04", "m05 m06 m07", "m08 m09"} {
		if !strings.Contains(got, want) {
			t.Errorf("the stopped tree does not show %q:\n%s", want, got)
		}
	}

	testenv.MustSh(t, qs, `
		mv q/dlq/m05 q/inbox/                            # redrive
		mv q/processing/m00 q/inbox/                     # give back
		mv q/inbox/m18 q/dlq/                            # dead-letter
		printf 'written by hand\n' > q/inbox/hand-1      # publish
		cp q/archive/m08 q/inbox/m08-again               # a plain copy: a publish
		cp -a q/archive/m09 q/inbox/m09-again            # a copy with its attributes
		mv q/archive/m08 q/inbox/                        # replay
		rm q/inbox/m19                                   # delete
		mv q/inbox/m17 other/inbox/                      # forward
		printf 'edited by hand\n' > q/inbox/m16          # a new body
		setfattr -n user.yirangmq.priority -v 7 q/inbox/m15
		mkdir q/inbox/a-directory                        # cannot be a message
		printf 'x' > q/inbox/.hidden                     # a name the mount refuses
		printf 'x' > not-a-queue                         # a file where queues are
	`)
	d.Restart(t)

	// Each change, seen through the mount.
	out := testenv.MustSh(t, d.Mountpoint, `
		ls -f q/inbox | grep -v '^\.' | head -1
		ls q/inbox | tr '\n' ' '; echo
		ls q/processing | tr '\n' ' '; echo
		ls q/dlq | tr '\n' ' '; echo
		ls other/inbox | tr '\n' ' '; echo
		cat q/inbox/hand-1 q/inbox/m16 other/inbox/m17 q/inbox/m08-again q/inbox/m09-again
		getfattr -n user.yirangmq.attempts --only-values q/inbox/m05; echo
		getfattr -n user.yirangmq.redrives --only-values q/inbox/m05; echo
		getfattr -n user.yirangmq.reason --only-values q/dlq/m18; echo
	`)
	lines := strings.Split(out, "\n")
	want := []string{
		"m15", // priority 7: first in line
		"hand-1 m00 m05 m08 m08-again m09-again m10 m11 m12 m13 m14 m15 m16 ",
		"m01 m02 m03 m04 ",
		"m06 m07 m18 ",
		"m17 ",
		"written by hand", "edited by hand", "body of m17", "body of m08", "body of m09",
		"0", "1", "MANUAL",
	}
	for i, w := range want {
		if i >= len(lines) || lines[i] != w {
			t.Errorf("line %d through the mount: %q, want %q\n%s", i, at(lines, i), w, out)
		}
	}
	for _, p := range []string{"q/inbox/m19", "q/inbox/m18", "q/inbox/m17", "q/processing/m00"} {
		if _, err := os.Lstat(d.Path(p)); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", p, err)
		}
	}
	// What cannot be a message went to lost+found, each said in the log.
	lf := filepath.Join(d.Store, "lost+found")
	for _, p := range []string{"q/inbox/a-directory", "q/inbox/.hidden", "not-a-queue"} {
		if _, err := os.Lstat(filepath.Join(lf, p)); err != nil {
			t.Errorf("lost+found/%s: %v", p, err)
		}
	}
	log := d.Log()
	for _, w := range []string{
		`msg="moved to lost+found"`,
		`msg="took from the tree what was changed by hand while the daemon was stopped"`,
		"redriven=1", "given_back=1", "dead_lettered=1", "published=2", "deleted=1", "forwarded=1", "replayed=1", "copied_and_published=1",
	} {
		if !strings.Contains(log, w) {
			t.Errorf("the daemon's log lacks %q:\n%s", w, log)
		}
	}
	if regexp.MustCompile(`level=ERROR.*m19|lost.*m19`).MatchString(log) {
		t.Errorf("the delete by hand is logged as a loss:\n%s", log)
	}
	if !regexp.MustCompile(`level=INFO msg="took a change made by hand" change=deleted queue=q state=inbox name=m19`).MatchString(log) {
		t.Errorf("the delete by hand is not logged at INFO:\n%s", log)
	}

	// A consumer gets the redriven and the published messages.
	testenv.MustSh(t, d.Mountpoint, `
		m=$(cat q/.next); test "$m" = processing/m15
		test "$(cat q/$m)" = 'body of m15'
		rm q/$m
	`)

	// The tree says what the daemon took: a second start finds nothing
	// changed by hand.
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	d.Restart(t) // its log is the new start's alone
	if strings.Contains(d.Log(), "took from the tree") || !strings.Contains(d.Log(), "fs store opened") {
		t.Errorf("the second start took changes again:\n%s", d.Log())
	}
}

func at(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(none)"
}

// TestCopyOfStoppedStore copies a stopped store with cp -a and with
// rsync -aX, mounts each copy and checks that it shows the same queues,
// messages, bodies and metadata as the original.
func TestCopyOfStoppedStore(t *testing.T) {
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "fs"})
	fill(t, d)
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	testenv.MustSh(t, dir, fmt.Sprintf(`cp -a %[1]q cp-copy && rsync -aX %[1]q/ rsync-copy/`, d.Store))
	d.Restart(t)
	// The original first, then each copy: listings, bodies and the
	// metadata the mount shows (times of the lease aside, which the
	// clock moves) must be the same.
	view := func(mnt string) string {
		return testenv.MustSh(t, mnt, `
			for f in $(ls -d */*/* | sort); do
				printf '%s ' "$f"; cat "$f"
				getfattr -d -m 'user.yirangmq.(id|attempts|reason|reason_message|redrives|published_at)$' "$f" 2>/dev/null | grep -v '^#' | sort
			done`)
	}
	orig := view(d.Mountpoint)
	if !strings.Contains(orig, "q/dlq/m05 body of m05") || !strings.Contains(orig, `reason="BAD_INPUT"`) {
		t.Fatalf("the original store does not show its messages:\n%s", orig)
	}
	for _, c := range []string{"cp-copy", "rsync-copy"} {
		cd := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "fs", Store: filepath.Join(dir, c)})
		if got := view(cd.Mountpoint); got != orig {
			t.Errorf("the %s shows:\n%s\nthe original:\n%s", c, got, orig)
		}
		if strings.Contains(cd.Log(), "took from the tree") {
			t.Errorf("the %s was taken for a store changed by hand:\n%s", c, cd.Log())
		}
	}
}

// TestChangesByHandAfterCrash kills the daemon with SIGKILL, changes the
// tree while it is down, and starts it again: the changes are honoured as
// after a clean stop (nothing of the daemon's undoes them), and nothing
// committed is lost. A removal cannot be told from a message never there
// without the manifest of a clean stop: it is not counted as a delete.
func TestChangesByHandAfterCrash(t *testing.T) {
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "fs"})
	fill(t, d)
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	qs := filepath.Join(d.Store, "queues")
	testenv.MustSh(t, qs, `
		mv q/dlq/m06 q/inbox/
		rm q/inbox/m11
		printf 'after the crash\n' > q/inbox/late
	`)
	d.Restart(t)
	out := testenv.MustSh(t, d.Mountpoint, `ls q/inbox | tr '\n' ' '; echo; ls q/dlq | tr '\n' ' '; echo; cat q/inbox/late`)
	want := "late m06 m10 m12 m13 m14 m15 m16 m17 m18 m19 \nm05 m07 \nafter the crash\n"
	if out != want {
		t.Errorf("after the crash and the changes by hand:\n%s\nwant\n%s", out, want)
	}
	log := d.Log()
	for _, w := range []string{"redriven=1", "published=1"} {
		if !strings.Contains(log, w) {
			t.Errorf("the daemon's log lacks %q:\n%s", w, log)
		}
	}
	if strings.Contains(log, "deleted=") {
		t.Errorf("a removal after a crash counted as a delete (there is no manifest to tell):\n%s", log)
	}
}
