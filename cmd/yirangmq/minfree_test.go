package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"yirangmq/queuecore"
	"yirangmq/testenv"
)

// -o min_free= (and --min-free) sets the free-space floor shown in
// MOUNT/.stats; a bad size fails the mount with a clear message.
func TestMinFreeOption(t *testing.T) {
	dir := t.TempDir()
	store, mp := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	os.Mkdir(mp, 0o755)
	t.Cleanup(func() { testenv.Unmount(mp) })
	out, err := exec.Command(testenv.Binary(t), store, mp, "-o", "backend=sqlite,min_free=3M").CombinedOutput()
	if err != nil {
		t.Fatalf("helper call: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(mp, ".stats"))
	if err != nil {
		t.Fatal(err)
	}
	var st queuecore.DaemonStats
	if err := json.Unmarshal(b, &st); err != nil || st.Disk == nil || st.Disk.MinFreeBytes != 3<<20 || st.Disk.Low {
		t.Errorf(".stats disk with min_free=3M: %s (%v)", b, err)
	}
	if err := syscall.Unmount(mp, 0); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, filepath.Join(store, "yirangmq.log"))
	r := cli(t, "", "mount", "--store", store, "-o", "min_free=lots", mp)
	if r.code == 0 || !strings.Contains(r.stderr, "--min-free") {
		t.Errorf("min_free=lots: exit %d, %q", r.code, r.stderr)
	}
}
