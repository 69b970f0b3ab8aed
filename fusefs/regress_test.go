package fusefs_test

import (
	"os"
	"path/filepath"
	"testing"

	"yirangmq/testenv"
)

// A draft whose rename fails (the name is live elsewhere) stays a draft:
// a failed rename(2) leaves its source where it was.
func TestFailedDraftRenameKeepsDraft(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal"}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		testenv.MustSh(t, q, `echo first > inbox/Y && mv inbox/Y processing/ && echo body > inbox/.Y.tmp`)
		r := testenv.Sh(t, q, `mv inbox/.Y.tmp inbox/Y`)
		if r.Code == 0 {
			t.Fatal("draft renamed onto a name live in processing/")
		}
		wantOut(t, "draft after the failed rename", testenv.MustSh(t, q, `cat inbox/.Y.tmp`), "body")
		testenv.MustSh(t, q, `rm processing/Y && mv inbox/.Y.tmp inbox/Y && test "$(cat inbox/Y)" = body`)
	})
}

// A .next lease is invisible to the kernel; a name it cached as missing
// must not fail the consumer's ack.
func TestNextLeaseAckWithStaleNegativeEntry(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal", Args: []string{"--cache-timeout", "60s"}}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		testenv.MustSh(t, q, `
			stat processing/X 2>/dev/null || true   # the kernel caches "no such file"
			echo x > inbox/X
			m=$(cat .next)
			test "$m" = processing/X
			rm "$m"
			test -f archive/X
			test ! -e inbox/X
		`)
	})
}

// The kernel keeps the name a CREATE made (the lease that follows needs no
// LOOKUP of its source), and is not told when the commit puts the message
// elsewhere or nowhere: the kept name must then answer as a fresh lookup
// would, never with a message from another directory, and a new publish
// under it must work at once.
func TestKeptCreateName(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal", Args: []string{"--cache-timeout", "60s"}}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"maxMessageBytes": 4}`)
		testenv.MustSh(t, q, `
			# refused at its commit (EFBIG): nothing under that name
			if echo toolong > inbox/A; then exit 1; fi
			test ! -e inbox/A
			if cat inbox/A 2>/dev/null; then exit 2; fi
			test -z "$(ls inbox)"
			# published again under the same name at once
			echo ok > inbox/A
			test "$(cat inbox/A)" = ok
			# leased and acked behind the kernel's back, then published again
			m=$(cat .next)
			test "$m" = processing/A
			rm "$m"
			test ! -e inbox/A
			echo no > inbox/A
			test "$(cat inbox/A)" = no
			# the usual lease of a kept name, and its ack
			mv inbox/A processing/
			test "$(cat processing/A)" = no
			test ! -e inbox/A
			rm processing/A
			test ! -e processing/A
		`)
	})
}

// getxattr and listxattr by a name the kernel kept from before a .next
// lease moved the message must answer as a fresh lookup would (no such
// file), not with the lease of processing/X; by a descriptor (fgetxattr,
// which reaches the daemon the same way) they answer for the message
// wherever it went.
func TestXattrOfKeptNameAfterMove(t *testing.T) {
	keptNamesSh(t, `
			set -e
			echo x > inbox/X
			getfattr -d inbox/X > /dev/null   # the kernel keeps the name
			test "$(cat .next)" = processing/X
			for call in 'os.getxattr("inbox/X", "user.yirangmq.lease_deadline")' 'os.listxattr("inbox/X")'; do
				err=$(python3 -c "import os; print($call)" 2>&1) && { echo "$call by the kept name: $err" >&2; exit 1; }
				case "$err" in *FileNotFoundError*) ;; *) echo "$call by the kept name: $err" >&2; exit 1;; esac
			done
			getfattr -n user.yirangmq.lease_deadline processing/X > /dev/null
			echo y > inbox/Y
			python3 -c '
import os
fd = os.open("inbox/Y", os.O_RDONLY)
m = open(".next").read().strip()
assert m == "processing/Y", m
assert os.getxattr(fd, "user.yirangmq.lease_deadline"), "fgetxattr"
assert "user.yirangmq.lease_deadline" in os.listxattr(fd), "flistxattr"
'
	`)
}

// touch by a name the kernel kept from before a .next lease moved the
// message behind its back reaches the daemon as a SETATTR of the old
// inode. It must answer as a fresh lookup would (no inbox/T any more),
// not extend the lease the .next reader holds on processing/T.
func TestTouchOfKeptNameAfterMove(t *testing.T) {
	keptNamesSh(t, `
			set -e
			echo x > inbox/T
			stat inbox/T > /dev/null          # the kernel keeps the name and its attributes
			m=$(cat .next)
			test "$m" = processing/T
			# truncate(2) by the kept name: no such file, as after a fresh
			# lookup (not EPERM for the message now in processing/)
			err=$(python3 -c 'import os; os.truncate("inbox/T", 0)' 2>&1) && exit 1
			case "$err" in *FileNotFoundError*) ;; *) echo "truncate of the kept inbox/T: $err" >&2; exit 1;; esac
			python3 -c 'import os; os.truncate("processing/T", 0)' 2>&1 | grep -q PermissionError
			echo x > inbox/T2
			stat inbox/T2 > /dev/null
			test "$(cat .next)" = processing/T2
			later=$(( $(date +%s) + 3600 ))
			touch -c -d @$later inbox/T2      # -c: no such file is not an error
			test ! -e inbox/T2
			deadline=$(stat -c %Y processing/T2)
			if [ "$deadline" -ge "$later" ]; then
				echo "touch of the kept inbox/T2 extended the lease of processing/T2 to $deadline" >&2
				exit 1
			fi
			touch -c -d @$later processing/T2 # the holder's own touch does
			test "$(stat -c %Y processing/T2)" -eq "$later"
	`)
}

// A tool that sets the times and mode of its file by path after the
// close (shutil.copy2) must not fail when the commit put the message
// somewhere else (a delay in its envelope) or a consumer leased it at
// once: its message was published, and a reported failure would make a
// retry publish it twice. The SETATTR through the kept name changes
// nothing then, and succeeds.
func TestCopyStatAfterCommitMovedIt(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", `{"format": "envelope"}`)
		src := filepath.Join(t.TempDir(), "src")
		if err := os.WriteFile(src, []byte(`{"attributes": {"delaySec": 30}, "payload": "later"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		testenv.MustSh(t, q, `set -e
			python3 -c 'import shutil, sys; shutil.copy2(sys.argv[1], "inbox/D")' `+src+`
			test -f delayed/D
			test ! -e inbox/D`)
	})
}

// keptNamesSh runs script in a queue "q" with 60 s leases, on a daemon of
// each store that lets the kernel keep names 60 s: only a fresh lookup
// changes what it holds.
func keptNamesSh(t *testing.T, script string) {
	t.Helper()
	eachBackend(t, testenv.DaemonOptions{Sync: "normal", Args: []string{"--cache-timeout", "60s"}}, func(t *testing.T, d *testenv.Daemon) {
		testenv.MustSh(t, mkq(t, d, "q", `{"visibilityTimeoutSec": 60}`), script)
	})
}
