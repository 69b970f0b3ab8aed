package fusefs_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/backends/disk"
	"yirangmq/queuecore"
	"yirangmq/testenv"
)

// Hostile input through the mount (docs/contract.md §8): names, policies and
// messages are untrusted; a bad one gets a clear errno and a log line,
// never a crash, never a path outside the store. One daemon per store takes
// the whole table, then must still be alive and consistent.

// errName is the errno of a system call as its name, "OK" without error.
func errName(err error) string {
	if err == nil {
		return "OK"
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return err.Error()
}

// rawPublish creates, writes and closes path with plain system calls and
// returns the errno of each step ("" for a step not taken). A failed write
// stops the writing; the close is always done.
func rawPublish(path string, body []byte) (open, write, close string) {
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return errName(err), "", ""
	}
	var werr error
	for len(body) > 0 {
		n, err := unix.Write(fd, body[:min(len(body), 64<<10)])
		if err != nil {
			werr = err
			break
		}
		body = body[n:]
	}
	return "OK", errName(werr), errName(unix.Close(fd))
}

// rawWritePolicy replaces a queue's policy the way `cat doc > .policy` does.
func rawWritePolicy(path string, doc []byte) (write, close string) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
	if err != nil {
		return "open " + errName(err), ""
	}
	var werr error
	for len(doc) > 0 {
		n, err := unix.Write(fd, doc[:min(len(doc), 64<<10)])
		if err != nil {
			werr = err
			break
		}
		doc = doc[n:]
	}
	return errName(werr), errName(unix.Close(fd))
}

var allDirs = []string{"inbox", "processing", "delayed", "dlq", "archive"}

func TestHostile(t *testing.T) {
	// The per-uid and per-queue reader caps are lifted so that
	// hostileNextReaders reaches the total cap (they have TestMultiUser).
	opts := testenv.DaemonOptions{Args: []string{"--max-next-readers-per-uid", "2048", "--max-next-readers-per-queue", "2048"}}
	eachBackend(t, opts, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		mkq(t, d, "q2", "")
		t.Run("QueueNames", func(t *testing.T) { hostileQueueNames(t, d) })
		t.Run("MessageNames", func(t *testing.T) { hostileMessageNames(t, d, q) })
		t.Run("Traversal", func(t *testing.T) { hostileTraversal(t, d, q) })
		t.Run("Operations", func(t *testing.T) { hostileOperations(t, d, q) })
		t.Run("Policies", func(t *testing.T) { hostilePolicies(t, d) })
		t.Run("JSONMessages", func(t *testing.T) { hostileJSONMessages(t, d) })
		t.Run("NextReaders", func(t *testing.T) { hostileNextReaders(t, d) })
		if t.Failed() {
			return
		}
		// After the whole table: the daemon lives, serves, never panicked,
		// and every message is in exactly one place.
		if err := syscall.Kill(d.Pid(), 0); err != nil {
			t.Fatalf("daemon pid %d is gone: %v", d.Pid(), err)
		}
		testenv.MustSh(t, q, `echo alive > inbox/alive && m=$(cat .next) && test "$m" = processing/alive && test "$(cat $m)" = alive && rm $m && test -f archive/alive`)
		if strings.Contains(strings.ToLower(d.Log()), "panic") {
			t.Errorf("the daemon log mentions a panic")
		}
		checkConsistent(t, d)
		checkNothingOutside(t, d)
	})
}

// hostileQueueNames: mkdir at the top of the mount takes 1–128 of
// [A-Za-z0-9._-] not starting with '.', nothing else.
func hostileQueueNames(t *testing.T, d *testenv.Daemon) {
	cases := []struct{ name, want string }{
		{".", "EEXIST"}, // the kernel: . and .. always exist
		{"..", "EEXIST"},
		{".hidden", "EINVAL"},
		{"...", "EINVAL"},
		{"a b", "EINVAL"},
		{"\x01", "EINVAL"},
		{"a\nb", "EINVAL"},
		{"a\tb", "EINVAL"},
		{"\xff\xfe", "EINVAL"},
		{"ünï", "EINVAL"},
		{"a:b", "EINVAL"},
		{`a\b`, "EINVAL"},
		{strings.Repeat("q", 129), "EINVAL"},
		{strings.Repeat("q", 256), "ENAMETOOLONG"},
		{strings.Repeat("q", 4096), "ENAMETOOLONG"},
		{"nosuch/x", "ENOENT"}, // a '/' is a path to the kernel
		{"q/inbox/x", "EPERM"}, // no directory inside a state directory
		{"q/x", "EPERM"},       // nor beside them
		{".stats", "EEXIST"},   // the pseudo-files are there
		{strings.Repeat("q", 128), "OK"},
		{"-._", "OK"},
		{"q2/inbox/../../made-by-dotdot", "OK"}, // the kernel resolves .. to the top: a queue
	}
	before := len(d.Log())
	for _, c := range cases {
		err := unix.Mkdir(d.Mountpoint+"/"+c.name, 0o755) // no filepath.Join: it cleans
		if got := errName(err); got != c.want {
			t.Errorf("mkdir %q = %s, want %s", trunc(c.name), got, c.want)
		}
	}
	if got := sorted(ls(t, d.Mountpoint)); !sameSet(got, []string{".stats", ".metrics", "q", "q2", strings.Repeat("q", 128), "-._", "made-by-dotdot"}) {
		t.Errorf("the top of the mount holds %q", got)
	}
	// The log reaches the test through a pipe: give the last lines time.
	// (A CI run under load once counted 0 here.) Refusals of one kind by
	// one user are rate-limited: a burst of 5, then one per 10 s.
	testenv.MustRetryUntil(t, 5*time.Second, "a burst of log lines about refused mkdirs (5)", func() bool {
		return strings.Count(d.Log()[before:], "mkdir refused") >= 5
	})
	for _, name := range []string{strings.Repeat("q", 128), "-._", "made-by-dotdot"} {
		if err := os.Remove(d.Path(name)); err != nil {
			t.Errorf("rmdir %q: %v", trunc(name), err)
		}
	}
}

// hostileMessageNames: message names are any POSIX name (no '/', no NUL,
// 1–255 bytes) not starting with '.', so control characters and bytes that
// are not UTF-8 are accepted; they must round-trip through every step and
// a restart of the daemon.
func hostileMessageNames(t *testing.T, d *testenv.Daemon, q string) {
	inbox := filepath.Join(q, "inbox")
	refused := []struct{ name, want string }{
		{"", "EISDIR"},       // the kernel: "inbox/" is the directory itself
		{".", "EEXIST"},      // the kernel: inbox/. exists
		{"..", "EEXIST"},     // the kernel: inbox/.. is the queue directory
		{"...", "EINVAL"},    // a draft of no name
		{"....", "EINVAL"},   // likewise
		{"a/b", "ENOENT"},    // a '/' is a path: inbox/a does not exist
		{"a\x00b", "EINVAL"}, // Go refuses a NUL before the system call; C stops at it
		{strings.Repeat("n", 256), "ENAMETOOLONG"},
		{strings.Repeat("n", 4096), "ENAMETOOLONG"},
		{strings.Repeat("\xff", 300), "ENAMETOOLONG"},
	}
	for _, c := range refused {
		if got, _, _ := rawPublish(inbox+"/"+c.name, []byte("x")); got != c.want { // no filepath.Join: it cleans
			t.Errorf("create inbox/%q = %s, want %s", trunc(c.name), got, c.want)
		}
	}
	accepted := []string{
		"\x01", "a\nb", "a\tb", "\r", "\x7f", "\x1b[31mred", "\xff\xfe", "\xc3", "\xed\xa0\x80", // control, not UTF-8, surrogate
		"ünïcödé", "日本語", "sp ace", " lead", "trail ", `back\slash`, "*?[x]", "-rf", "$(reboot)", "`id`", "a:b", "a;b", "'\"",
		"~", "a..b", "x.", "%s%n", `a\..\..`, strings.Repeat("n", queuecore.MaxMessageName), strings.Repeat("\xff", queuecore.MaxMessageName),
	}
	body := func(i int) []byte { return []byte(fmt.Sprintf("body %d of a hostile name\n", i)) }
	for i, name := range accepted {
		if o, w, c := rawPublish(filepath.Join(inbox, name), body(i)); o+w+c != "OKOKOK" {
			t.Fatalf("publish inbox/%q: open=%s write=%s close=%s", trunc(name), o, w, c)
		}
	}
	check := func(dir string) {
		t.Helper()
		got := sorted(ls(t, filepath.Join(q, dir)))
		if !sameSet(got, accepted) {
			t.Fatalf("%s lists %q, want %q", dir, got, sorted(accepted))
		}
		for i, name := range accepted {
			b, err := os.ReadFile(filepath.Join(q, dir, name))
			if err != nil || string(b) != string(body(i)) {
				t.Fatalf("read %s/%q = %q, %v", dir, trunc(name), b, err)
			}
		}
	}
	check("inbox")
	// The store keeps the names as they are across a restart.
	d.Stop()
	d.Restart(t)
	check("inbox")
	for _, name := range accepted {
		if err := unix.Rename(filepath.Join(inbox, name), filepath.Join(q, "processing", name)); err != nil {
			t.Fatalf("mv inbox/%q processing/: %v", trunc(name), err)
		}
	}
	check("processing")
	wantNames(t, "inbox after the leases", ls(t, inbox))
	for _, name := range accepted {
		if err := unix.Unlink(filepath.Join(q, "processing", name)); err != nil {
			t.Fatalf("rm processing/%q: %v", trunc(name), err)
		}
	}
	check("archive")
	for _, name := range accepted {
		if err := unix.Unlink(filepath.Join(q, "archive", name)); err != nil {
			t.Fatalf("rm archive/%q: %v", trunc(name), err)
		}
	}
	for _, dir := range allDirs {
		wantNames(t, dir, ls(t, filepath.Join(q, dir)))
	}
	// A hostile name committed through a draft rename.
	if o, w, c := rawPublish(filepath.Join(inbox, ".draft"), []byte("drafted")); o+w+c != "OKOKOK" {
		t.Fatalf("draft: %s %s %s", o, w, c)
	}
	if got := errName(unix.Rename(filepath.Join(inbox, ".draft"), filepath.Join(inbox, "..."))); got != "EPERM" {
		t.Errorf("commit a draft as \"...\" = %s, want EPERM", got)
	}
	if got := errName(unix.Rename(filepath.Join(inbox, ".draft"), filepath.Join(inbox, "dr\naft\xff"))); got != "OK" {
		t.Fatalf("commit a draft as a hostile name = %s", got)
	}
	if got := readFile(t, filepath.Join(inbox, "dr\naft\xff")); got != "drafted" {
		t.Errorf("committed draft reads %q", got)
	}
	if err := unix.Unlink(filepath.Join(inbox, "dr\naft\xff")); err != nil {
		t.Fatal(err)
	}
}

// hostileTraversal: relative paths with .. are resolved by the kernel and
// can only reach the mount's own directories, where creating anything but
// a message in inbox/ is EPERM.
func hostileTraversal(t *testing.T, d *testenv.Daemon, q string) {
	cases := []struct{ path, want string }{
		{"inbox/../x", "EPERM"},            // the queue directory
		{"inbox/../../x", "EPERM"},         // the top of the mount
		{"inbox/../processing/x", "EPERM"}, // another state directory
		{"inbox/../archive/x", "EPERM"},
		{"inbox/../dlq/../delayed/x", "EPERM"},
		{"inbox/../.policy", "EEXIST"}, // O_EXCL on a pseudo-file
		{"inbox/../../.stats", "EEXIST"},
		{"inbox/../.next/x", "ENOTDIR"},
		{"inbox/nosuch/../x", "ENOENT"},    // the kernel walks nosuch first
		{"inbox/./dot-slash", "OK"},        // inbox/dot-slash
		{"inbox/../../q2/inbox/hop", "OK"}, // a publish in q2, by path
	}
	for _, c := range cases {
		if got, _, _ := rawPublish(q+"/"+c.path, []byte("t")); got != c.want { // no filepath.Join: it cleans
			t.Errorf("create %s = %s, want %s", c.path, got, c.want)
		}
	}
	wantNames(t, "q/inbox", sorted(ls(t, filepath.Join(q, "inbox"))), "dot-slash")
	wantNames(t, "q2/inbox", ls(t, d.Path("q2", "inbox")), "hop")
	testenv.MustSh(t, q, `rm inbox/dot-slash ../q2/inbox/hop`)
}

// hostileOperations: renames across queues and into states the table does
// not have, link, symlink, mknod, opening a committed message to append or
// truncate, and xattrs nobody knows.
func hostileOperations(t *testing.T, d *testenv.Daemon, q string) {
	p := func(elem ...string) string { return filepath.Join(append([]string{q}, elem...)...) }
	q2 := d.Path("q2")
	testenv.MustSh(t, q, `
		for m in r l dl ar; do echo $m > inbox/$m; done
		mv inbox/l processing/ && mv inbox/dl dlq/ && mv inbox/ar processing/ && rm processing/ar && test -f archive/ar
	`)
	renames := []struct{ from, to, want string }{
		{p("inbox", "r"), filepath.Join(q2, "inbox", "r"), "EPERM"}, // across queues, not from processing
		{p("inbox", "r"), filepath.Join(q2, "processing", "r"), "EPERM"},
		{p("processing", "l"), filepath.Join(q2, "processing", "l"), "EPERM"}, // only processing → OTHER/inbox forwards
		{p("dlq", "dl"), filepath.Join(q2, "dlq", "dl"), "EPERM"},
		{p("inbox", "r"), p("archive", "r"), "EPERM"},
		{p("inbox", "r"), p("delayed", "r"), "EPERM"},
		{p("processing", "l"), p("archive", "l"), "EPERM"},
		{p("processing", "l"), p("delayed", "l"), "EPERM"},
		{p("dlq", "dl"), p("processing", "dl"), "EPERM"},
		{p("dlq", "dl"), p("archive", "dl"), "EPERM"},
		{p("archive", "ar"), p("processing", "ar"), "EPERM"},
		{p("archive", "ar"), p("dlq", "ar"), "EPERM"},
		{p("inbox", "r"), p("inbox", "l"), "EEXIST"},                // a ready message may be renamed, never onto another
		{p("processing", "l"), p("processing", "renamed"), "EPERM"}, // a leased one keeps its name
		{p("inbox", "r"), p("processing", "renamed"), "EPERM"},
		{p("inbox", "r"), p("inbox", ".r"), "EPERM"},
		{p("inbox", "r"), p("r"), "EPERM"},      // into the queue directory
		{p("inbox", "r"), d.Path("r"), "EPERM"}, // to the top
		{p("inbox", "r"), p("inbox", strings.Repeat("r", 256)), "ENAMETOOLONG"},
		{p("inbox"), p("inbox2"), "EPERM"}, // state directories stay
		{p(".policy"), p("inbox", "policy"), "EPERM"},
		{q, d.Path("q3"), "EPERM"}, // queues keep their name
		{p("inbox", "nosuch"), p("processing", "nosuch"), "ENOENT"},
		{p("inbox", "r"), p("inbox", "renamed"), "OK"},      // the temp-then-rename idiom, and back
		{p("inbox", "renamed"), p("inbox", "\xff\n"), "OK"}, // any name a create accepts
		{p("inbox", "\xff\n"), p("inbox", "r"), "OK"},
	}
	for _, c := range renames {
		if got := errName(unix.Rename(c.from, c.to)); got != c.want {
			t.Errorf("rename %s → %s = %s, want %s", rel(d, c.from), rel(d, c.to), got, c.want)
		}
	}
	for _, c := range []struct {
		what string
		err  error
		want string
	}{
		{"link inbox/r inbox/r2", unix.Link(p("inbox", "r"), p("inbox", "r2")), "EPERM"},
		{"link inbox/r processing/r", unix.Link(p("inbox", "r"), p("processing", "r")), "EPERM"},
		{"link inbox/r q2/inbox/r", unix.Link(p("inbox", "r"), filepath.Join(q2, "inbox", "r")), "EPERM"},
		{"symlink in inbox/", unix.Symlink("/etc/passwd", p("inbox", "sym")), "EPERM"},
		{"symlink in processing/", unix.Symlink("../inbox/r", p("processing", "sym")), "EPERM"},
		{"symlink in the queue", unix.Symlink("inbox", p("sym")), "EPERM"},
		{"symlink at the top", unix.Symlink("/", d.Path("sym")), "EPERM"},
		{"mknod fifo in inbox/", unix.Mknod(p("inbox", "fifo"), unix.S_IFIFO|0o644, 0), "EPERM"},
		{"mknod fifo in the queue", unix.Mknod(p("fifo"), unix.S_IFIFO|0o644, 0), "EPERM"},
		{"mknod fifo at the top", unix.Mknod(d.Path("fifo"), unix.S_IFIFO|0o644, 0), "EPERM"},
		{"mknod socket in inbox/", unix.Mknod(p("inbox", "sock"), unix.S_IFSOCK|0o644, 0), "EPERM"},
		{"mknod char device in inbox/", unix.Mknod(p("inbox", "null"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3))), "EPERM"},
		{"mkdir in inbox/", unix.Mkdir(p("inbox", "sub"), 0o755), "EPERM"},
		{"truncate inbox/r", unix.Truncate(p("inbox", "r"), 0), "EPERM"},
		{"truncate processing/l", unix.Truncate(p("processing", "l"), 1), "EPERM"},
		{"chmod inbox/r (accepted, ignored)", unix.Chmod(p("inbox", "r"), 0o777), "OK"},
		{"chown inbox/r", unix.Chown(p("inbox", "r"), 1, 1), "EPERM"},
		{"setxattr user.foo", unix.Setxattr(p("inbox", "r"), "user.foo", []byte("1"), 0), "ENOTSUP"},
		{"setxattr user.yirangmq.bogus", unix.Setxattr(p("inbox", "r"), "user.yirangmq.bogus", []byte("1"), 0), "ENOTSUP"},
		{"setxattr user.yirangmq. (empty key)", unix.Setxattr(p("inbox", "r"), "user.yirangmq.", []byte("1"), 0), "ENOTSUP"},
		{"setxattr user.yirangmq.\\n", unix.Setxattr(p("processing", "l"), "user.yirangmq.\n", []byte("1"), 0), "ENOTSUP"},
		{"setxattr trusted.x", unix.Setxattr(p("inbox", "r"), "trusted.x", []byte("1"), 0), "ENOTSUP"},
		{"setxattr user.yirangmq.id (read-only)", unix.Setxattr(p("inbox", "r"), "user.yirangmq.id", []byte("1"), 0), "EPERM"},
		{"removexattr user.yirangmq.attempts", unix.Removexattr(p("inbox", "r"), "user.yirangmq.attempts"), "EPERM"},
	} {
		if got := errName(c.err); got != c.want {
			t.Errorf("%s = %s, want %s", c.what, got, c.want)
		}
	}
	for _, c := range []struct {
		path  string
		flags int
	}{
		{p("inbox", "r"), unix.O_WRONLY | unix.O_APPEND},
		{p("inbox", "r"), unix.O_RDWR | unix.O_APPEND},
		{p("inbox", "r"), unix.O_WRONLY | unix.O_TRUNC},
		{p("inbox", "r"), unix.O_RDONLY | unix.O_TRUNC},
		{p("inbox", "r"), unix.O_RDWR},
		{p("inbox", "r"), unix.O_WRONLY | unix.O_CREAT}, // cp onto it
		{p("processing", "l"), unix.O_WRONLY | unix.O_APPEND},
		{p("processing", "l"), unix.O_WRONLY | unix.O_TRUNC | unix.O_CREAT},
		{p("dlq", "dl"), unix.O_WRONLY | unix.O_APPEND},
		{p("archive", "ar"), unix.O_WRONLY | unix.O_TRUNC},
	} {
		fd, err := unix.Open(c.path, c.flags|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
		}
		if got := errName(err); got != "EPERM" {
			t.Errorf("open %s with flags %#o = %s, want EPERM", rel(d, c.path), c.flags, got)
		}
	}
	// Nothing moved or changed.
	for dir, want := range map[string]string{"inbox": "r", "processing": "l", "dlq": "dl", "archive": "ar"} {
		wantNames(t, dir, ls(t, p(dir)), want)
		if got := readFile(t, p(dir, want)); got != want+"\n" {
			t.Errorf("%s/%s now reads %q", dir, want, got)
		}
	}
	wantNames(t, "delayed", ls(t, p("delayed")))
	for _, dir := range allDirs {
		wantNames(t, "q2/"+dir, ls(t, filepath.Join(q2, dir)))
	}
	// The one cross-queue rename the table has: ack and forward.
	if got := errName(unix.Rename(p("processing", "l"), filepath.Join(q2, "inbox", "l"))); got != "OK" {
		t.Errorf("forward processing/l → q2/inbox/ = %s", got)
	}
	testenv.MustSh(t, q, `rm inbox/r dlq/dl archive/* ../q2/inbox/l && rm ../q2/archive/* 2>/dev/null || true`)
}

// hostilePolicies: every invalid document fails the close with EINVAL (a
// document past 1 MiB already fails its write with EFBIG) and the policy in
// effect stays.
func hostilePolicies(t *testing.T, d *testenv.Daemon) {
	qp := mkq(t, d, "pol", `{"visibilityTimeoutSec": 45, "maxReady": 9}`)
	path := filepath.Join(qp, ".policy")
	good := readFile(t, path)
	deep := strings.Repeat(`{"a":`, 100000) + "1" + strings.Repeat("}", 100000)
	deepArr := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	huge := `{"visibilityTimeoutSec": 10, "fanout": [` + strings.Repeat(`"q2",`, 2<<20/5) + `"q2"]}`
	cases := []struct{ doc, write string }{
		{`{"visibilityTimeoutSec": 0}`, "OK"},
		{`{"visibilityTimeoutSec": -1}`, "OK"},
		{`{"visibilityTimeoutSec": 1e99}`, "OK"},
		{`{"visibilityTimeoutSec": 1.5}`, "OK"},
		{`{"visibilityTimeoutSec": null, "maxReady": "x"}`, "OK"},
		{`{"maxLeaseSec": 1}`, "OK"},
		{`{"retry": {"limit": 100000}}`, "OK"},
		{`{"retry": {"backoff": "random"}}`, "OK"},
		{`{"retry": {"initialDelaySec": -1}}`, "OK"},
		{`{"retry": {"initialDelaySec": "NaN"}}`, "OK"},
		{`{"retry": {"initialDelaySec": 10, "maxDelaySec": 1}}`, "OK"},
		{`{"retry": []}`, "OK"},
		{`{"dlq": {"enabled": "yes"}}`, "OK"},
		{`{"dlq": {"retentionDays": 99999}}`, "OK"},
		{`{"archive": {"retentionSec": -5}}`, "OK"},
		{`{"archive": {"maxMessages": -1}}`, "OK"},
		{`{"maxMessageBytes": 0}`, "OK"},
		{`{"maxMessageBytes": 99999999999}`, "OK"},
		{`{"maxReady": -3}`, "OK"},
		{`{"format": "xml"}`, "OK"},
		{`{"format": "JSON"}`, "OK"},
		{`{"schema": {"type": "object"}}`, "OK"}, // a schema needs format json
		{`{"format": "json", "schema": {"type": 7}}`, "OK"},
		{`{"format": "json", "schema": {"$ref": "file:///etc/passwd"}}`, "OK"},
		{`{"format": "json", "schema": {"$ref": "http://169.254.169.254/latest"}}`, "OK"},
		{`{"dedupWindowSec": -1}`, "OK"},
		{`{"fanout": ["../etc"]}`, "OK"},
		{`{"fanout": ["pol"]}`, "OK"}, // itself
		{`{"fanout": ["nosuchqueue"]}`, "OK"},
		{`{"fanout": ["q2", "q2"]}`, "OK"},
		{`{"paused": "true"}`, "OK"},
		{`{"noSuchField": 1}`, "OK"},
		{`{"VisibilityTimeoutSec ": 1}`, "OK"},
		{``, "OK"}, // a lone truncation and no bytes commits nothing, see below
		{"   \n", "OK"},
		{`null`, "OK"},
		{`[]`, "OK"},
		{`"string"`, "OK"},
		{`{`, "OK"},
		{`{"visibilityTimeoutSec": 10`, "OK"},
		{`{"visibilityTimeoutSec": 10}}`, "OK"},
		{`{"visibilityTimeoutSec": 10} {"visibilityTimeoutSec": 11}`, "OK"},
		{"{\"visibilityTimeoutSec\": 10, \"format\": \"\xff\"}", "OK"},
		{"\x00\x01\x02", "OK"},
		{deep, "OK"},
		{deepArr, "OK"},
		{huge, "EFBIG"},
		{`{"visibilityTimeoutSec": 10}` + strings.Repeat(" ", 2<<20), "EFBIG"},
	}
	before := len(d.Log())
	for _, c := range cases {
		w, cl := rawWritePolicy(path, []byte(c.doc))
		want := "EINVAL"
		if c.doc == "" {
			want = "OK" // nothing written: nothing to commit
		}
		if w != c.write || cl != want {
			t.Errorf("policy %.60q (%d bytes): write=%s close=%s, want write=%s close=%s", c.doc, len(c.doc), w, cl, c.write, want)
		}
		got, refused := policyAndRefusal(t, path)
		if got != good {
			t.Fatalf("after policy %.60q the policy in effect is\n%s", c.doc, got)
		}
		if want != "OK" && (refused["errno"] != want || refused["reason"] == "") {
			t.Errorf("after policy %.60q .policy says it was refused with %v, want %s and a reason", c.doc, refused, want)
		}
	}
	// The log reaches the test through a pipe: give the last lines time.
	// Refusals of one kind by one user: a burst of 5, then one per 10 s.
	testenv.MustRetryUntil(t, 5*time.Second, "a burst of log lines about rejected policies", func() bool {
		return strings.Count(d.Log()[before:], "policy rejected") >= 5
	})
	// Still writable with a good document.
	if w, cl := rawWritePolicy(path, []byte(`{"visibilityTimeoutSec": 46}`)); w+cl != "OKOK" {
		t.Fatalf("a valid policy after the hostile ones: write=%s close=%s", w, cl)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(readFile(t, path)), &p); err != nil || p["visibilityTimeoutSec"] != 46.0 {
		t.Fatalf("valid policy not in effect: %v %v", p, err)
	}
	if r, ok := p["lastRefused"]; ok {
		t.Errorf("a valid policy was written, and .policy still shows a refusal: %v", r)
	}
	if err := os.Remove(qp); err != nil {
		t.Fatal(err)
	}
}

// hostileJSONMessages: a json-format queue takes exactly one JSON value per
// message; malformed, huge and deeply nested bodies fail their close with
// EINVAL and are kept whole in dlq/. Past maxMessageBytes: EFBIG at write.
func hostileJSONMessages(t *testing.T, d *testenv.Daemon) {
	const limit = 4 << 20
	qj := mkq(t, d, "jq", fmt.Sprintf(`{"format": "json", "maxMessageBytes": %d}`, limit))
	qe := mkq(t, d, "eq", fmt.Sprintf(`{"format": "envelope", "maxMessageBytes": %d}`, limit))
	hugeStr := `"` + strings.Repeat("x", 3<<20) + `"`
	cases := []struct {
		q, name, body, close string
	}{
		{qj, "open-brace", `{`, "EINVAL"},
		{qj, "two-values", `{"a":1}{"b":2}`, "EINVAL"},
		{qj, "trailing-comma", `[1,2,]`, "EINVAL"},
		{qj, "nan", `NaN`, "EINVAL"},
		{qj, "bad-utf8-escape", `"\ud800\u"`, "EINVAL"},
		{qj, "nul", "\x00", "EINVAL"},
		{qj, "deep-array", strings.Repeat("[", 100000) + strings.Repeat("]", 100000), "EINVAL"},
		{qj, "deep-object", strings.Repeat(`{"a":`, 100000) + "1" + strings.Repeat("}", 100000), "EINVAL"},
		{qj, "huge-unterminated", hugeStr[:len(hugeStr)-1], "EINVAL"},
		{qj, "huge-two-values", hugeStr + " " + hugeStr[:1<<10] + `"`, "EINVAL"},
		{qj, "huge-valid", hugeStr, "OK"},
		{qj, "deep-but-allowed", strings.Repeat("[", 5000) + strings.Repeat("]", 5000), "OK"},
		{qj, "bad-utf8-bytes", "\"\xff\xfe\"", "OK"}, // encoding/json takes invalid UTF-8 in strings
		{qe, "deep-payload", `{"payload": ` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`, "EINVAL"},
		{qe, "huge-unknown-field", `{"payload": 1, "x": ` + hugeStr + `}`, "EINVAL"},
		{qe, "priority-overflow", `{"payload": 1, "attributes": {"priority": 1e400}}`, "EINVAL"},
		{qe, "delay-negative", `{"payload": 1, "attributes": {"delaySec": -1}}`, "EINVAL"},
		{qe, "array", `[{"payload": 1}]`, "EINVAL"},
	}
	for _, c := range cases {
		o, w, cl := rawPublish(filepath.Join(c.q, "inbox", c.name), []byte(c.body))
		if o != "OK" || w != "OK" || cl != c.close {
			t.Errorf("%s/%s: open=%s write=%s close=%s, want close=%s", filepath.Base(c.q), c.name, o, w, cl, c.close)
			continue
		}
		dir := "inbox"
		if c.close != "OK" {
			dir = "dlq"
		}
		b, err := os.ReadFile(filepath.Join(c.q, dir, c.name))
		if err != nil || string(b) != c.body {
			t.Errorf("%s/%s/%s: %d bytes, %v; want the producer's %d bytes", filepath.Base(c.q), dir, c.name, len(b), err, len(c.body))
		}
	}
	if got := stat(t, qj, "dlq") + stat(t, qe, "dlq"); got != 15 {
		t.Errorf("%v dead letters, want 15", got)
	}
	// Past maxMessageBytes: EFBIG at write(2), nothing kept anywhere.
	o, w, cl := rawPublish(filepath.Join(qj, "inbox", "too-big"), []byte(`"`+strings.Repeat("y", limit)+`"`))
	if o != "OK" || w != "EFBIG" || cl != "EFBIG" {
		t.Errorf("too big: open=%s write=%s close=%s, want write=EFBIG close=EFBIG", o, w, cl)
	}
	time.Sleep(100 * time.Millisecond) // RELEASE is asynchronous
	for _, dir := range allDirs {
		for _, n := range ls(t, filepath.Join(qj, dir)) {
			if n == "too-big" {
				t.Errorf("the refused message is in %s/", dir)
			}
		}
	}
	for _, qd := range []string{qj, qe} {
		testenv.MustSh(t, d.Mountpoint, "rm -r "+filepath.Base(qd))
	}
}

// hostileNextReaders: more blocked .next readers than the daemon takes.
// The total cap is the default of 1024 (fusefs DefaultOptions; TestHostile
// lifts the per-uid and per-queue caps); 76 more readers get EBUSY and a
// log line. Publishing N
// messages wakes exactly N readers, and interrupting the others with a
// signal leaves no lease behind and frees their slots.
func hostileNextReaders(t *testing.T, d *testenv.Daemon) {
	const readers, maxReaders, published = 1100, 1024, 10
	qn := mkq(t, d, "nx", "")
	next := filepath.Join(qn, ".next")
	before := len(d.Log())

	type result struct {
		data string
		err  string
	}
	var (
		cancel         atomic.Bool
		busy, finished atomic.Int64
		wg             sync.WaitGroup
		mu             sync.Mutex
		tids           = make([]int, readers)
		done           = make([]bool, readers)
		results        = make([]result, readers)
	)
	for i := 0; i < readers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			// A locked thread has a tid a signal can be sent to.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			mu.Lock()
			tids[i] = unix.Gettid()
			mu.Unlock()
			var r result
			defer func() {
				mu.Lock()
				results[i], done[i] = r, true
				mu.Unlock()
				finished.Add(1)
			}()
			fd, err := unix.Open(next, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				r.err = "open " + errName(err)
				return
			}
			defer unix.Close(fd)
			buf := make([]byte, 512)
			for {
				n, err := unix.Read(fd, buf)
				if err == unix.EINTR && !cancel.Load() {
					continue // a stray signal (the Go runtime's): no lease was taken
				}
				if err == unix.EBUSY {
					busy.Add(1)
				}
				r.err = errName(err)
				if n > 0 {
					r.data = string(buf[:n])
				}
				return
			}
		}(i)
	}
	testenv.MustRetryUntil(t, 20*time.Second, "readers past the cap refused", func() bool { return busy.Load() >= readers-maxReaders })
	// Give a wrong extra refusal the time to show.
	time.Sleep(100 * time.Millisecond)
	if got := busy.Load(); got != readers-maxReaders {
		t.Fatalf("%d readers got EBUSY, want %d", got, readers-maxReaders)
	}
	if finished.Load() != readers-maxReaders {
		t.Fatalf("%d readers returned before any publish, want only the %d refused", finished.Load(), readers-maxReaders)
	}
	testenv.MustRetryUntil(t, 5*time.Second, "a log line for the refused readers", func() bool {
		return strings.Contains(d.Log()[before:], ".next refused: too many blocked readers")
	})

	var names []string
	for i := 0; i < published; i++ {
		name := fmt.Sprintf("m%02d", i)
		names = append(names, name)
		if o, w, c := rawPublish(filepath.Join(qn, "inbox", name), []byte(name)); o+w+c != "OKOKOK" {
			t.Fatalf("publish %s: %s %s %s", name, o, w, c)
		}
	}
	testenv.MustRetryUntil(t, 20*time.Second, "published messages delivered", func() bool { return finished.Load() >= readers-maxReaders+published })
	time.Sleep(100 * time.Millisecond) // give a wrong extra return the time to show
	if got := finished.Load(); got != readers-maxReaders+published {
		t.Fatalf("%d readers returned after %d publishes, want %d", got, published, readers-maxReaders+published)
	}
	var got []string
	mu.Lock()
	for _, r := range results {
		if r.data != "" {
			got = append(got, strings.TrimSuffix(strings.TrimPrefix(r.data, "processing/"), "\n"))
		}
	}
	mu.Unlock()
	sort.Strings(got)
	wantNames(t, "leased by .next", got, names...)

	// Interrupt the rest: a signal to each blocked thread.
	cancel.Store(true)
	testenv.MustRetryUntil(t, 30*time.Second, "blocked readers interrupted", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i, ok := range done {
			if !ok && tids[i] != 0 {
				unix.Tgkill(os.Getpid(), tids[i], unix.SIGURG)
			}
		}
		return finished.Load() == readers
	})
	wg.Wait()
	interrupted := 0
	for _, r := range results {
		if r.err == "EINTR" && r.data == "" {
			interrupted++
		}
	}
	if interrupted != maxReaders-published {
		t.Errorf("%d readers interrupted with EINTR, want %d", interrupted, maxReaders-published)
	}
	// No lease besides the ten, and nobody is still waiting to take one.
	wantNames(t, "processing", sorted(ls(t, filepath.Join(qn, "processing"))), names...)
	if o, w, c := rawPublish(filepath.Join(qn, "inbox", "after"), []byte("after")); o+w+c != "OKOKOK" {
		t.Fatalf("publish after: %s %s %s", o, w, c)
	}
	time.Sleep(200 * time.Millisecond) // give a reader that should be gone the time to take "after"
	wantNames(t, "inbox after the readers left", ls(t, filepath.Join(qn, "inbox")), "after")
	for key, want := range map[string]float64{"inflight": published, "ready": 1, "leased_total": published} {
		if got := stat(t, qn, key); got != want {
			t.Errorf(".stats %s = %v, want %v", key, got, want)
		}
	}
	// Their slots are free again: a blocking read is served.
	wantOut(t, "a new reader", client(t, qn, "next", ".next", "5"), "open=OK\nread=OK\ndata=processing/after")
	testenv.MustSh(t, qn, `rm processing/*`)
}

// checkConsistent: every message is in exactly one state directory (names
// are unique across the live ones), and .stats says what the listings say.
func checkConsistent(t *testing.T, d *testenv.Daemon) {
	t.Helper()
	var root struct {
		Queues []map[string]any `json:"queues"`
	}
	if err := json.Unmarshal([]byte(readFile(t, d.Path(".stats"))), &root); err != nil {
		t.Fatal(err)
	}
	gauge := map[string]string{"inbox": "ready", "processing": "inflight", "delayed": "delayed", "dlq": "dlq", "archive": "archived"}
	queues := 0
	for _, q := range ls(t, d.Mountpoint) {
		if strings.HasPrefix(q, ".") {
			continue
		}
		queues++
		qd := d.Path(q)
		s := stats(t, qd)
		seen := map[string]string{}
		for _, dir := range allDirs {
			names := ls(t, filepath.Join(qd, dir))
			if got := s[gauge[dir]]; got != float64(len(names)) {
				t.Errorf("%s/.stats %s = %v, but %s/ lists %d", q, gauge[dir], got, dir, len(names))
			}
			for _, n := range names {
				if dir == "archive" {
					continue // an acked name may be published again
				}
				if other, ok := seen[n]; ok {
					t.Errorf("%s: %q is in both %s/ and %s/", q, n, other, dir)
				}
				seen[n] = dir
			}
		}
		for _, rs := range root.Queues {
			if rs["queue"] == q && rs["ready"] != s["ready"] {
				t.Errorf("MOUNT/.stats says %s has %v ready, QUEUE/.stats %v", q, rs["ready"], s["ready"])
			}
		}
	}
	if len(root.Queues) != queues {
		t.Errorf("MOUNT/.stats has %d queues, the mount lists %d", len(root.Queues), queues)
	}
}

// checkNothingOutside: the mountpoint's and the store's parents hold only
// them, and the store holds only its own files; for the fs store, one body
// file per message, where the listing says.
func checkNothingOutside(t *testing.T, d *testenv.Daemon) {
	t.Helper()
	for _, p := range []string{d.Mountpoint, d.Store} {
		wantNames(t, "beside "+p, ls(t, filepath.Dir(p)), filepath.Base(p))
	}
	top := sorted(ls(t, d.Store))
	backend := strings.Split(t.Name(), "/")[1]
	if backend == "sqlite" {
		for _, n := range top {
			if !strings.HasPrefix(n, "yirangmq.db") && n != "LOCK" && n != disk.ReserveName && n != "bodies" {
				t.Errorf("sqlite store holds %q", n)
			}
		}
		// Big bodies' files, named by message ID, and nothing else.
		for _, n := range ls(t, filepath.Join(d.Store, "bodies")) {
			if _, err := strconv.ParseUint(n, 10, 64); err != nil {
				t.Errorf("sqlite store holds bodies/%q", n)
			}
		}
		return
	}
	for _, n := range top {
		switch n {
		case "LOCK", "format", "snapshot", "ids", "intents", "queues", "trash", "lost+found", "spare", disk.ReserveName:
		default:
			t.Errorf("fs store holds %q", n)
		}
	}
	// Empty files made ahead for new bodies, numbered, in numbered
	// directories, and nothing else.
	for _, sub := range ls(t, filepath.Join(d.Store, "spare")) {
		if _, err := strconv.ParseUint(sub, 10, 64); err != nil {
			t.Errorf("fs store holds spare/%q", sub)
			continue
		}
		for _, n := range ls(t, filepath.Join(d.Store, "spare", sub)) {
			if _, err := strconv.ParseUint(n, 10, 64); err != nil {
				t.Errorf("fs store holds spare/%s/%q", sub, n)
			} else if fi, err := os.Stat(filepath.Join(d.Store, "spare", sub, n)); err == nil && fi.Size() != 0 {
				t.Errorf("fs store's spare/%s/%s holds %d bytes", sub, n, fi.Size())
			}
		}
	}
	// Batches of several messages under way, numbered, and nothing else.
	for _, n := range ls(t, filepath.Join(d.Store, "intents")) {
		if _, err := strconv.ParseUint(strings.TrimPrefix(n, ".yirangmq.tmp."), 10, 64); err != nil {
			t.Errorf("fs store holds intents/%q", n)
		}
	}
	for _, q := range ls(t, filepath.Join(d.Store, "queues")) {
		mq := d.Path(q)
		if _, err := os.Stat(mq); err != nil {
			t.Errorf("fs store has a directory for queue %q the mount does not list", q)
			continue
		}
		wantNames(t, "store queues/"+q, sorted(ls(t, filepath.Join(d.Store, "queues", q))), sorted(append(slices.Clone(allDirs), "policy.json"))...)
		for _, dir := range allDirs {
			// In --sync full a lease's or an ack's file moves with the sync
			// that makes it durable, within queuecore.SyncDelay.
			var onDisk, listed []string
			testenv.RetryUntil(10*queuecore.SyncDelay, func() bool {
				onDisk = sorted(ls(t, filepath.Join(d.Store, "queues", q, dir)))
				listed = sorted(ls(t, filepath.Join(mq, dir)))
				return sameSet(onDisk, listed)
			})
			if !sameSet(onDisk, listed) {
				t.Errorf("fs store queues/%s/%s holds %q, the mount lists %q", q, dir, onDisk, listed)
			}
		}
	}
}

func sameSet(got, want []string) bool {
	return strings.Join(sorted(got), "\x00") == strings.Join(sorted(want), "\x00")
}

func trunc(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%s…(%d bytes)", s[:20], len(s))
	}
	return s
}

func rel(d *testenv.Daemon, p string) string {
	r, err := filepath.Rel(d.Mountpoint, p)
	if err != nil {
		return p
	}
	return r
}

// policyAndRefusal reads a .policy: the policy in effect, rendered without
// its lastRefused as .policy renders a policy nothing was refused for,
// and that refusal (nil when none).
func policyAndRefusal(t *testing.T, path string) (string, map[string]any) {
	t.Helper()
	doc := readFile(t, path)
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(doc), &raw); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	r, ok := raw["lastRefused"]
	if !ok {
		return doc, nil
	}
	var refused map[string]any
	if err := json.Unmarshal(r, &refused); err != nil {
		t.Fatalf("%s: lastRefused: %v", path, err)
	}
	// The refusal is the last field: cut it off the indented document.
	i := strings.Index(doc, ",\n  \"lastRefused\"")
	if i < 0 {
		t.Fatalf("%s: lastRefused is not the last field:\n%s", path, doc)
	}
	return doc[:i] + "\n}\n", refused
}
