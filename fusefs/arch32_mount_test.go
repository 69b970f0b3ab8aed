package fusefs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"yirangmq/testenv"
)

// TestPolicyFtruncatePast32Bits: ftruncate of a .policy being written to
// 2^32+1 bytes changes nothing (the document only ever shortens), and the
// document written before is the one committed at close. On armv7 the
// size wrapped to 1 and the request panicked (EIO); make test-cross runs
// this against the ARM daemons under qemu with CROSS_MOUNT=1.
func TestPolicyFtruncatePast32Bits(t *testing.T) {
	eachBackend(t, testenv.DaemonOptions{Sync: "normal"}, func(t *testing.T, d *testenv.Daemon) {
		q := mkq(t, d, "q", "")
		f, err := os.OpenFile(filepath.Join(q, ".policy"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(`{"visibilityTimeoutSec": 77}`); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(1<<32 + 1); err != nil {
			t.Fatalf("ftruncate to 2^32+1: %v", err)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("close (the commit): %v", err)
		}
		got, err := os.ReadFile(filepath.Join(q, ".policy"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.ReplaceAll(string(got), " ", ""), `"visibilityTimeoutSec":77`) {
			t.Fatalf(".policy after the commit:\n%s", got)
		}
	})
}
