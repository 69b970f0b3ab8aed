package membound

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Cgroup is a memory cgroup made for one daemon (v1 or v2).
type Cgroup struct {
	Dir string
	v2  bool
}

// NewCgroup makes a memory cgroup named name under the cgroup of this
// process, limited to limit bytes (and no swap); 0 or less: no limit.
func NewCgroup(name string, limit int64) (*Cgroup, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var v1Path, v2Path string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2Path = parts[2]
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				v1Path = parts[2]
			}
		}
	}
	if v1Path != "" {
		if base := filepath.Join("/sys/fs/cgroup/memory", v1Path); exists(filepath.Join(base, "memory.limit_in_bytes")) {
			cg := &Cgroup{Dir: filepath.Join(base, name)}
			if err := os.Mkdir(cg.Dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, err
			}
			if err := cg.SetLimit(limit); err != nil {
				cg.Remove()
				return nil, err
			}
			return cg, nil
		}
	}
	if v2Path != "" {
		base := filepath.Join("/sys/fs/cgroup", v2Path)
		if !exists(filepath.Join(base, "cgroup.controllers")) {
			base = filepath.Join("/sys/fs/cgroup/unified", v2Path)
		}
		ctl, err := os.ReadFile(filepath.Join(base, "cgroup.controllers"))
		if err != nil || !strings.Contains(" "+string(ctl)+" ", " memory ") {
			return nil, fmt.Errorf("no memory controller in cgroup v2 at %s", base)
		}
		_ = os.WriteFile(filepath.Join(base, "cgroup.subtree_control"), []byte("+memory"), 0)
		cg := &Cgroup{Dir: filepath.Join(base, name), v2: true}
		if err := os.Mkdir(cg.Dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		if err := cg.SetLimit(limit); err != nil {
			cg.Remove()
			return nil, err
		}
		_ = write(filepath.Join(cg.Dir, "memory.swap.max"), 0)
		return cg, nil
	}
	return nil, errors.New("no memory cgroup found")
}

// SetLimit sets the cgroup's memory limit (and no swap), as `systemctl
// set-property MemoryMax=` does for a service's; 0 or less: no limit.
func (c *Cgroup) SetLimit(limit int64) error {
	if c.v2 {
		v := "max"
		if limit > 0 {
			v = strconv.FormatInt(limit, 10)
		}
		return os.WriteFile(filepath.Join(c.Dir, "memory.max"), []byte(v), 0)
	}
	if limit <= 0 {
		limit = -1
	}
	// v1: memory+swap may not be under memory alone; raise it first,
	// lower it last.
	memsw := filepath.Join(c.Dir, "memory.memsw.limit_in_bytes")
	hasSwap := exists(memsw)
	if hasSwap {
		_ = write(memsw, -1)
	}
	if err := write(filepath.Join(c.Dir, "memory.limit_in_bytes"), limit); err != nil {
		return err
	}
	if hasSwap {
		_ = write(memsw, limit)
	}
	return nil
}

// Wrap is a command prefix (testenv.DaemonOptions.Wrap) that moves the
// daemon into the cgroup before it starts.
func (c *Cgroup) Wrap() []string {
	return []string{"sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(c.Dir, "cgroup.procs")}
}

// OOMKills is how many processes the kernel's OOM killer ended in it.
func (c *Cgroup) OOMKills() int64 {
	file := "memory.oom_control"
	if c.v2 {
		file = "memory.events"
	}
	b, _ := os.ReadFile(filepath.Join(c.Dir, file))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// Peak is the cgroup's peak memory use (page cache included), or 0.
func (c *Cgroup) Peak() int64 {
	file := "memory.max_usage_in_bytes"
	if c.v2 {
		file = "memory.peak"
	}
	b, _ := os.ReadFile(filepath.Join(c.Dir, file))
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// Remove deletes the cgroup once its processes are gone.
func (c *Cgroup) Remove() { _ = os.Remove(c.Dir) }

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func write(p string, v int64) error {
	return os.WriteFile(p, []byte(strconv.FormatInt(v, 10)), 0)
}

// ProcMemory returns the VmRSS and VmHWM (peak RSS) of pid, in bytes.
func ProcMemory(pid int) (rss, hwm int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = n << 10
		case "VmHWM":
			hwm = n << 10
		}
	}
	return rss, hwm
}
