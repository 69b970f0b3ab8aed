package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseMemoryBudget(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"off", 0, false},
		{"0", 0, false},
		{"48MiB", 48 << 20, false},
		{"48M", 48 << 20, false},
		{"48mb", 48 << 20, false},
		{"1GiB", 1 << 30, false},
		{"67108864", 64 << 20, false},
		{"20000K", 20000 << 10, false},
		{"8MiB", 0, true}, // too small to work in
		{"-5M", 0, true},
		{"lots", 0, true},
		{"12XB", 0, true},
	} {
		got, _, err := parseMemoryBudget(c.in)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("parseMemoryBudget(%q) = %d, %v; want %d, error %v", c.in, got, err, c.want, c.bad)
		}
	}
}

// The smallest limit from the process's cgroup up to the root counts, in
// cgroup v1 and v2; "max" and v1's huge "no limit" are none.
func TestCgroupMemoryLimit(t *testing.T) {
	root := t.TempDir()
	put := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	proc := filepath.Join(root, "proc-cgroup")

	put("memory/memory.limit_in_bytes", "9223372036854771712\n")
	put("memory/svc/memory.limit_in_bytes", "134217728\n")
	put("memory/svc/daemon/memory.limit_in_bytes", "9223372036854771712\n")
	put("proc-cgroup", "12:pids:/svc/daemon\n4:cpu,memory:/svc/daemon\n0::/\n")
	if got := cgroupMemoryLimit(proc, root); got != 128<<20 {
		t.Errorf("v1: %d, want %d (the parent's limit)", got, 128<<20)
	}

	root = t.TempDir()
	proc = filepath.Join(root, "proc-cgroup")
	put("system.slice/memory.max", "max\n")
	put("system.slice/yirangmq.service/memory.max", "67108864\n")
	put("proc-cgroup", "0::/system.slice/yirangmq.service\n")
	if got := cgroupMemoryLimit(proc, root); got != 64<<20 {
		t.Errorf("v2: %d, want %d", got, 64<<20)
	}
	put("system.slice/yirangmq.service/memory.max", "max\n")
	if got := cgroupMemoryLimit(proc, root); got != 0 {
		t.Errorf("v2 without a limit: %d, want 0", got)
	}
	if got := cgroupMemoryLimit(filepath.Join(root, "missing"), root); got != 0 {
		t.Errorf("no /proc/self/cgroup: %d, want 0", got)
	}
}
