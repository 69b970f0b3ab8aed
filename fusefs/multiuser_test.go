package fusefs_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"yirangmq/testenv"
	"yirangmq/testenv/pgtest"
)

// Several users on one mount (docs/multiuser.md): a root mount with
// allow_other, and a table of rows each run as an unprivileged user
// (setpriv), asserting the errno, that the victim's data is untouched,
// and the daemon's memory and CPU where the row is about exhaustion.
// The numbers in the row names are those of the issue that asked for them.

const stranger = nobody - 1 // a third user

// Small reader caps, so that the rows about them stay cheap.
var multiUserArgs = []string{"-o", "allow_other",
	"--max-next-readers", "40", "--max-next-readers-per-uid", "10", "--max-next-readers-per-queue", "20"}

// sharedDir is a directory every user may enter and read, removed at the
// end of the test.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "yirangmq-multiuser-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sharedCopy copies an executable where every user may run it.
func sharedCopy(t *testing.T, dir, src string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, filepath.Base(src))
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// asUserGroups is asUser with supplementary groups.
func asUserGroups(t *testing.T, uid int, groups, dir, script string) testenv.Result {
	t.Helper()
	u := strconv.Itoa(uid)
	return testenv.Sh(t, dir, "setpriv --reuid="+u+" --regid="+u+" --groups="+groups+" sh -c '"+strings.ReplaceAll(script, "'", `'\''`)+"'")
}

// procStatus returns a field of /proc/PID/status in KiB (VmRSS, VmHWM).
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// cpuTime is the user+system CPU time of a process so far.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

type multiUser struct {
	d      *testenv.Daemon
	shared string // a directory every user can use
	client string // the C client, runnable by every user
	bin    string // yirangmq, runnable by every user
}

func TestMultiUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: a root mount used by other users")
	}
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			shared := sharedDir(t)
			store := filepath.Join(shared, "store")
			if err := os.Mkdir(store, 0o755); err != nil { // an existing 0755 store directory
				t.Fatal(err)
			}
			d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: b, Store: store, Args: multiUserArgs})
			openPath(t, d)
			out := filepath.Join(shared, "out")
			if err := os.Mkdir(out, 0o777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(out, 0o777)
			m := &multiUser{d: d, shared: shared,
				client: sharedCopy(t, shared, testenv.CClient(t)), bin: sharedCopy(t, shared, testenv.Binary(t))}
			mkq(t, d, "open", "")
			mkq(t, d, "mine", "")
			mkq(t, d, "vault", "")
			testenv.MustSh(t, d.Mountpoint, `chmod 0777 open && chown 65534:65534 mine && chmod 0700 vault && echo treasure > vault/inbox/t`)
			rows := []struct {
				name string
				f    func(m *multiUser, t *testing.T)
			}{
				{"1-NextNeedsWrite", (*multiUser).nextNeedsWrite},
				{"2-FanoutTarget", (*multiUser).fanoutTarget},
				{"3-LeaserSetsReason", (*multiUser).leaserSetsReason},
				{"3b-LeaseOwnMessage", (*multiUser).leaseOwnMessage},
				{"5-DraftFlood", (*multiUser).draftFlood},
				{"6-NextReaders", (*multiUser).nextReaders},
				{"7-CostlySchemas", (*multiUser).costlySchemas},
				{"8-StoredPolicyKept", (*multiUser).storedPolicyKept},
				{"9-ConsumeExactName", (*multiUser).consumeExactName},
				{"11-SchemaErrorText", (*multiUser).schemaErrorText},
				{"4-StoreFilesPrivate", (*multiUser).storeFilesPrivate},
			}
			for _, r := range rows {
				t.Run(r.name, func(t *testing.T) { r.f(m, t) })
			}
			// The victim's queue is as it was, the daemon alive and
			// consistent.
			wantNames(t, "vault/inbox", ls(t, d.Path("vault", "inbox")), "t")
			if got := readFile(t, d.Path("vault", "inbox", "t")); got != "treasure\n" {
				t.Errorf("vault/inbox/t holds %q", got)
			}
			if err := syscall.Kill(d.Pid(), 0); err != nil {
				t.Fatalf("daemon gone: %v", err)
			}
			if strings.Contains(strings.ToLower(d.Log()), "panic") {
				t.Errorf("the daemon log mentions a panic")
			}
			checkConsistent(t, d)
		})
	}
}

// as runs a script as uid in the mountpoint.
func (m *multiUser) as(t *testing.T, uid int, script string) testenv.Result {
	t.Helper()
	return asUser(t, uid, m.d.Mountpoint, script)
}

func (m *multiUser) run(t *testing.T, uid int, args ...string) string {
	t.Helper()
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	r := m.as(t, uid, m.client+" "+strings.Join(q, " "))
	return strings.TrimSpace(r.Stdout)
}

// 1. Leasing through .next needs write permission on the queue, as mv does.
func (m *multiUser) nextNeedsWrite(t *testing.T) {
	d := m.d
	mkq(t, d, "ro", "")
	testenv.MustSh(t, d.Mountpoint, `echo secret > ro/inbox/s && chmod 0755 ro`)
	wantOut(t, ".next of a 0755 root queue by nobody", m.run(t, nobody, "next-nonblock", "ro/.next"), "open=EACCES")
	if r := m.as(t, nobody, "mv ro/inbox/s ro/processing/"); r.Code == 0 || !strings.Contains(r.Stderr, "Permission denied") {
		t.Errorf("mv by nobody: exit %d %q", r.Code, r.Stderr)
	}
	wantLog(t, d, ".next refused: leasing needs write permission")
	wantNames(t, "ro/inbox", ls(t, d.Path("ro", "inbox")), "s")
	wantNames(t, "ro/processing", ls(t, d.Path("ro", "processing")))
	// A group that may read but not write: still refused; once the group
	// may write, a member by supplementary group leases.
	testenv.MustSh(t, d.Mountpoint, `chgrp 4321 ro && chmod 0750 ro`)
	r := asUserGroups(t, nobody, "4321", d.Mountpoint, m.client+" next-nonblock ro/.next")
	wantOut(t, ".next by a reading group member", r.Stdout, "open=EACCES")
	testenv.MustSh(t, d.Mountpoint, `chmod 0770 ro`)
	r = asUserGroups(t, nobody, "4321", d.Mountpoint, m.client+" next-nonblock ro/.next")
	wantOut(t, ".next by a writing group member", r.Stdout, "open=OK\nread=OK\ndata=processing/s")
	testenv.MustSh(t, d.Mountpoint, `rm -r ro`)
}

// 2. A fanout target needs write permission for the policy's writer.
func (m *multiUser) fanoutTarget(t *testing.T) {
	d := m.d
	wantOut(t, "nobody fans out to root's 0700 vault", m.run(t, nobody, "write-policy", "mine/.policy", `{"fanout": ["vault"]}`), "open=OK\nwrite=OK\nclose=EACCES")
	wantLog(t, d, "policy rejected: fanout to a queue its writer may not publish to")
	wantOut(t, "nobody fans out to the 0777 queue", m.run(t, nobody, "write-policy", "mine/.policy", `{"fanout": ["open"]}`), "open=OK\nwrite=OK\nclose=OK")
	wantOut(t, "publish to mine", m.run(t, nobody, "publish", "mine/inbox/fan", "x"), "open=OK\nwrite=OK\nclose=OK")
	wantNames(t, "vault/inbox", ls(t, d.Path("vault", "inbox")), "t")
	wantNames(t, "open/inbox", ls(t, d.Path("open", "inbox")), "fan")
	testenv.MustSh(t, d.Mountpoint, `echo '{"fanout": []}' > mine/.policy && rm mine/inbox/fan open/inbox/fan`)
	// A forward (mv of a leased message to another queue's inbox/) needs
	// write permission on the target too: the kernel checks it.
	testenv.MustSh(t, d.Mountpoint, `echo f > open/inbox/fwd`)
	if r := m.as(t, nobody, `m=$(cat open/.next) && mv open/$m vault/inbox/`); r.Code == 0 || !strings.Contains(r.Stderr, "Permission denied") {
		t.Errorf("forward into vault by nobody: exit %d %q", r.Code, r.Stderr)
	}
	wantNames(t, "vault/inbox", ls(t, d.Path("vault", "inbox")), "t")
	testenv.MustSh(t, d.Mountpoint, `rm open/processing/fwd`)
}

// 3. The leaser may set the reason and extend the lease, whoever
// published; a third user may not.
func (m *multiUser) leaserSetsReason(t *testing.T) {
	d := m.d
	testenv.MustSh(t, d.Mountpoint, `echo a > open/inbox/job && echo b > open/inbox/job2`)
	r := m.as(t, nobody, `m=$(cat open/.next) && test "$m" = processing/job && `+m.client+` setxattr open/$m user.yirangmq.reason BOOM && touch -d @$(( $(date +%s) + 100 )) open/$m`)
	if r.Code != 0 || r.Stdout != "setxattr=OK\n" {
		t.Fatalf("leaser through .next: exit %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	// Leased by mv: the same.
	r = m.as(t, nobody, `mv open/inbox/job2 open/processing/ && `+m.client+` setxattr open/processing/job2 user.yirangmq.reason BOOM2 && touch open/processing/job2`)
	if r.Code != 0 || r.Stdout != "setxattr=OK\n" {
		t.Fatalf("leaser through mv: exit %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	wantOut(t, "a stranger sets the reason", m.run(t, stranger, "setxattr", "open/processing/job", "user.yirangmq.reason", "EVIL"), "setxattr=EACCES")
	if r := m.as(t, stranger, "touch -d @1 open/processing/job"); r.Code == 0 {
		t.Errorf("a stranger moved the deadline")
	}
	for n, want := range map[string]string{"job": "BOOM", "job2": "BOOM2"} {
		wantOut(t, n+" reason", client(t, d.Mountpoint, "getxattr", "open/processing/"+n, "user.yirangmq.reason"), "getxattr=OK\nvalue="+want)
	}
	if uid, _, _ := ownerMode(t, d.Path("open", "processing", "job")); uid != nobody {
		t.Errorf("processing/job owned by %d, want the leaser %d", uid, nobody)
	}
	fi, err := os.Stat(d.Path("open", "processing", "job"))
	if err != nil || time.Until(fi.ModTime()) < 60*time.Second {
		t.Errorf("lease deadline %v, want about 100 s from now (%v)", fi.ModTime(), err)
	}
	testenv.MustSh(t, d.Mountpoint, `rm open/processing/job open/processing/job2`)
}

// 3b. A lease by mv of a message whose attributes the kernel may hold
// leaves them right for the leaser and for stat: the publisher leasing its
// own message right after its CREATE (the daemon sends no invalidation
// then), after someone's stat cached them, and after a lease by another
// user that was given back.
func (m *multiUser) leaseOwnMessage(t *testing.T) {
	d := m.d
	// What the leaser sees at once: its own uid, a deadline about 30 s
	// ahead (the default visibility timeout), and touch -d, setxattr work.
	check := func(t *testing.T, what string, uid int, name string) {
		t.Helper()
		r := m.as(t, uid, `mv open/inbox/`+name+` open/processing/ && stat -c '%u %Y' open/processing/`+name+` && date +%s && `+
			`touch -d @$(( $(date +%s) + 100 )) open/processing/`+name+` && `+m.client+` setxattr open/processing/`+name+` user.yirangmq.reason R`)
		var owner, mtime, now int64
		var rest string
		if n, _ := fmt.Sscan(r.Stdout, &owner, &mtime, &now, &rest); n != 4 || r.Code != 0 || rest != "setxattr=OK" {
			t.Fatalf("%s: exit %d %q %q", what, r.Code, r.Stdout, r.Stderr)
		}
		if owner != int64(uid) || mtime < now+20 || mtime > now+40 {
			t.Errorf("%s: stat right after the lease says owner %d mtime %d at %d, want %d and the deadline (about 30 s ahead)", what, owner, mtime, now, uid)
		}
		if r := m.as(t, stranger, "touch -d @1 open/processing/"+name); r.Code == 0 && uid != stranger {
			t.Errorf("%s: a stranger moved the deadline", what)
		}
		fi, err := os.Stat(d.Path("open", "processing", name))
		if err != nil || time.Until(fi.ModTime()) < 60*time.Second {
			t.Errorf("%s: lease deadline %v, want about 100 s from now (%v)", what, fi.ModTime(), err)
		}
	}
	publish := func(t *testing.T, uid int, name string) {
		t.Helper()
		if r := m.as(t, uid, "echo x > open/inbox/"+name); r.Code != 0 {
			t.Fatalf("publish %s: %s", name, r.Stderr)
		}
	}
	publish(t, nobody, "own1")
	check(t, "leased at once by its publisher", nobody, "own1")
	publish(t, nobody, "own2")
	if r := m.as(t, stranger, "stat open/inbox/own2 >/dev/null"); r.Code != 0 {
		t.Fatalf("stat: %s", r.Stderr)
	}
	check(t, "leased by its publisher after a stat", nobody, "own2")
	publish(t, nobody, "own3")
	// Leased by a stranger, and given back at once (reason RELEASED).
	if r := m.as(t, stranger, "mv open/inbox/own3 open/processing/ && stat open/processing/own3 >/dev/null && "+m.client+" setxattr open/processing/own3 user.yirangmq.reason RELEASED >/dev/null && mv open/processing/own3 open/inbox/ && test -f open/inbox/own3"); r.Code != 0 {
		t.Fatalf("a stranger's lease and nack: %s", r.Stderr)
	}
	check(t, "leased by its publisher after a stranger's lease", nobody, "own3")
	testenv.MustSh(t, d.Mountpoint, `echo x > open/inbox/root1`)
	check(t, "root's message leased at once by nobody", nobody, "root1")
	testenv.MustSh(t, d.Mountpoint, `rm open/processing/own1 open/processing/own2 open/processing/own3 open/processing/root1`)
}

// 5. Drafts are bounded per uid: a flood of 1000 drafts of 256 KiB gets
// EDQUOT past 64 MiB, the daemon's memory stays bounded, and other users
// still publish (200 KB messages, under the default maxMessageBytes).
func (m *multiUser) draftFlood(t *testing.T) {
	d := m.d
	pid := d.Pid()
	rss0, cpu0 := procStatus(t, pid, "VmRSS"), cpuTime(t, pid)
	start := time.Now()
	r := m.as(t, nobody, `blob=$(head -c 262144 /dev/zero | tr '\0' x); ok=0; fail=0; i=0
		while [ $i -lt 1000 ]; do
			if printf %s "$blob" > open/inbox/.d$i 2>/dev/null; then ok=$((ok+1)); else fail=$((fail+1)); fi
			i=$((i+1))
		done
		echo $ok $fail`)
	took := time.Since(start)
	var ok, fail int
	fmt.Sscan(r.Stdout, &ok, &fail)
	hwm, rss1, cpu := procStatus(t, pid, "VmHWM"), procStatus(t, pid, "VmRSS"), cpuTime(t, pid)-cpu0
	t.Logf("draft flood of 1000 x 256 KiB by one uid in %v: %d kept, %d refused; daemon RSS %d MiB before, %d MiB after, peak %d MiB; CPU %v",
		took.Round(time.Millisecond), ok, fail, rss0>>10, rss1>>10, hwm>>10, cpu)
	if ok < 200 || ok > 256 || fail != 1000-ok {
		t.Errorf("%d drafts kept, %d refused: want at most 64 MiB (256) kept, the rest refused", ok, fail)
	}
	if hwm-rss0 > 200<<10 {
		t.Errorf("daemon peak RSS grew by %d MiB under the flood (64 MiB per uid bound)", (hwm-rss0)>>10)
	}
	if cpu > 60*time.Second {
		t.Errorf("daemon used %v of CPU for the flood", cpu)
	}
	wantOut(t, "one more by the flooder", m.run(t, nobody, "publish-big", "open/inbox/.more", "262144"), "open=OK\nwrite=EDQUOT\nclose=OK")
	wantLog(t, d, "too many uncommitted bytes (EDQUOT)")
	// Reading a draft copies it: that counts too, so opening many copies
	// of one's own drafts cannot get around the bound.
	if r := m.as(t, nobody, "cat open/inbox/.d0 > /dev/null"); r.Code == 0 || !strings.Contains(r.Stderr, "quota") {
		t.Errorf("reading a draft past the bound: exit %d %q, want Disk quota exceeded", r.Code, r.Stderr)
	}
	// Other users are not starved.
	wantOut(t, "a stranger's message", m.run(t, stranger, "publish-big", "open/inbox/other", "200000"), "open=OK\nwrite=OK\nclose=OK")
	wantOut(t, "root's message", client(t, d.Mountpoint, "publish-big", "open/inbox/root", "200000"), "open=OK\nwrite=OK\nclose=OK")
	// Removing the drafts gives the room back.
	// (Drafts are not listed: remove them by name.)
	if r := m.as(t, nobody, `i=0; while [ $i -lt 1000 ]; do rm -f open/inbox/.d$i; i=$((i+1)); done; rm -f open/inbox/.more`); r.Code != 0 {
		t.Fatalf("rm drafts: %s", r.Stderr)
	}
	wantOut(t, "the flooder after rm", m.run(t, nobody, "publish-big", "open/inbox/after", "262144"), "open=OK\nwrite=OK\nclose=OK")
	testenv.MustSh(t, d.Mountpoint, `rm open/inbox/other open/inbox/root open/inbox/after`)
}

// startReaders starts n blocking .next readers as uid on queue, each
// writing what the client says to DIR/PREFIX.I.
func (m *multiUser) startReaders(t *testing.T, uid, n int, queue, prefix string) *exec.Cmd {
	t.Helper()
	u := strconv.Itoa(uid)
	script := fmt.Sprintf(`for i in $(seq %d); do %s next %s/.next 120 > %s/%s.$i 2>&1 & done; wait`,
		n, m.client, queue, filepath.Join(m.shared, "out"), prefix)
	cmd := exec.Command("setpriv", "--reuid="+u, "--regid="+u, "--clear-groups", "sh", "-c", script)
	cmd.Dir = m.d.Mountpoint
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	return cmd
}

func (m *multiUser) countOut(prefix, want string) int {
	n := 0
	files, _ := filepath.Glob(filepath.Join(m.shared, "out", prefix+".*"))
	for _, f := range files {
		if b, _ := os.ReadFile(f); strings.Contains(string(b), want) {
			n++
		}
	}
	return n
}

// 6. .next readers are capped per uid (10 here) and per queue (20 here):
// one user cannot take the readers of another away.
func (m *multiUser) nextReaders(t *testing.T) {
	d := m.d
	mkq(t, d, "rq", "")
	a := m.startReaders(t, nobody, 12, "open", "a")
	testenv.MustRetryUntil(t, 30*time.Second, "nobody's readers past 10 refused", func() bool { return m.countOut("a", "read=EBUSY") >= 2 })
	time.Sleep(200 * time.Millisecond) // give a wrong extra return the time to show
	if n := m.countOut("a", "read="); n != 2 {
		t.Fatalf("%d of nobody's 12 readers returned, want the 2 past the per-uid cap", n)
	}
	// Root is not refused on the same queue nor on another.
	wantOut(t, "root's .next on open", client(t, d.Mountpoint, "next-nonblock", "open/.next"), "open=OK\nread=EAGAIN")
	b := m.startReaders(t, stranger, 12, "open", "b")
	testenv.MustRetryUntil(t, 30*time.Second, "the stranger's readers past 10 refused", func() bool { return m.countOut("b", "read=EBUSY") >= 2 })
	// open has 20 blocked readers now: its cap.
	wantOut(t, "root's .next on the full queue", client(t, d.Mountpoint, "next-nonblock", "open/.next"), "open=OK\nread=EBUSY")
	testenv.MustSh(t, d.Mountpoint, `echo r > rq/inbox/r`)
	wantOut(t, "root's .next on another queue", client(t, d.Mountpoint, "next", "rq/.next", "10"), "open=OK\nread=OK\ndata=processing/r")
	wantLog(t, d, "too many blocked readers for this uid")
	wantLog(t, d, "too many blocked readers on this queue")
	// Killed readers take no lease and give their slots back.
	for _, c := range []*exec.Cmd{a, b} {
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		c.Wait()
	}
	testenv.MustRetryUntil(t, 30*time.Second, "reader slots freed", func() bool {
		return client(t, d.Mountpoint, "next-nonblock", "open/.next") == "open=OK\nread=EAGAIN"
	})
	wantNames(t, "open/processing", ls(t, d.Path("open", "processing")))
	testenv.MustSh(t, d.Mountpoint, `rm -r rq`)
}

// 7. Schemas too costly are refused at close with EINVAL, quickly; the
// time to refuse each is logged.
func (m *multiUser) costlySchemas(t *testing.T) {
	d := m.d
	var defs []string
	for i := 0; i < 22; i++ {
		defs = append(defs, fmt.Sprintf(`"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i+1, i+1))
	}
	defs = append(defs, `"d22":{"type":"object"}`)
	cases := []struct{ name, schema string }{
		{"22 nested allOf pairs", `{"$ref":"#/$defs/d0","$defs":{` + strings.Join(defs, ",") + `}}`},
		{"9990 levels", strings.Repeat(`{"not":`, 9990) + `{}` + strings.Repeat(`}`, 9990)},
		{"1000 levels", strings.Repeat(`{"not":`, 1000) + `{}` + strings.Repeat(`}`, 1000)},
		{"20500 inline subschemas", `{"anyOf":[` + strings.Repeat(`{},`, 20500) + `{}]}`},
		{"100 KB", `{"properties":{` + strings.Repeat(`"p":{"type":"string"},`, 4500) + `"q":{}}}`},
	}
	before := readFile(t, d.Path("mine", ".policy"))
	for _, c := range cases {
		logged := len(d.Log())
		start := time.Now()
		got := m.run(t, nobody, "write-policy", "mine/.policy", `{"format":"json","schema":`+c.schema+`}`)
		took := time.Since(start)
		why := d.Log()[logged:]
		if i := strings.Index(why, "err="); i >= 0 {
			why = strings.TrimSpace(why[i+4:])
		}
		t.Logf("schema %-22s (%6d bytes) refused in %v (with setpriv and the client): %s", c.name, len(c.schema), took.Round(time.Millisecond), strings.TrimSpace(why))
		if got != "open=OK\nwrite=OK\nclose=EINVAL" {
			t.Errorf("schema %s: %q, want close=EINVAL", c.name, got)
		}
	}
	got, refused := policyAndRefusal(t, d.Path("mine", ".policy"))
	if got != before {
		t.Errorf("policy changed by refused schemas:\n%s", got)
	}
	if refused["errno"] != "EINVAL" || refused["uid"] != float64(nobody) {
		t.Errorf(".policy shows the refusal %v, want EINVAL for uid %d", refused, nobody)
	}
	wantOut(t, "root publishes meanwhile", client(t, d.Mountpoint, "publish", "open/inbox/alive", "x"), "open=OK\nwrite=OK\nclose=OK")
	testenv.MustSh(t, d.Mountpoint, `rm open/inbox/alive`)
}

// 8. A policy accepted at write loads at the next mount: an 880 KB
// document (mostly spaces) with a schema, stored compact.
func (m *multiUser) storedPolicyKept(t *testing.T) {
	d := m.d
	doc := `{"format": "json",` + strings.Repeat(" \n", 440<<10) + `"schema": {"type": "object", "description": "` + strings.Repeat("d", 40<<10) + `"}}`
	path := filepath.Join(m.shared, "bigpolicy.json")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := m.as(t, nobody, "cat "+path+" > mine/.policy"); r.Code != 0 {
		t.Fatalf("a %d byte policy: exit %d %q", len(doc), r.Code, r.Stderr)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	d.Restart(t)
	if strings.Contains(d.Log(), "STORED POLICY CANNOT BE LOADED") {
		t.Fatalf("the stored policy did not load:\n%s", d.Log())
	}
	wantOut(t, "a message the schema refuses", m.run(t, nobody, "publish", "mine/inbox/str", `"not an object"`), "open=OK\nwrite=OK\nclose=EINVAL")
	wantOut(t, "a message the schema takes", m.run(t, nobody, "publish", "mine/inbox/obj", `{}`), "open=OK\nwrite=OK\nclose=OK")
	testenv.MustSh(t, d.Mountpoint, `echo '{"format": "raw"}' > mine/.policy && rm mine/inbox/obj mine/dlq/str`)
}

// 9. yirangmq consume handles the message .next named, not one whose name
// differs by a space: root's lease of "victim" stays untouched.
func (m *multiUser) consumeExactName(t *testing.T) {
	d := m.d
	testenv.MustSh(t, d.Mountpoint, `echo root > open/inbox/victim && mv open/inbox/victim open/processing/`)
	wantOut(t, "nobody publishes", m.run(t, nobody, "publish", "open/inbox/victim ", "mine"), "open=OK\nwrite=OK\nclose=OK")
	// --max-messages 1, not --drain: --drain would wait for root's lease
	// too (it waits for nothing in flight, as yirangmq drain does).
	r := m.as(t, nobody, m.bin+" consume --mount "+d.Mountpoint+" --queue open --max-messages 1 -- cat")
	if r.Code != 0 || r.Stdout != "mine" {
		t.Errorf("consume: exit %d, stdout %q, stderr %q; want the body of \"victim \"", r.Code, r.Stdout, r.Stderr)
	}
	wantNames(t, "open/processing", ls(t, d.Path("open", "processing")), "victim")
	if got := readFile(t, d.Path("open", "processing", "victim")); got != "root\n" {
		t.Errorf("root's lease holds %q", got)
	}
	testenv.MustSh(t, d.Mountpoint, `rm open/processing/victim`)
}

// 11. Schema errors other users read carry no path of the daemon's.
func (m *multiUser) schemaErrorText(t *testing.T) {
	d := m.d
	mkq(t, d, "js", `{"format": "json", "schema": {"type": "object", "required": ["id"]}}`)
	testenv.MustSh(t, d.Mountpoint, `chmod 0777 js`)
	wantOut(t, "an invalid message", m.run(t, nobody, "publish", "js/inbox/bad", `{"x": 1}`), "open=OK\nwrite=OK\nclose=EINVAL")
	got := m.run(t, nobody, "getxattr", "js/dlq/bad", "user.yirangmq.reason_message")
	cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", d.Pid()))
	if !strings.Contains(got, "getxattr=OK") || !strings.Contains(got, "urn:yirangmq:schema") || strings.Contains(got, "file://") || (cwd != "/" && strings.Contains(got, cwd)) {
		t.Errorf("reason of a schema failure: %q (daemon cwd %s)", got, cwd)
	}
	testenv.MustSh(t, d.Mountpoint, `rm -r js`)
}

// 4. Every file of the store is 0600 although its directory was 0755, and
// another user reads none of it.
func (m *multiUser) storeFilesPrivate(t *testing.T) {
	d := m.d
	var files []string
	err := filepath.WalkDir(d.Store, func(p string, e fs.DirEntry, err error) error {
		if err == nil {
			var fi fs.FileInfo
			fi, err = e.Info()
			if err == nil {
				checkPrivate(t, d, p, fi, &files)
			}
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil // the store renamed or removed it meanwhile
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("store files: %v", files)
	}
	for _, f := range files {
		if r := m.as(t, nobody, "cat '"+f+"' > /dev/null"); r.Code == 0 {
			t.Errorf("nobody read %s", f)
		}
	}
}

// 10. A postgres connection string's password shows in no form: not in
// /proc/mounts, .stats or the log, whichever way pgx reads it.
func TestMultiUserPasswordHidden(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: a root mount read by other users")
	}
	s := pgtest.Start(t)
	for i, form := range []string{
		"host=%s port=%d user=%s dbname=%s sslmode=disable password = SECRETPW",
		"host=%s port=%d user=%s dbname=%s sslmode=disable password='SECRET PW2'",
		`host=%s port=%d user=%s dbname=%s sslmode=disable password='SEC\'RET PW3'`,
		"password=SECRETPW4 host=%s port=%d user=%s dbname=%s sslmode=disable",
		"postgres://%[3]s:SECRETPW5@/%[4]s?host=%[1]s&port=%[2]d&sslmode=disable",
		"postgres://%[3]s@/%[4]s?host=%[1]s&port=%[2]d&sslmode=disable&password=SECRETPW6",
	} {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			cc, err := pgconn.ParseConfig(s.CreateDB(t, fmt.Sprintf("pw%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			conn := fmt.Sprintf(form, cc.Host, cc.Port, cc.User, cc.Database)
			d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "postgres", Store: conn, Args: []string{"-o", "allow_other"}})
			openPath(t, d)
			mkq(t, d, "q", "")
			r := asUser(t, nobody, d.Mountpoint, "grep "+d.Mountpoint+" /proc/mounts; cat .stats q/.stats")
			if r.Code != 0 || !strings.Contains(r.Stdout, "xxxxx") {
				t.Errorf("as nobody: exit %d %q %q; want the mount line and stats with the password hidden", r.Code, r.Stdout, r.Stderr)
			}
			for what, text := range map[string]string{"/proc/mounts and .stats": r.Stdout, "the log": d.Log()} {
				if strings.Contains(text, "SECRET") || strings.Contains(text, "RET PW") {
					t.Errorf("%s show the password of %q:\n%s", what, form, text)
				}
			}
		})
	}
}

func checkPrivate(t *testing.T, d *testenv.Daemon, p string, fi fs.FileInfo, files *[]string) {
	t.Helper()
	switch {
	case fi.Mode().IsRegular():
		*files = append(*files, p)
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is %v", p, fi.Mode())
		}
	case fi.IsDir() && p != d.Store && fi.Mode().Perm()&0o077 != 0:
		t.Errorf("%s is %v", p, fi.Mode())
	}
}

// wantLog waits for a line of the daemon's log (it comes through a pipe).
func wantLog(t *testing.T, d *testenv.Daemon, text string) {
	t.Helper()
	testenv.MustRetryUntil(t, 5*time.Second, "log line "+text, func() bool { return strings.Contains(d.Log(), text) })
}
