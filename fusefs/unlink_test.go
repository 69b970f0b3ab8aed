package fusefs_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// An empty message is committed at RELEASE, which the kernel sends after
// close(2) has returned, so an unlink right after the close races that
// commit. Whichever wins, the unlink must not fail with ENOENT, and an
// unlink that returned 0 must leave nothing to deliver, then or after a
// restart (issue 40: 20 of 1000 got ENOENT, and 4 to 10 came back).
func TestUnlinkRightAfterCloseOfEmptyFile(t *testing.T) {
	const rounds = 1000
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		inbox := filepath.Join(q, "inbox")
		var enoent, other int
		var firstErr error
		for i := range rounds {
			for _, size := range []int{0, 1} {
				path := filepath.Join(inbox, fmt.Sprintf("g%d-%d", i, size))
				fd, err := unix.Open(path, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
				if err != nil {
					t.Fatalf("create %s: %v", path, err)
				}
				if size > 0 {
					if _, err := unix.Write(fd, []byte("x")); err != nil {
						t.Fatalf("write %s: %v", path, err)
					}
				}
				if err := unix.Close(fd); err != nil {
					t.Fatalf("close %s: %v", path, err)
				}
				switch err := unix.Unlink(path); {
				case err == nil:
				case errors.Is(err, unix.ENOENT):
					enoent++
				default:
					other++
					if firstErr == nil {
						firstErr = fmt.Errorf("unlink %s: %w", path, err)
					}
				}
			}
		}
		if enoent != 0 || other != 0 {
			t.Errorf("%d rounds of create, close, unlink: %d unlinks got ENOENT, %d failed otherwise (first: %v)", 2*rounds, enoent, other, firstErr)
		}
		left := func(when string) {
			t.Helper()
			for _, dir := range []string{"inbox", "delayed", "processing", "dlq"} {
				if names := ls(t, filepath.Join(q, dir)); len(names) != 0 {
					t.Errorf("%s: %d removed messages are in %s/, e.g. %q", when, len(names), dir, names[0])
				}
			}
			if n := stat(t, q, "ready"); n != 0 {
				t.Errorf("%s: .stats says %v ready", when, n)
			}
		}
		left("after the unlinks")
		// What a late RELEASE might still commit has been committed once
		// the daemon has unmounted cleanly.
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		d.Restart(t)
		left("after a restart")
	})
}
