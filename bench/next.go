package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// nextResult is the .next wake-up measured over many samples.
type nextResult struct {
	// Wake runs from just before the publisher's open(2) to the return of
	// the reader's read(2) of .next; AfterClose from the return of the
	// publisher's close(2) to the same point (negative when the reader
	// was woken before close returned: the commit happens at FLUSH).
	Wake, AfterClose latencies
	// Unconfirmed counts samples where the reader was not seen blocked
	// in the kernel before the publish (then we waited 2 ms instead).
	Unconfirmed int
}

// runNext measures the .next wake-up: a reader thread blocks in read(2)
// of QUEUE/.next; once /proc shows it waiting for the FUSE answer, a
// publish starts; the sample ends when read returns. The leased message
// is acked outside the timed window.
func runNext(ctx context.Context, queueDir string, first, samples int) (nextResult, error) {
	var res nextResult
	type readDone struct {
		at   time.Time
		line string
		err  error
	}
	goCh := make(chan struct{})
	openedCh := make(chan error)
	tidCh := make(chan int, 1)
	doneCh := make(chan readDone, 1) // a reader left blocked at an error never blocks again
	// One locked OS thread reads, so /proc/self/task/TID says when its
	// read is parked in the kernel.
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tidCh <- unix.Gettid()
		buf := make([]byte, 512)
		for range goCh {
			fd, err := unix.Open(filepath.Join(queueDir, ".next"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			openedCh <- err
			if err != nil {
				continue
			}
			n, err := unix.Read(fd, buf)
			at := time.Now()
			unix.Close(fd)
			doneCh <- readDone{at: at, line: string(buf[:max(n, 0)]), err: err}
		}
	}()
	defer close(goCh)
	tid := <-tidCh
	body := make([]byte, msgSize)
	for i := range samples {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		name := fmt.Sprintf("next-%06d", first+i)
		goCh <- struct{}{}
		if err := <-openedCh; err != nil {
			return res, fmt.Errorf("open .next: %w", err)
		}
		if !waitBlocked(tid, 200*time.Millisecond) {
			res.Unconfirmed++
			time.Sleep(2 * time.Millisecond)
		}
		t0 := time.Now()
		if err := publish(filepath.Join(queueDir, "inbox", name), body, false, -1); err != nil {
			return res, fmt.Errorf("publish %s: %w", name, err)
		}
		t1 := time.Now()
		var d readDone
		select {
		case d = <-doneCh:
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(10 * time.Second):
			return res, fmt.Errorf(".next did not return within 10 s of publishing %s", name)
		}
		if d.err != nil {
			return res, fmt.Errorf("read .next: %w", d.err)
		}
		if want := "processing/" + name + "\n"; d.line != want {
			return res, fmt.Errorf(".next returned %q, want %q", d.line, want)
		}
		res.Wake = append(res.Wake, d.at.Sub(t0))
		res.AfterClose = append(res.AfterClose, d.at.Sub(t1))
		if err := unix.Unlink(filepath.Join(queueDir, "processing", name)); err != nil {
			return res, fmt.Errorf("ack %s: %w", name, err)
		}
	}
	return res, nil
}

// waitBlocked waits until thread tid sleeps in the FUSE request wait.
func waitBlocked(tid int, limit time.Duration) bool {
	base := "/proc/self/task/" + strconv.Itoa(tid) + "/"
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		w, _ := os.ReadFile(base + "wchan")
		if s := string(w); strings.Contains(s, "request_wait_answer") || strings.Contains(s, "fuse") {
			return true
		}
		time.Sleep(50 * time.Microsecond)
	}
	return false
}
