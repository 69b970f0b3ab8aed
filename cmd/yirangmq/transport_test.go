package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"yirangmq/testenv"
)

// -o transport= (and --transport) chooses how the kernel and the daemon
// talk; the log says which one serves and why, and a transport that
// cannot be had fails the mount with a clear message.
func TestTransportOption(t *testing.T) {
	offered := false
	if b, err := os.ReadFile("/sys/module/fuse/parameters/enable_uring"); err == nil {
		offered = strings.TrimSpace(string(b)) == "Y"
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		option, want string
	}{
		{"transport=classic", `msg=transport transport=classic reason="classic transport asked for"`},
		{"transport=uring", `msg=transport transport=uring reason="kernel offers FUSE over io_uring`},
		{"transport=auto", `msg=transport transport=uring reason="kernel offers FUSE over io_uring`},
	} {
		t.Run(tc.option, func(t *testing.T) {
			store, mp := filepath.Join(dir, tc.option), filepath.Join(dir, tc.option+"-mnt")
			os.Mkdir(mp, 0o755)
			t.Cleanup(func() { testenv.Unmount(mp) })
			out, err := exec.Command(testenv.Binary(t), store, mp, "-o", "backend=sqlite,"+tc.option).CombinedOutput()
			logFile := filepath.Join(store, "yirangmq.log")
			if !offered && tc.option != "transport=classic" {
				// Without the kernel's offer: uring fails, auto serves classic.
				b, _ := os.ReadFile(logFile)
				if tc.option == "transport=uring" {
					if err == nil || !strings.Contains(string(out)+string(b), "kernel does not offer FUSE over io_uring") {
						t.Fatalf("transport=uring without the kernel's offer: %v\n%s\n%s", err, out, b)
					}
					return
				}
				tc.want = "msg=transport transport=classic"
			}
			if err != nil {
				t.Fatalf("helper call: %v\n%s", err, out)
			}
			mountWorks(t, mp)
			b, _ := os.ReadFile(logFile)
			if strings.Count(string(b), "msg=transport ") != 1 || !strings.Contains(string(b), tc.want) {
				t.Errorf("want one log line with %s:\n%s", tc.want, b)
			}
			if err := syscall.Unmount(mp, 0); err != nil {
				t.Fatal(err)
			}
			waitStopped(t, logFile)
		})
	}
	r := cli(t, "", "mount", "--store", filepath.Join(dir, "bad"), "--transport", "pigeon", filepath.Join(dir, "badmnt"))
	if r.code == 0 || !strings.Contains(r.stderr, `unknown transport "pigeon"`) {
		t.Errorf("--transport pigeon: exit %d, %q", r.code, r.stderr)
	}
}
