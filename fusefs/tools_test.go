package fusefs_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// toolCase is one everyday tool publishing (or editing) through a mount.
// Its key is the tool's row in the "tools that work" table of
// docs/user-guide.md. script runs in the queue directory with $SRC (a
// directory holding m, dir/m and m.zip, whose m has the body below), $WORK
// (scratch space on another filesystem), $BIN (yirangmq), $MNT and $QUEUE.
type toolCase struct {
	key    string
	script string
	run    func(t *testing.T, q string) error // instead of script: a Go program's calls
	code   int                                // wanted exit status; -1: any failure
	name   string                             // the message's name in inbox/ ("" for any one name)
	before string                             // published before the tool runs (editors)
	body   string                             // wanted body, the source's when empty
	state  string                             // where the message ends: inbox (default) or archive
	store  string                             // run on this store only ("" for all)
}

const toolBody = "everyday tools\nsecond line\n"

// toolCases are the tools that must just work. A tool that says it failed
// after it published makes a script retry, and a retry publishes twice: so
// each asserts its exit status and that exactly one message is left.
func toolCases(t *testing.T) []toolCase {
	mkstemp := cProgram(t, "mkstemp-rename", `
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
	char tmp[] = "inbox/msg-XXXXXX";
	int fd = mkstemp(tmp);
	if (fd < 0) { perror("mkstemp"); return 1; }
	FILE *in = fopen(argv[1], "r");
	char buf[4096]; size_t n = fread(buf, 1, sizeof buf, in);
	if (write(fd, buf, n) != (ssize_t)n) { perror("write"); return 1; }
	if (argc > 2) { /* rename while still open, then close */
		if (rename(tmp, "inbox/m")) { perror("rename"); return 1; }
		if (close(fd)) { perror("close"); return 1; }
		return 0;
	}
	if (close(fd)) { perror("close"); return 1; }
	if (rename(tmp, "inbox/m")) { perror("rename"); return 1; }
	return 0;
}`)
	return []toolCase{
		{key: "> inbox/NAME (shell)", script: `cat "$SRC/m" > inbox/m`, name: "m"},
		{key: "cp", script: `cp "$SRC/m" inbox/m`, name: "m"},
		{key: "cp -p", script: `cp -p "$SRC/m" inbox/m`, name: "m"},
		{key: "cp -a dir/. inbox/", script: `cp -a "$SRC/dir/." inbox/`, name: "m"},
		{key: "mv from another filesystem", script: `cp "$SRC/m" "$WORK/m" && mv "$WORK/m" inbox/ && test ! -e "$WORK/m"`, name: "m"},
		{key: "find -exec mv", script: `cp "$SRC/m" "$WORK/m" && find "$WORK" -name m -exec mv {} inbox/ \;`, name: "m"},
		{key: "install -m 644", script: `install -m 644 "$SRC/m" inbox/m`, name: "m"},
		{key: "tee", script: `tee inbox/m < "$SRC/m" > /dev/null`, name: "m"},
		{key: "dd", script: `dd if="$SRC/m" of=inbox/m status=none`, name: "m"},
		{key: "split", script: `split -l 1000 "$SRC/m" inbox/m`, name: "maa"},
		{key: "tar", script: `tar -C "$SRC/dir" -cf - m | tar -C inbox -xf -`, name: "m"},
		{key: "cpio", script: `(cd "$SRC/dir" && echo m | cpio -o --quiet) | (cd inbox && cpio -id --quiet)`, name: "m"},
		{key: "unzip", script: `unzip -q "$SRC/m.zip" -d inbox/`, name: "m"},
		{key: "rsync", script: `rsync "$SRC/m" inbox/m`, name: "m"},
		{key: "rsync -a", script: `set -e
			rsync -a "$SRC/dir/" inbox/
			rsync -a "$SRC/dir/" inbox/
			# a re-run finds the message unchanged: nothing sent (the directory's times aside)
			out=$(rsync -ai "$SRC/dir/" inbox/ | grep -v ' \./$' || true)
			test -z "$out" || { echo "re-run sent: $out" >&2; exit 1; }`, name: "m"},
		{key: "rsync -a --inplace", script: `rsync -a --inplace "$SRC/dir/" inbox/`, name: "m"},
		{key: "perl open/print/close", script: `perl -e 'open(my $i, "<", $ARGV[0]) or die; open(my $o, ">", "inbox/m") or die; print {$o} <$i>; close($o) or die "close: $!"' "$SRC/m"`, name: "m"},
		{key: "python open/write", script: `python3 -c 'import sys; open("inbox/m", "wb").write(open(sys.argv[1], "rb").read())' "$SRC/m"`, name: "m"},
		{key: "python shutil.copy", script: `python3 -c 'import shutil, sys; shutil.copy(sys.argv[1], "inbox/m")' "$SRC/m"`, name: "m"},
		{key: "python shutil.copy2", script: `python3 -c 'import shutil, sys; shutil.copy2(sys.argv[1], "inbox/m")' "$SRC/m"`, name: "m"},
		{key: "python shutil.move", script: `cp "$SRC/m" "$WORK/m" && python3 -c 'import shutil, sys; shutil.move(sys.argv[1], "inbox/m")' "$WORK/m" && test ! -e "$WORK/m"`, name: "m"},
		{key: "python NamedTemporaryFile + os.replace", script: `python3 -c '
import os, sys, tempfile
f = tempfile.NamedTemporaryFile(dir="inbox", delete=False)
f.write(open(sys.argv[1], "rb").read())
f.close()
os.replace(f.name, "inbox/m")' "$SRC/m"`, name: "m"},
		{key: "Go os.WriteFile", run: func(t *testing.T, q string) error {
			return os.WriteFile(filepath.Join(q, "inbox", "m"), []byte(toolBody), 0o644)
		}, name: "m"},
		{key: "Go os.CreateTemp + os.Rename", run: func(t *testing.T, q string) error {
			f, err := os.CreateTemp(filepath.Join(q, "inbox"), "m-*")
			if err != nil {
				return err
			}
			if _, err := f.WriteString(toolBody); err != nil {
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			return os.Rename(f.Name(), filepath.Join(q, "inbox", "m"))
		}, name: "m"},
		{key: "C mkstemp + close + rename", script: mkstemp + ` "$SRC/m"`, name: "m"},
		{key: "C mkstemp + rename + close", script: mkstemp + ` "$SRC/m" rename-first`, name: "m"},
		{key: "yirangmq publish", script: `"$BIN" publish --mount "$MNT" --queue "$QUEUE" --file "$SRC/m"`},
		{key: "yirangmq consume", script: `cp "$SRC/m" inbox/m && export WORK && "$BIN" consume --mount "$MNT" --queue "$QUEUE" --drain -- sh -c 'cat > "$WORK/out"' && cmp "$WORK/out" "$SRC/m"`, name: "m", state: "archive"},
		{key: "sqlite3 -readonly", store: "sqlite", script: `cp "$SRC/m" inbox/m && n=$(sqlite3 -readonly "$STORE/yirangmq.db" "select count(*) from messages where queue = '$QUEUE' and name = 'm'") && test "$n" = 1`, name: "m"},
		{key: "sed -i", before: "original\n", script: `sed -i s/original/edited/ inbox/m`, code: -1, name: "m", body: "original\n"},
		{key: "perl -pi", before: "original\n", script: `perl -pi -e s/original/edited/ inbox/m`, code: -1, name: "m", body: "original\n"},
	}
}

// TestEverydayTools runs every tool of the user guide's table on both
// stores, each in a queue of its own: exit status, exactly one message
// with the right bytes in inbox/, nothing stray in any state directory,
// then or a moment later (an editor's temporary file is held until its
// creator exits).
func TestEverydayTools(t *testing.T) {
	cases := toolCases(t)
	checkToolTable(t, cases)
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "m"), []byte(toolBody), 0o644))
	must(t, os.MkdirAll(filepath.Join(src, "dir"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "dir", "m"), []byte(toolBody), 0o644))
	old := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC) // rsync -a must keep it
	must(t, os.Chtimes(filepath.Join(src, "dir", "m"), old, old))
	testenv.MustSh(t, filepath.Join(src, "dir"), `zip -q ../m.zip m`)
	for _, tool := range []string{"rsync", "cpio", "unzip", "zip", "perl", "python3", "cc", "sqlite3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (.ci/run installs it)", tool)
		}
	}
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		for i, c := range cases {
			if c.store != "" && !strings.HasSuffix(t.Name(), "/"+c.store) {
				continue
			}
			queue := fmt.Sprintf("t%02d", i)
			q := mkq(t, d, queue, "")
			if c.before != "" {
				must(t, os.WriteFile(filepath.Join(q, "inbox", "m"), []byte(c.before), 0o644))
			}
			work := t.TempDir()
			var r testenv.Result
			if c.run != nil {
				if err := c.run(t, q); err != nil {
					r = testenv.Result{Code: 1, Stderr: err.Error()}
				}
			} else {
				r = testenv.Sh(t, q, fmt.Sprintf("SRC=%s WORK=%s BIN=%s MNT=%s QUEUE=%s STORE=%s; %s",
					shq(src), shq(work), shq(testenv.Binary(t)), shq(d.Mountpoint), queue, shq(d.Store), c.script))
			}
			switch {
			case c.code == -1 && r.Code == 0:
				t.Errorf("%s: exit 0, want a failure", c.key)
			case c.code != -1 && r.Code != c.code:
				t.Errorf("%s: exit %d, want %d: %s", c.key, r.Code, c.code, strings.TrimSpace(r.Stderr))
			}
			body := c.body
			if body == "" {
				body = toolBody
			}
			checkOneMessage(t, c.key, q, c.state, c.name, body)
			if c.key == "rsync -a" {
				fi, err := os.Stat(filepath.Join(q, "inbox", "m"))
				if err == nil && !fi.ModTime().Equal(old) {
					t.Errorf("rsync -a: inbox mtime %v, want the source's %v", fi.ModTime(), old)
				}
			}
		}
		// An editor's temporary file, had it been kept, would be committed
		// when its creator exited: look again once they all have.
		time.Sleep(1500 * time.Millisecond)
		for i, c := range cases {
			if c.before != "" {
				checkOneMessage(t, c.key+" (later)", d.Path(fmt.Sprintf("t%02d", i)), c.state, c.name, c.body)
			}
		}
	})
}

// checkOneMessage asserts that the queue holds exactly one message, in
// state directory dir (inbox when empty), with that name (any when empty)
// and body, and nothing in any other state directory.
func checkOneMessage(t *testing.T, what, q, dir, name, body string) {
	t.Helper()
	if dir == "" {
		dir = "inbox"
	}
	for _, other := range []string{"inbox", "processing", "delayed", "dlq", "archive"} {
		if got := ls(t, filepath.Join(q, other)); other != dir && len(got) != 0 {
			t.Errorf("%s: stray %s/%v", what, other, got)
		}
	}
	got := ls(t, filepath.Join(q, dir))
	if len(got) != 1 || (name != "" && got[0] != name) {
		t.Errorf("%s: %s/ holds %q, want exactly one message %q", what, dir, got, name)
		return
	}
	if b := readFile(t, filepath.Join(q, dir, got[0])); b != body {
		t.Errorf("%s: body %q, want %q", what, b, body)
	}
}

// checkToolTable asserts that the table of docs/user-guide.md names every
// tool this test runs, and nothing it does not.
func checkToolTable(t *testing.T, cases []toolCase) {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "docs", "user-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([^`]+)` \\|")
	var doc []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, "<!-- tools table -->"):
			in = true
		case strings.Contains(line, "<!-- end of tools table -->"):
			in = false
		case in:
			if m := row.FindStringSubmatch(line); m != nil {
				doc = append(doc, m[1])
			}
		}
	}
	var keys []string
	for _, c := range cases {
		keys = append(keys, c.key)
	}
	sort.Strings(doc)
	sort.Strings(keys)
	if strings.Join(doc, "\n") != strings.Join(keys, "\n") {
		t.Errorf("docs/user-guide.md tools table lists\n%s\nbut the test runs\n%s", strings.Join(doc, "\n"), strings.Join(keys, "\n"))
	}
}

// cProgram compiles a small C program once per test run.
func cProgram(t *testing.T, name, src string) string {
	t.Helper()
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, name+".c"), []byte(src), 0o644))
	bin := filepath.Join(dir, name)
	if out, err := exec.Command("cc", "-O1", "-Wall", "-o", bin, filepath.Join(dir, name+".c")).CombinedOutput(); err != nil {
		t.Fatalf("cc %s: %v\n%s", name, err, out)
	}
	return bin
}

func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestTempRenameRace: a consumer leasing while producers write to a
// temporary name and rename it sees every message exactly once: either
// under its final name, or under the temporary one when it leased first
// (the producer's rename then fails with ENOENT).
func TestTempRenameRace(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		inbox, processing := filepath.Join(q, "inbox"), filepath.Join(q, "processing")
		const n = 60
		done := make(chan struct{})
		leased := make(chan int, 1)
		go func() { // the consumer: lease whatever inbox/ lists
			count := 0
			defer func() { leased <- count }()
			for {
				names := ls(t, inbox)
				if len(names) == 0 {
					time.Sleep(time.Millisecond) // a consumer polling an empty inbox/, not a wait of the test
				}
				for _, name := range names {
					if os.Rename(filepath.Join(inbox, name), filepath.Join(processing, name)) == nil {
						count++
					}
				}
				select {
				case <-done:
					if len(ls(t, inbox)) == 0 {
						return
					}
				default:
				}
			}
		}()
		lost := 0
		for i := 0; i < n; i++ {
			f, err := os.CreateTemp(inbox, "tmp-*")
			must(t, err)
			fmt.Fprintf(f, "body %d", i)
			must(t, f.Close())
			err = os.Rename(f.Name(), filepath.Join(inbox, fmt.Sprintf("final-%02d", i)))
			switch {
			case err == nil:
			case os.IsNotExist(err):
				lost++ // the consumer leased the temporary name first
			default:
				t.Fatalf("rename %d: %v", i, err)
			}
		}
		close(done)
		if got := <-leased; got != n {
			t.Errorf("consumer leased %d messages, want %d", got, n)
		}
		seen := map[string]bool{}
		for _, name := range ls(t, processing) {
			body := readFile(t, filepath.Join(processing, name))
			if seen[body] {
				t.Errorf("%q delivered twice", body)
			}
			seen[body] = true
		}
		if len(seen) != n {
			t.Errorf("%d distinct bodies in processing/, want %d", len(seen), n)
		}
		t.Logf("%d of %d leased under their temporary name", lost, n)
	})
}

// TestListDots: ls -a lists . and .. in every directory of a mount, as
// the user guide shows.
func TestListDots(t *testing.T) {
	d := testenv.StartDaemon(t, testenv.DaemonOptions{})
	q := mkq(t, d, "jobs", "")
	must(t, os.WriteFile(filepath.Join(q, "inbox", "m"), []byte("x"), 0o644))
	for dir, want := range map[string]string{
		d.Mountpoint:              ". .. .metrics .stats jobs",
		q:                         ". .. .policy .stats archive delayed dlq inbox processing",
		filepath.Join(q, "inbox"): ". .. m",
		filepath.Join(q, "dlq"):   ". ..",
	} {
		got := strings.Fields(testenv.MustSh(t, dir, `LC_ALL=C ls -a`))
		if strings.Join(got, " ") != want {
			t.Errorf("ls -a %s = %q, want %q", dir, got, want)
		}
	}
}

// TestMetadataChanges: the metadata table of docs/contract.md §2, by path
// and by descriptor, on a ready and a leased message and on a state
// directory: accepted changes change nothing, and a chmod never extends a
// lease.
func TestMetadataChanges(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"visibilityTimeoutSec": 600}`)
		p := func(elem ...string) string { return filepath.Join(append([]string{q}, elem...)...) }
		must(t, os.WriteFile(p("inbox", "r"), []byte("ready"), 0o644))
		must(t, os.WriteFile(p("inbox", "l"), []byte("leased"), 0o644))
		must(t, os.Rename(p("inbox", "l"), p("processing", "l")))
		var before, leaseBefore unix.Stat_t
		must(t, unix.Stat(p("inbox", "r"), &before))
		must(t, unix.Stat(p("processing", "l"), &leaseBefore))
		past := []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(1e18)}
		f, err := os.Open(p("inbox", "r"))
		must(t, err)
		defer f.Close()
		for _, c := range []struct {
			what string
			err  error
			want string
		}{
			{"chmod 0600 inbox/r", unix.Chmod(p("inbox", "r"), 0o600), "OK"},
			{"fchmod 0755 inbox/r", unix.Fchmod(int(f.Fd()), 0o755), "OK"},
			{"chown to its owner", unix.Chown(p("inbox", "r"), int(before.Uid), int(before.Gid)), "OK"},
			{"fchown to its owner", unix.Fchown(int(f.Fd()), int(before.Uid), int(before.Gid)), "OK"},
			{"chown to another owner", unix.Chown(p("inbox", "r"), 4242, 4242), "EPERM"},
			{"utimes inbox/r", unix.UtimesNano(p("inbox", "r"), past), "OK"},
			{"truncate inbox/r", unix.Truncate(p("inbox", "r"), 0), "EPERM"},
			{"chmod processing/l", unix.Chmod(p("processing", "l"), 0o600), "OK"},
			{"chmod inbox/", unix.Chmod(p("inbox"), 0o700), "OK"},
			{"utimes inbox/", unix.UtimesNano(p("inbox"), past), "OK"},
			{"chown inbox/ to another owner", unix.Chown(p("inbox"), 4242, 4242), "EPERM"},
		} {
			if got := errName(c.err); got != c.want {
				t.Errorf("%s = %s, want %s", c.what, got, c.want)
			}
		}
		var after, leaseAfter unix.Stat_t
		must(t, unix.Stat(p("inbox", "r"), &after))
		must(t, unix.Stat(p("processing", "l"), &leaseAfter))
		if after.Mode != before.Mode || after.Uid != before.Uid || after.Mtim != before.Mtim || after.Size != 5 {
			t.Errorf("inbox/r changed: mode %o→%o, uid %d→%d, mtime %v→%v, size %d",
				before.Mode, after.Mode, before.Uid, after.Uid, before.Mtim, after.Mtim, after.Size)
		}
		if leaseAfter.Mtim != leaseBefore.Mtim {
			t.Errorf("a chmod moved the lease deadline: %v → %v", leaseBefore.Mtim, leaseAfter.Mtim)
		}
		var dir unix.Stat_t
		must(t, unix.Stat(p("inbox"), &dir))
		if dir.Mode&0o777 != 0o755 {
			t.Errorf("inbox/ mode %o after chmod 0700, want the queue's 0755", dir.Mode&0o777)
		}
		wantOut(t, "inbox/r body", readFile(t, p("inbox", "r")), "ready")
	})
}

// TestEditorTempNeverDelivered: a consumer leasing everything it sees in
// inbox/ while sed -i and perl -pi try to edit a message there never gets
// an editor's temporary file (it would be a second message).
func TestEditorTempNeverDelivered(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		inbox, processing := filepath.Join(q, "inbox"), filepath.Join(q, "processing")
		must(t, os.WriteFile(filepath.Join(inbox, "m"), []byte("original\n"), 0o644))
		done := make(chan struct{})
		stray := make(chan []string, 1)
		go func() { // the consumer: lease whatever is not m
			var got []string
			defer func() { stray <- got }()
			for {
				select {
				case <-done:
					return
				default:
				}
				f, err := os.Open(inbox)
				if err != nil {
					continue
				}
				names, _ := f.Readdirnames(-1)
				f.Close()
				for _, name := range names {
					if name != "m" && os.Rename(filepath.Join(inbox, name), filepath.Join(processing, name)) == nil {
						got = append(got, name)
					}
				}
			}
		}()
		for i := 0; i < 20; i++ {
			if r := testenv.Sh(t, q, `sed -i s/original/edited/ inbox/m`); r.Code == 0 {
				t.Fatalf("sed -i on a message succeeded")
			}
			if r := testenv.Sh(t, q, `perl -pi -e s/original/edited/ inbox/m`); r.Code == 0 {
				t.Fatalf("perl -pi on a message succeeded")
			}
		}
		time.Sleep(time.Second) // a held file would be committed by now
		close(done)
		if got := <-stray; len(got) != 0 {
			t.Errorf("the consumer leased editors' temporary files: %q", got)
		}
		checkOneMessage(t, "after the edits", q, "inbox", "m", "original\n")
	})
}
