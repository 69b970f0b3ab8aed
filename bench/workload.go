package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// msgSize is the body size the issue asks for.
const msgSize = 256

// queueDirs are the two directories the three operations use: a queue's
// inbox/ and processing/ through the mount, or two plain directories.
type queueDirs struct {
	inbox, processing string
	// durable makes the plain-directory operations durable by hand, as
	// a careful program without the queue would: fdatasync of the file,
	// fsync of each directory changed. Never set for a mount (the
	// daemon's --sync does that).
	durable bool
	// tmp, when set (with durable), makes a publish what a careful Maildir
	// writer does: create and write tmp/NAME, fsync it, rename it into
	// inbox/, fsync inbox/.
	tmp string
	// syncAtClose makes a plain-directory publish fdatasync its file
	// before close(2), and nothing else: what --sync full promises a
	// publisher (leases and acks sync nothing). Never set for a mount.
	syncAtClose bool
}

// opKind is one of the three message operations.
type opKind int

const (
	opPublish   opKind = iota // create+write+close inbox/NAME
	opLease                   // rename inbox/NAME → processing/NAME
	opAck                     // unlink processing/NAME
	opRoundTrip               // publish, lease and ack of one message, in a row
)

func (k opKind) String() string { return [...]string{"publish", "lease", "ack", "roundtrip"}[k] }

// latencies collects one duration per operation.
type latencies []time.Duration

type summary struct {
	N      int     `json:"n"`
	MeanUS float64 `json:"mean_us"`
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`
	MaxUS  float64 `json:"max_us"`
}

func (l latencies) summary() summary {
	if len(l) == 0 {
		return summary{}
	}
	s := slices.Clone(l)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	us := func(d time.Duration) float64 { return round1(float64(d) / 1e3) }
	q := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return summary{N: len(s), MeanUS: us(sum / time.Duration(len(s))), P50US: us(q(0.50)), P99US: us(q(0.99)), MaxUS: us(s[len(s)-1])}
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }
func round2(f float64) float64 { return math.Round(f*100) / 100 }

// msgName is client c's i-th message in a pass.
func msgName(pass string, c, i int) string { return fmt.Sprintf("%s-c%d-%06d", pass, c, i) }

// phaseResult is one operation run by all clients at once.
type phaseResult struct {
	wall time.Duration
	lat  latencies
}

// runPhase runs op for n messages split over clients goroutines, each
// with its own names, all released at once; the wall time runs from the
// release to the last client's end.
func runPhase(ctx context.Context, q queueDirs, op opKind, pass string, n, clients int) (phaseResult, error) {
	body := make([]byte, msgSize)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	lats := make([]latencies, clients)
	errs := make([]error, clients)
	for c := range clients {
		count := n / clients
		if c < n%clients {
			count++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lats[c], errs[c] = runClient(ctx, q, op, pass, c, count, body, start)
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(t0)
	var all latencies
	for c := range clients {
		all = append(all, lats[c]...)
	}
	return phaseResult{wall: wall, lat: all}, errors.Join(errs...)
}

func runClient(ctx context.Context, q queueDirs, op opKind, pass string, c, count int, body []byte, start <-chan struct{}) (latencies, error) {
	lat := make(latencies, 0, count)
	var inboxFD, procFD int = -1, -1
	if q.durable {
		var err error
		if inboxFD, err = unix.Open(q.inbox, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return nil, err
		}
		defer unix.Close(inboxFD)
		if procFD, err = unix.Open(q.processing, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return nil, err
		}
		defer unix.Close(procFD)
	}
	<-start
	for i := range count {
		if i%64 == 0 && ctx.Err() != nil {
			return lat, ctx.Err()
		}
		name := msgName(pass, c, i)
		t0 := time.Now()
		var err error
		switch op {
		case opPublish, opLease, opAck:
			err = q.do(op, name, body, inboxFD, procFD)
		case opRoundTrip:
			for _, o := range []opKind{opPublish, opLease, opAck} {
				if err = q.do(o, name, body, inboxFD, procFD); err != nil {
					break
				}
			}
		}
		lat = append(lat, time.Since(t0))
		if err != nil {
			return lat, fmt.Errorf("%s %s: %w", op, name, err)
		}
	}
	return lat, nil
}

// do runs one of the three operations on message name.
func (q queueDirs) do(op opKind, name string, body []byte, inboxFD, procFD int) error {
	switch op {
	case opPublish:
		if q.tmp != "" {
			return publishMaildir(filepath.Join(q.tmp, name), filepath.Join(q.inbox, name), body, inboxFD)
		}
		if q.syncAtClose {
			return publish(filepath.Join(q.inbox, name), body, true, -1)
		}
		return publish(filepath.Join(q.inbox, name), body, q.durable, inboxFD)
	case opLease:
		err := unix.Rename(filepath.Join(q.inbox, name), filepath.Join(q.processing, name))
		if err == nil && q.durable {
			err = errors.Join(unix.Fsync(procFD), unix.Fsync(inboxFD))
		}
		return err
	case opAck:
		err := unix.Unlink(filepath.Join(q.processing, name))
		if err == nil && q.durable {
			err = unix.Fsync(procFD)
		}
		return err
	}
	return fmt.Errorf("no single operation %s", op)
}

// publishMaildir is the careful Maildir delivery: write the message
// under tmp/, fsync it, rename it into place, fsync the directory.
func publishMaildir(tmpPath, path string, body []byte, dirFD int) error {
	fd, err := unix.Open(tmpPath, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	n, err := unix.Write(fd, body)
	if err == nil && n != len(body) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(body))
	}
	if err == nil {
		err = unix.Fsync(fd)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Rename(tmpPath, path)
	}
	if err == nil {
		err = unix.Fsync(dirFD)
	}
	return err
}

// publish is what a C producer does: open(O_CREAT|O_EXCL), one write,
// close. Raw system calls, not os.File: the Go runtime would register the
// descriptor with epoll, which sends FUSE a POLL no C program causes.
// durable fdatasyncs the file before close(2), then fsyncs dirFD unless
// it is negative (on ext4 the sync of a new file also writes its
// directory entry).
func publish(path string, body []byte, durable bool, dirFD int) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	n, err := unix.Write(fd, body)
	if err == nil && n != len(body) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(body))
	}
	if err == nil && durable {
		err = unix.Fdatasync(fd)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr // a commit error comes back from close(2)
	}
	if err == nil && durable && dirFD >= 0 {
		err = unix.Fsync(dirFD)
	}
	return err
}
