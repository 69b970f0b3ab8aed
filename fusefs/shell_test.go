package fusefs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"yirangmq/testenv"
)

// The walk-through of docs/user-guide.md: publish with echo, lease with
// mv, ack with rm, read .stats.
func TestShellWalkThrough(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		testenv.MustSh(t, d.Mountpoint, `
			mkdir jobs
			echo hello > jobs/inbox/job1
			test "$(cat jobs/inbox/job1)" = hello
			mv jobs/inbox/job1 jobs/processing/
			test -f jobs/processing/job1
			test ! -e jobs/inbox/job1
			rm jobs/processing/job1
			test -f jobs/archive/job1
		`)
		q := d.Path("jobs")
		for key, want := range map[string]float64{"ready": 0, "inflight": 0, "archived": 1, "published_total": 1, "leased_total": 1, "acked_total": 1} {
			if got := stat(t, q, key); got != want {
				t.Errorf(".stats %s = %v, want %v", key, got, want)
			}
		}
		root := readFile(t, d.Path(".stats"))
		if !strings.Contains(root, `"backend": "`) || !strings.Contains(root, `"queue": "jobs"`) {
			t.Fatalf("root .stats: %s", root)
		}
		if m := readFile(t, d.Path(".metrics")); !strings.Contains(m, `yirangmq_acked_total{queue="jobs"} 1`) {
			t.Fatalf(".metrics: %s", m)
		}
		// .next is found by name only: never listed.
		wantNames(t, "queue dir", ls(t, q), "inbox", "processing", "delayed", "dlq", "archive", ".stats", ".policy")
	})
}

// The shell patterns of docs/contract.md §2: each commits exactly one whole
// message at the right moment.
func TestCommitPatterns(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		other := t.TempDir()
		os.WriteFile(filepath.Join(other, "src"), []byte("copied\n"), 0o644)
		os.WriteFile(filepath.Join(other, "moved"), []byte("moved\n"), 0o644)
		os.WriteFile(filepath.Join(other, "synced"), []byte("synced\n"), 0o644)
		testenv.MustSh(t, q, fmt.Sprintf(`
			echo hi > inbox/echo
			{ echo a; /bin/echo b; } > inbox/group
			touch inbox/empty
			cp %[1]s/src inbox/cp
			mv %[1]s/moved inbox/mv
			rsync %[1]s/synced inbox/rsync
			dd if=/dev/zero bs=1000 count=3 of=inbox/dd status=none
		`, other))
		want := map[string]string{"echo": "hi\n", "group": "a\nb\n", "empty": "", "cp": "copied\n", "mv": "moved\n", "rsync": "synced\n", "dd": strings.Repeat("\x00", 3000)}
		for name, body := range want {
			if got := readFile(t, filepath.Join(q, "inbox", name)); got != body {
				t.Errorf("%s = %q, want %q", name, got, body)
			}
		}
		if n := len(ls(t, filepath.Join(q, "inbox"))); n != len(want) {
			t.Errorf("inbox holds %d messages, want %d (rsync's temp file must not stay)", n, len(want))
		}
		if _, err := os.Stat(filepath.Join(other, "moved")); !os.IsNotExist(err) {
			t.Errorf("mv from another filesystem left its source: %v", err)
		}
		// A message is not visible before its close, and whole after it.
		// (A shell's `exec 3>f; echo >&3` would commit at the first echo:
		// the shell dup()s and closes the descriptor, a FLUSH from the
		// creator. docs/user-guide.md says so.)
		f, err := os.Create(filepath.Join(q, "inbox", "slow"))
		if err != nil {
			t.Fatal(err)
		}
		f.Write([]byte("part1\n"))
		for _, n := range ls(t, filepath.Join(q, "inbox")) {
			if n == "slow" {
				t.Errorf("a message is listed before its close")
			}
		}
		f.Write([]byte("part2\n"))
		if err := f.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		wantOut(t, "slow body", readFile(t, filepath.Join(q, "inbox", "slow")), "part1\npart2")
		// A child that inherited the descriptor does not commit early.
		wantOut(t, "fork", client(t, q, "fork-write", "inbox/forked"), "open=OK\nwrite=OK\nwrite=OK\nclose=OK")
		wantOut(t, "forked body", readFile(t, filepath.Join(q, "inbox", "forked")), "abc")
		// A multi-threaded writer that closes on another thread commits at that close.
		wantOut(t, "thread close", client(t, q, "thread-close", "inbox/threaded", "t"), "open=OK\nwrite=OK\nclose=OK")
		wantOut(t, "threaded body", readFile(t, filepath.Join(q, "inbox", "threaded")), "t")
		// fsync before close is harmless.
		testenv.MustSh(t, q, `dd if=/dev/zero of=inbox/synced-dd bs=10 count=1 conv=fsync status=none`)
	})
}

// Drafts: .NAME is never delivered; renamed to NAME it is committed.
func TestDrafts(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		testenv.MustSh(t, q, `echo draft > inbox/.tmp1`)
		wantOut(t, "next with only a draft", client(t, q, "next-nonblock", ".next"), "open=OK\nread=EAGAIN")
		wantNames(t, "inbox", ls(t, filepath.Join(q, "inbox")))
		testenv.MustSh(t, q, `mv inbox/.tmp1 inbox/final && test "$(cat inbox/final)" = draft`)
		r := testenv.Sh(t, q, `echo x > inbox/.tmp2 && mv inbox/.tmp2 processing/tmp2`)
		if r.Code == 0 || !strings.Contains(r.Stderr, "not permitted") {
			t.Fatalf("draft renamed out of inbox: %d %s", r.Code, r.Stderr)
		}
		testenv.MustSh(t, q, `rm inbox/.tmp2 && test ! -e inbox/.tmp2`)
	})
}

// Every row of the table of docs/contract.md §2, through mv, rm and touch.
func TestTransitions(t *testing.T) {
	policy := `{"visibilityTimeoutSec": 60, "retry": {"limit": 3, "backoff": "fixed", "initialDelaySec": 30, "maxDelaySec": 30}}`
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", policy)
		mkq(t, d, "next", "")
		testenv.MustSh(t, q, `
			for m in lease nack dead1 dead2 dead3 forward replay delete1 delete2 delete3 delete4 p1 p2; do echo "$m" > inbox/$m; done
			# receive = lease
			mv inbox/lease processing/
			test -f processing/lease
			# extend the lease, and set its deadline
			touch processing/lease
			touch -d '2030-01-01 00:00:00' processing/lease
			# nack: waits out its backoff in delayed/
			mv inbox/nack processing/ && mv processing/nack inbox/
			test -f delayed/nack
			# run now
			mv delayed/nack inbox/ && test -f inbox/nack
			# dead-letter by hand from inbox, processing and delayed
			mv inbox/dead1 dlq/
			mv inbox/dead2 processing/ && mv processing/dead2 dlq/
			mv inbox/dead3 processing/ && mv processing/dead3 inbox/ && mv delayed/dead3 dlq/
			test "$(ls dlq | wc -l)" = 3
			# redrive one, then all
			mv dlq/dead1 inbox/ && test -f inbox/dead1
			mv dlq/* inbox/ && test -z "$(ls dlq)"
			test "$(getfattr --only-values -n user.yirangmq.redrives inbox/dead2)" = 1
			test "$(getfattr --only-values -n user.yirangmq.attempts inbox/dead3)" = 0
			# ack and forward
			mv inbox/forward processing/ && mv processing/forward ../next/inbox/
			test "$(cat ../next/inbox/forward)" = forward && test -f archive/forward && test ! -e processing/forward
			# ack, then replay from archive
			mv inbox/replay processing/ && rm processing/replay && test -f archive/replay
			mv archive/replay inbox/ && test "$(cat inbox/replay)" = replay && test -f archive/replay
			# delete from inbox, delayed, dlq, archive
			rm inbox/delete1
			mv inbox/delete2 processing/ && mv processing/delete2 inbox/ && rm delayed/delete2
			mv inbox/delete3 dlq/ && rm dlq/delete3
			mv inbox/delete4 processing/ && rm processing/delete4 && rm archive/delete4
			test ! -e inbox/delete1 && test ! -e delayed/delete2 && test ! -e dlq/delete3 && test ! -e archive/delete4
			# purge
			rm inbox/*
			test -z "$(ls inbox)"
		`)
		// touch -d set the deadline, capped by maxLeaseSec (12 h by default).
		fi, err := os.Stat(filepath.Join(q, "processing", "lease"))
		if err != nil {
			t.Fatal(err)
		}
		if dl := time.Until(fi.ModTime()); dl < 11*time.Hour || dl > 13*time.Hour {
			t.Errorf("lease deadline after touch -d 2030: in %v, want about 12 h (the cap)", dl)
		}
	})
}

// Renames that the table does not have: EPERM; wrong place: ENOENT.
func TestForbiddenOperations(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		mkq(t, d, "other", "")
		testenv.MustSh(t, q, `echo x > inbox/m && echo y > inbox/leased && mv inbox/leased processing/`)
		cases := []struct{ script, want string }{
			{`echo more >> inbox/m`, "Operation not permitted"},
			{`echo over > inbox/m`, "Operation not permitted"},
			{`cp /etc/hostname inbox/m`, "Operation not permitted"},
			{`truncate -s 0 inbox/m`, "Operation not permitted"},
			{`ln inbox/m inbox/m2`, "Operation not permitted"},
			{`ln -s m inbox/sym`, "Operation not permitted"},
			{`mknod inbox/fifo p`, "Operation not permitted"},
			{`echo x > processing/new`, "Operation not permitted"},
			{`echo x > dlq/new`, "Operation not permitted"},
			{`echo x > newfile`, "Operation not permitted"},
			{`mv inbox/m inbox/.renamed`, "Operation not permitted"},
			// rename(2) onto a name that is live elsewhere in the queue is
			// EEXIST, yet the name is not in inbox/: GNU mv (9.1) then
			// reads its stat buffer of the target though lstat failed, and
			// says either "File exists" or, by what the buffer held,
			// "cannot overwrite directory". The syscall itself is checked
			// below it.
			{`mv inbox/m inbox/leased`, "File exists|cannot overwrite directory"},
			{`python3 -c 'import os; os.rename("inbox/m", "inbox/leased")'`, "FileExistsError"},
			{`mv processing/leased processing/renamed`, "Operation not permitted"},
			{`mv inbox/m archive/`, "Operation not permitted"},
			{`mv inbox/m delayed/`, "Operation not permitted"},
			{`mv inbox/m ../other/inbox/`, "Operation not permitted"},
			{`mkdir inbox/sub`, "Operation not permitted"},
			{`mkdir sub`, "Operation not permitted"},
			{`chown 1:1 inbox/m`, "Operation not permitted"},
			{`echo x > inbox/leased`, "File exists"},
			{`mv inbox/missing processing/`, "No such file"},
			{`rm processing/missing`, "No such file"},
			{`mv processing/m inbox/`, "No such file"},
			{`rmdir ../q`, "Directory not empty"},
			{`mkdir '../bad name'`, "Invalid argument"},
			{`mkdir ../.hidden`, "Invalid argument"},
			{`mkdir ../` + strings.Repeat("q", 129), "Invalid argument"},
		}
		for _, c := range cases {
			r := testenv.Sh(t, q, c.script)
			if r.Code == 0 || !slices.ContainsFunc(strings.Split(c.want, "|"), func(w string) bool { return strings.Contains(r.Stderr, w) }) {
				t.Errorf("%s: exit %d, %q; want an error with %q", c.script, r.Code, strings.TrimSpace(r.Stderr), c.want)
			}
		}
		// Nothing moved: m is still in inbox/, whole.
		if got := readFile(t, filepath.Join(q, "inbox", "m")); got != "x\n" {
			t.Fatalf("inbox/m = %q after refused operations", got)
		}
		if !strings.Contains(d.Log(), "immutable") {
			t.Errorf("no log line for a refused write")
		}
	})
}

// Of N racing renames exactly one wins; the losers get ENOENT.
func TestRacingLeases(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal"}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		for round := 0; round < 10; round++ {
			name := fmt.Sprintf("m%d", round)
			os.WriteFile(filepath.Join(q, "inbox", name), []byte("x"), 0o644)
			var wg sync.WaitGroup
			var mu sync.Mutex
			won, lost := 0, 0
			for i := 0; i < 8; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := os.Rename(filepath.Join(q, "inbox", name), filepath.Join(q, "processing", name))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						won++
					case os.IsNotExist(err):
						lost++
					default:
						t.Errorf("rename: %v", err)
					}
				}()
			}
			wg.Wait()
			if won != 1 || lost != 7 {
				t.Fatalf("round %d: %d won, %d lost", round, won, lost)
			}
		}
	})
}

// .next blocks, leases at the first read, returns EOF after; a signal
// interrupts it with EINTR and no lease; O_NONBLOCK gives EAGAIN.
func TestNext(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal"}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		wantOut(t, "nonblock, empty", client(t, q, "next-nonblock", ".next"), "open=OK\nread=EAGAIN")
		wantOut(t, "alarm while waiting", client(t, q, "next", ".next", "1"), "open=OK\nread=EINTR")
		testenv.MustSh(t, q, `echo job > inbox/j1`)
		if n := len(ls(t, filepath.Join(q, "processing"))); n != 0 {
			t.Fatalf("an interrupted .next left %d leases", n)
		}
		out := testenv.MustSh(t, q, `m=$(cat .next) && echo "$m" && cat "$m" && rm "$m"`)
		wantOut(t, "shell consumer", out, "processing/j1\njob")
		// A blocked reader wakes on publish.
		done := make(chan string, 1)
		go func() { done <- testenv.MustSh(t, q, `cat .next`) }()
		time.Sleep(100 * time.Millisecond) // let cat block first; nothing shows it (a reader not yet blocked gets j2 too)
		testenv.MustSh(t, q, `echo late > inbox/j2`)
		select {
		case got := <-done:
			wantOut(t, "woken reader", got, "processing/j2")
		case <-time.After(10 * time.Second):
			t.Fatal(".next did not wake on publish")
		}
		// timeout(1) sends SIGTERM: the reader dies, no lease is taken.
		r := testenv.Sh(t, q, `timeout 0.3 cat .next`)
		if r.Code != 124 {
			t.Fatalf("timeout cat .next: exit %d", r.Code)
		}
		testenv.MustSh(t, q, `echo after > inbox/j3 && test -f inbox/j3`)
		// Paused: renames into processing/ fail with EAGAIN, .next blocks.
		os.WriteFile(filepath.Join(q, ".policy"), []byte(`{"paused": true}`), 0o644)
		wantOut(t, "paused rename", client(t, q, "rename", "inbox/j3", "processing/j3"), "rename=EAGAIN")
		wantOut(t, "paused nonblock", client(t, q, "next-nonblock", ".next"), "open=OK\nread=EAGAIN")
	})
}

// The daemon never sends the kernel an entry invalidation (one can keep a
// killed daemon from exiting, docs/fusefs.md), so a move it makes by
// itself shows in ls at once (readdir always asks the daemon) and in stat
// within the cache timeout, and the name a .next lease returns can be
// read and acked at once (missing names are never cached).
func TestDaemonMovesVisibleWithinCacheTimeout(t *testing.T) {
	const cache = 2 * time.Second
	const slack = 3 * time.Second // a loaded machine; a stale entry would stay for good
	eachBackend(t, testenv.DaemonOptions{Sync: "normal", Args: []string{"--cache-timeout", cache.String()}}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"visibilityTimeoutSec": 1, "retry": {"limit": 0}}`)
		gone := func(rel string) bool {
			return testenv.RetryUntil(cache+slack, func() bool {
				_, err := os.Stat(filepath.Join(q, rel))
				return os.IsNotExist(err)
			})
		}

		// An expiry.
		testenv.MustSh(t, q, `echo x > inbox/m && mv inbox/m processing/ && stat processing/m >/dev/null`)
		if !testenv.RetryUntil(10*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(q, "dlq", "m"))
			return err == nil
		}) {
			t.Fatal("expired message never reached dlq/")
		}
		wantNames(t, "processing right after expiry", ls(t, filepath.Join(q, "processing")))
		if !gone("processing/m") {
			t.Fatalf("stat processing/m still finds the message %v after it expired", cache+slack)
		}
		out := testenv.MustSh(t, q, `getfattr --only-values -n user.yirangmq.reason dlq/m`)
		wantOut(t, "reason", out, "LEASE_EXPIRED")

		// A .next lease of a name the kernel caches in inbox/, after a
		// lookup of processing/NAME found nothing.
		q = mkq(t, d, "long", `{"visibilityTimeoutSec": 120}`)
		out = testenv.MustSh(t, q, `echo y > inbox/n && stat inbox/n >/dev/null && { stat processing/n 2>/dev/null || true; m=$(cat .next) && cat "$m"; }`)
		wantOut(t, "body read right after .next", out, "y")
		wantNames(t, "inbox right after .next", ls(t, filepath.Join(q, "inbox")))
		if !gone("inbox/n") {
			t.Fatalf("stat inbox/n still finds the message %v after .next leased it", cache+slack)
		}
		testenv.MustSh(t, q, `rm processing/n && test -f archive/n`)
	})
}

// Inode numbers fit in 32 bits and stay the same while a message moves.
func TestInodesAndTimestamps(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal"}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"visibilityTimeoutSec": 120}`)
		before := time.Now().Add(-time.Second)
		testenv.MustSh(t, q, `echo x > inbox/m`)
		ino := func(p string) uint64 {
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(q, p), &st); err != nil {
				t.Fatal(err)
			}
			return st.Ino
		}
		i1 := ino("inbox/m")
		fi, _ := os.Stat(filepath.Join(q, "inbox", "m"))
		if fi.ModTime().Before(before) || fi.ModTime().After(time.Now().Add(time.Second)) {
			t.Errorf("inbox mtime %v is not the commit time", fi.ModTime())
		}
		testenv.MustSh(t, q, `mv inbox/m processing/`)
		if i2 := ino("processing/m"); i2 != i1 {
			t.Errorf("inode changed from %d to %d on lease", i1, i2)
		}
		fi, _ = os.Stat(filepath.Join(q, "processing", "m"))
		if dl := time.Until(fi.ModTime()); dl < 100*time.Second || dl > 121*time.Second {
			t.Errorf("processing mtime is %v away, want the lease deadline (120 s)", dl)
		}
		if i1 > 0xFFFFFFFF {
			t.Errorf("inode %d does not fit in 32 bits", i1)
		}
		if out := client(t, q, "stat32", "processing/m"); !strings.Contains(out, "fits32=1") {
			t.Errorf("stat from C: %s", out)
		}
	})
}
