package main

// What the consumer reads and writes beside its handler: a blocking read
// of .next that a signal interrupts, and the tail of the handler's output
// kept as the reason of a failure.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// readNext reads QUEUE/.next once and returns the name of the message it
// leased.
//
// Closing a descriptor does not interrupt a blocked FUSE read, and Go's
// os.File retries EINTR by itself, so the read is a raw read(2) on a
// thread of its own: to stop it, SIGURG (which the Go runtime already
// uses and ignores) is sent to that thread until the read returns. The
// kernel then interrupts the FUSE request; the daemon answers EINTR and
// takes no lease, or — if it leased just before — answers with the lease,
// which the caller gives back.
func readNext(stop <-chan struct{}, path string, nonblock bool) (string, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	flags := unix.O_RDONLY | unix.O_CLOEXEC
	if nonblock {
		flags |= unix.O_NONBLOCK
	}
	fd, err := unix.Open(path, flags, 0)
	for errors.Is(err, unix.EINTR) {
		fd, err = unix.Open(path, flags, 0)
	}
	if err != nil {
		return "", &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)

	// The interrupter must be gone before this thread is unlocked.
	reading := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func(tid int) {
		defer wg.Done()
		interruptThread(stop, reading, tid)
	}(unix.Gettid())
	defer wg.Wait()
	defer close(reading)

	var got []byte
	buf := make([]byte, 1024)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EINTR) {
			if len(got) == 0 && isClosed(stop) {
				return "", errStopped
			}
			continue // Go's own preemption signals land here too
		}
		if err != nil {
			return "", &os.PathError{Op: "read", Path: path, Err: err}
		}
		got = append(got, buf[:n]...)
		// Read to the end: a message name may hold newlines, so the first
		// one is not the end of the answer. The answer is small (a name is
		// at most 255 bytes), and .next says EOF once it was read.
		if n == 0 || len(got) > 4096 {
			break
		}
	}
	// The answer is exactly "processing/NAME\n": only that last newline
	// is taken off. Trimming more took "victim " for "victim", another
	// consumer's message.
	line, ok := bytes.CutSuffix(got, []byte("\n"))
	name, ok2 := strings.CutPrefix(string(line), "processing/")
	if !ok || !ok2 || name == "" || strings.ContainsAny(name, "/\x00") {
		return "", fmt.Errorf("read %s: unexpected answer %q", path, got)
	}
	return name, nil
}

// interruptThread signals thread tid every 20 ms once stop closes, until
// reading closes: a signal that lands before the read(2) starts is lost,
// the next one is not.
func interruptThread(stop, reading <-chan struct{}, tid int) {
	select {
	case <-reading:
		return
	case <-stop:
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	pid := os.Getpid()
	for {
		_ = unix.Tgkill(pid, tid, unix.SIGURG)
		select {
		case <-reading:
			return
		case <-t.C:
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// tailWriter passes a handler's stderr on and keeps its last non-empty
// line for the nack's reason_message.
type tailWriter struct {
	w       io.Writer
	mu      sync.Mutex
	partial []byte
	line    string
}

// maxReasonLine bounds the line kept.
const maxReasonLine = 512

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		if l := strings.TrimSpace(string(t.partial[:i])); l != "" {
			t.line = l
		}
		t.partial = t.partial[i+1:]
	}
	if len(t.partial) > maxReasonLine {
		t.partial = t.partial[len(t.partial)-maxReasonLine:]
	}
	t.mu.Unlock()
	return t.w.Write(p)
}

func (t *tailWriter) last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.line
	if p := strings.TrimSpace(string(t.partial)); p != "" {
		l = p // a last line without a newline
	}
	if len(l) > maxReasonLine {
		l = l[len(l)-maxReasonLine:]
	}
	return l
}

// lockWriter makes w safe for handlers writing at once; a file already is.
func lockWriter(w io.Writer) io.Writer {
	if _, ok := w.(*os.File); ok {
		return w
	}
	return &lockedWriter{w: w}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
