package fusefs_test

import (
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
