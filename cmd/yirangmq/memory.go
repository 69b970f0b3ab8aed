package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// parseMemoryBudget reads --memory-budget: "auto" (three quarters of the
// memory limit of the daemon's cgroup, or no budget when it has none),
// "off" or "0" (no budget), or a size: 48MiB, 48M, 512MB, 1GiB, 1G or
// plain bytes. It returns the budget in bytes (0: none) and, for auto, the
// cgroup limit it came from.
func parseMemoryBudget(s string) (budget, limit int64, err error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "auto", "":
		limit = cgroupMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup")
		return limit / 4 * 3, limit, nil
	case "off", "none", "0":
		return 0, 0, nil
	}
	num := strings.TrimRight(s, "BbiI")
	unit := int64(1)
	if n := len(num); n > 0 {
		switch num[n-1] {
		case 'k', 'K':
			unit, num = 1<<10, num[:n-1]
		case 'm', 'M':
			unit, num = 1<<20, num[:n-1]
		case 'g', 'G':
			unit, num = 1<<30, num[:n-1]
		}
	}
	v, perr := strconv.ParseInt(num, 10, 64)
	if perr != nil || v < 0 || v > (1<<50)/unit {
		return 0, 0, fmt.Errorf("--memory-budget %q: want auto, off or a size such as 48MiB", s)
	}
	if budget = v * unit; budget > 0 && budget < 16<<20 {
		return 0, 0, fmt.Errorf("--memory-budget %q: less than 16 MiB leaves the daemon no room to work", s)
	}
	return budget, 0, nil
}

// isAutoBudget reports whether --memory-budget follows the cgroup's limit.
func isAutoBudget(s string) bool {
	s = strings.ToLower(strings.TrimSpace(s))
	return s == "auto" || s == ""
}

// autoMemoryBudget is the budget of --memory-budget auto now: three
// quarters of the memory limit of the daemon's cgroup, 0 without one. It
// reads /proc/self/cgroup each time: a daemon moved to another cgroup
// follows the limit of the new one.
func autoMemoryBudget() int64 {
	return cgroupMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup") / 4 * 3
}

// heapLimit is the Go heap's soft limit under a memory budget: the heap is
// collected harder before the daemon nears the budget (the rest of it is
// SQLite's caches and the stacks). No budget, no limit.
func heapLimit(budget int64) int64 {
	if budget <= 0 {
		return math.MaxInt64
	}
	return budget / 4 * 3
}

// cgroupMemoryLimit returns the smallest memory limit on the way from the
// process's cgroup to the root, in bytes, or 0 if there is none: cgroup v2
// (memory.max, under root or root/unified) or v1 (memory.limit_in_bytes
// under root/memory).
func cgroupMemoryLimit(procCgroup, root string) int64 {
	f, err := os.Open(procCgroup)
	if err != nil {
		return 0
	}
	defer f.Close()
	var best int64
	consider := func(dir, file string) {
		for d := dir; ; d = filepath.Dir(d) {
			if b, err := os.ReadFile(filepath.Join(d, file)); err == nil {
				v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				// "max", or v1's "no limit" (a huge page-aligned value).
				if err == nil && v > 0 && v < 1<<60 && (best == 0 || v < best) {
					best = v
				}
			}
			if len(d) <= len(root) || d == filepath.Dir(d) {
				return
			}
		}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		path := filepath.Clean("/" + parts[2])
		if parts[0] == "0" && parts[1] == "" { // v2
			for _, base := range []string{root, filepath.Join(root, "unified")} {
				consider(filepath.Join(base, path), "memory.max")
			}
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				consider(filepath.Join(root, "memory", path), "memory.limit_in_bytes")
			}
		}
	}
	return best
}
