package fusefs_test

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"yirangmq/testenv"
)

// The three read-only pseudo-files (QUEUE/.stats, MOUNT/.stats,
// MOUNT/.metrics) each answer for themselves: a mode without write bits,
// an inode of their own, EPERM for an open to write (also for root, whom
// the kernel's permission check lets through), and their own document.
func TestReadOnlyPseudoFiles(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{}, func(t *testing.T, d *testenv.Daemon) {
		mkq(t, d, "jobs", "")
		files := map[string]string{ // path: what its document holds
			d.Path("jobs", ".stats"): `"published_total"`,
			d.Path(".stats"):         `"queue": "jobs"`,
			d.Path(".metrics"):       `yirangmq_published_total{queue="jobs"}`,
		}
		inos := map[uint64]string{}
		for p, want := range files {
			var st syscall.Stat_t
			if err := syscall.Stat(p, &st); err != nil {
				t.Fatalf("stat %s: %v", p, err)
			}
			if st.Mode&0o222 != 0 || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
				t.Errorf("%s: mode %o, want a regular file without write bits", p, st.Mode)
			}
			if other, ok := inos[st.Ino]; ok {
				t.Errorf("%s and %s share inode %d", p, other, st.Ino)
			}
			inos[st.Ino] = p
			for _, flag := range []int{os.O_WRONLY, os.O_RDWR} {
				f, err := os.OpenFile(p, flag, 0)
				if err == nil {
					f.Close()
					t.Errorf("open %s with flags %#x succeeded, want EPERM", p, flag)
				} else if !errors.Is(err, syscall.EPERM) {
					t.Errorf("open %s with flags %#x: %v, want EPERM", p, flag, err)
				}
			}
			if got := readFile(t, p); !strings.Contains(got, want) {
				t.Errorf("%s holds no %s:\n%s", p, want, got)
			}
		}
	})
}
