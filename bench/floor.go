package main

import (
	"context"

	"golang.org/x/sys/unix"
)

// floorKind is how the FUSE request floor is probed, on a mount whose
// entry and attribute timeouts are 0 so that the kernel caches nothing.
type floorKind int

const (
	// floorFstat: fstat(2) of an open descriptor of the mount's root,
	// exactly one GETATTR, whose handler does no work. This is the
	// floor: a request's round trip through the kernel and go-fuse.
	floorFstat floorKind = iota
	// floorStat: stat(2) of QUEUE/.stats by path, the path walk's LOOKUPs
	// and GETATTR, for comparison with the baseline "stat() 125 µs" (docs/mount-bench.md).
	floorStat
)

func (k floorKind) String() string { return [...]string{"floor-fstat", "floor-stat"}[k] }

// runFloor runs n probes split over clients goroutines, each fstat probe
// on a descriptor of its client's own.
func runFloor(ctx context.Context, kind floorKind, path string, n, clients int) (phaseResult, error) {
	fds := make([]int, clients)
	if kind == floorFstat {
		for c := range fds {
			fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				for _, open := range fds[:c] {
					unix.Close(open)
				}
				return phaseResult{}, err
			}
			fds[c] = fd
		}
		defer func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}()
	}
	return runFuncPhase(ctx, n, clients, func(c, _ int) error {
		var st unix.Stat_t
		if kind == floorFstat {
			return unix.Fstat(fds[c], &st)
		}
		return unix.Stat(path, &st)
	})
}
