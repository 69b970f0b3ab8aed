package main

import (
	"context"
	"errors"
	"sync"
	"time"

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
	// and GETATTR, for comparison with BASELINES.md's "stat() 125 µs".
	floorStat
)

func (k floorKind) String() string { return [...]string{"floor-fstat", "floor-stat"}[k] }

// runFloor runs n probes split over clients goroutines.
func runFloor(ctx context.Context, kind floorKind, path string, n, clients int) (phaseResult, error) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	lats := make([]latencies, clients)
	errs := make([]error, clients)
	for c := range clients {
		count := n / clients
		wg.Add(1)
		go func() {
			defer wg.Done()
			fd := -1
			if kind == floorFstat {
				var err error
				if fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
					errs[c] = err
					<-start
					return
				}
				defer unix.Close(fd)
			}
			lat := make(latencies, 0, count)
			var st unix.Stat_t
			<-start
			for i := range count {
				if i%256 == 0 && ctx.Err() != nil {
					errs[c] = ctx.Err()
					break
				}
				t0 := time.Now()
				var err error
				if kind == floorFstat {
					err = unix.Fstat(fd, &st)
				} else {
					err = unix.Stat(path, &st)
				}
				lat = append(lat, time.Since(t0))
				if err != nil {
					errs[c] = err
					break
				}
			}
			lats[c] = lat
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(t0)
	var all latencies
	for _, l := range lats {
		all = append(all, l...)
	}
	return phaseResult{wall: wall, lat: all}, errors.Join(errs...)
}
