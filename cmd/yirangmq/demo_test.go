package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"yirangmq/testenv"
)

// `make demo` on a machine without attr (getfattr): it runs to the end,
// and says once why it shows the dead letters' reasons another way
// (issue 40: it stopped with "getfattr: command not found" and Error 127).
// The tools are the test machine's, less getfattr and setfattr.
func TestDemoWithoutGetfattr(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("make demo mounts: needs root")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	tools := t.TempDir()
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			name := e.Name()
			if name == "getfattr" || name == "setfattr" {
				continue
			}
			if _, err := os.Lstat(filepath.Join(tools, name)); err == nil {
				continue // the first on PATH wins, as for the shell
			}
			os.Symlink(filepath.Join(dir, name), filepath.Join(tools, name))
		}
	}
	demo := filepath.Join(t.TempDir(), "demo")
	cmd := exec.Command("make", "--no-print-directory", "-C", root, "demo")
	cmd.Env = append(os.Environ(), "PATH="+tools, "DEMO_DIR="+demo)
	out, err := cmd.CombinedOutput()
	t.Cleanup(func() { testenv.Unmount(filepath.Join(demo, "mnt")) })
	if err != nil {
		t.Fatalf("make demo without getfattr: %v\n%s", err, out)
	}
	got := string(out)
	if strings.Contains(got, "command not found") {
		t.Errorf("make demo ran a tool that is not there:\n%s", got)
	}
	for _, want := range []string{
		"getfattr is not installed (apt-get install attr)",
		"dead-lettered (its retries are spent",
		"last refused in jobs",
		"## Unmount",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("make demo did not say %q:\n%s", want, got)
		}
	}
	if testenv.IsMounted(filepath.Join(demo, "mnt")) {
		t.Errorf("make demo left its mount behind")
	}
}
