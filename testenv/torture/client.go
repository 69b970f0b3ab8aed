package torture

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// mountState tells clients whether the daemon is up. Its epoch is even
// while a daemon serves the mount and odd from just before a kill until
// the restarted daemon said ready; it only grows.
//
// A call that failed is a refusal by a live daemon only when the epoch
// was the same even number before and after it; otherwise the mount died
// or was detached around it (and a path under the bare mountpoint gives
// ENOENT, which means nothing), so its outcome is unknown.
type mountState struct {
	epoch atomic.Int64
	quit  chan struct{} // closed when the clients must stop at once

	mu sync.Mutex
	// unexpected counts errors that a live, steady mount gave although
	// they are no refusal (EIO, ENOTCONN, EINTR…), by error text.
	unexpected map[string]int
}

func newMountState() *mountState {
	return &mountState{quit: make(chan struct{}), unexpected: map[string]int{}}
}

func (m *mountState) down() { m.epoch.Add(1) } // before a kill
func (m *mountState) up()   { m.epoch.Add(1) } // after the restart said ready

// waitUp waits until a daemon serves the mount; false when told to quit.
func (m *mountState) waitUp() bool {
	for m.epoch.Load()%2 != 0 {
		select {
		case <-m.quit:
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
	select {
	case <-m.quit:
		return false
	default:
		return true
	}
}

// refusals are the errnos by which a live daemon says it did nothing.
// EINTR is not one: a daemon may have done the work before it saw the
// signal.
var refusals = []unix.Errno{unix.ENOENT, unix.EEXIST, unix.EAGAIN, unix.EPERM, unix.EINVAL, unix.EBUSY, unix.EDQUOT, unix.EFBIG}

// outcome classifies a call that started in epoch e0.
func (m *mountState) outcome(e0 int64, err error) Outcome {
	if err == nil {
		return OK
	}
	if e1 := m.epoch.Load(); e1 != e0 || e0%2 != 0 {
		return Unknown
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		for _, r := range refusals {
			if errno == r {
				return Failed
			}
		}
	}
	m.mu.Lock()
	m.unexpected[err.Error()]++
	m.mu.Unlock()
	return Unknown
}

// client does one kind of call after another on one queue of a mount,
// with plain system calls (no Go file, no poller) so that what is
// recorded is exactly what close(2), rename(2) and unlink(2) returned.
type client struct {
	name  string
	queue string // QUEUE directory in the mount
	h     *History
	m     *mountState
	clientState
}

func (c *client) path(elem ...string) string {
	return filepath.Join(append([]string{c.queue}, elem...)...)
}

func callErr(call string, err error) string {
	if err == nil {
		return ""
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		return fmt.Sprintf("%s: %s (%s)", call, unix.ErrnoName(errno), errno.Error())
	}
	return call + ": " + err.Error()
}

// writeAll writes body to fd in the given number of write(2) calls.
func writeAll(fd int, body []byte, pieces int) error {
	for len(body) > 0 {
		n := len(body)
		if pieces > 1 {
			n = len(body) / pieces
			pieces--
		}
		w, err := unix.Write(fd, body[:n])
		if err != nil {
			return err
		}
		body = body[w:]
	}
	return nil
}

// publish commits body as inbox/NAME: create+write+close, or with draft
// a .NAME written, closed and renamed to NAME. It counts as committed
// only when the call that commits (close, or the rename) returned 0.
func (c *client) publish(name string, body []byte, pieces int, fsync, draft bool) Event {
	c.begin("publish " + name)
	defer c.end()
	e := Event{Kind: KindPublish, Client: c.name, Name: name, Sum: Sum(body), Via: "create", Start: c.h.Now()}
	file := name
	if draft {
		e.Via, file = "draft", "."+name
	}
	e0 := c.m.epoch.Load()
	fd, err := unix.Open(c.path(StateInbox, file), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		// No descriptor: nothing can commit it.
		e.Outcome, e.Err, e.End = Failed, callErr("open", err), c.h.Now()
		return e
	}
	werr := writeAll(fd, body, pieces)
	var serr error
	if werr == nil && fsync {
		serr = unix.Fsync(fd)
	}
	cerr := unix.Close(fd)
	switch {
	case werr != nil:
		e.Err = callErr("write", werr)
	case serr != nil:
		e.Err = callErr("fsync", serr)
	case cerr != nil:
		e.Err = callErr("close", cerr)
	}
	if !draft {
		e.End = c.h.Now()
		if werr == nil && serr == nil && cerr == nil {
			e.Outcome = OK
		} else {
			// Never counted as committed; yet a close may have committed
			// what was written before the failure, so not Failed either.
			e.Outcome = Unknown
		}
		return e
	}
	if werr != nil || serr != nil || cerr != nil {
		// A draft is only committed by its rename, which never happened.
		e.Outcome, e.End = Failed, c.h.Now()
		return e
	}
	rerr := unix.Rename(c.path(StateInbox, file), c.path(StateInbox, name))
	e.End = c.h.Now()
	e.Outcome = c.m.outcome(e0, rerr)
	e.Err = callErr("rename", rerr)
	return e
}

// leaseNext reads .next: a lease, and the name it returns.
func (c *client) leaseNext(nonblock bool) Event {
	if nonblock {
		c.begin("read .next (O_NONBLOCK)")
	} else {
		c.begin("read .next")
	}
	defer c.end()
	e := Event{Kind: KindLease, Client: c.name, Start: c.h.Now()}
	e0 := c.m.epoch.Load()
	flags := unix.O_RDONLY | unix.O_CLOEXEC
	if nonblock {
		flags |= unix.O_NONBLOCK
	}
	fd, err := unix.Open(c.path(".next"), flags, 0)
	if err != nil {
		// Opening .next takes no lease.
		e.Outcome, e.Err, e.End = Failed, callErr("open .next", err), c.h.Now()
		return e
	}
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	e.End = c.h.Now()
	unix.Close(fd)
	e.Outcome, e.Err = c.m.outcome(e0, err), callErr("read .next", err)
	if err != nil {
		return e
	}
	line := string(buf[:n])
	name, ok := strings.CutPrefix(line, StateProcessing+"/")
	name, nl := strings.CutSuffix(name, "\n")
	if !ok || !nl || name == "" || strings.Contains(name, "/") {
		e.BodyErr = fmt.Sprintf(".next returned %q", line)
		e.Outcome = Unknown
		return e
	}
	e.Name = name
	return e
}

// inboxNames lists inbox/ in readdir (delivery) order.
func (c *client) inboxNames(max int) ([]string, error) {
	c.begin("readdir inbox")
	defer c.end()
	f, err := os.Open(c.path(StateInbox))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(max)
}

// leaseRename leases inbox/NAME by renaming it into processing/.
func (c *client) leaseRename(name string) Event {
	c.begin("rename inbox/" + name + " processing/")
	defer c.end()
	e := Event{Kind: KindLeaseRename, Client: c.name, Name: name, Start: c.h.Now()}
	e0 := c.m.epoch.Load()
	err := unix.Rename(c.path(StateInbox, name), c.path(StateProcessing, name))
	e.End = c.h.Now()
	e.Outcome, e.Err = c.m.outcome(e0, err), callErr("rename", err)
	return e
}

// readFile reads a whole file with open/read/close, retrying EINTR.
func readFile(path string) ([]byte, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	defer unix.Close(fd)
	var b bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read: %w", err)
		}
		if n == 0 {
			return b.Bytes(), nil
		}
		b.Write(buf[:n])
	}
}

// read reads processing/NAME while holding lease.
func (c *client) read(lease Event) Event {
	c.begin("read processing/" + lease.Name)
	defer c.end()
	e := Event{Kind: KindRead, Client: c.name, Name: lease.Name, Lease: lease.ID, Start: c.h.Now()}
	e0 := c.m.epoch.Load()
	body, err := readFile(c.path(StateProcessing, lease.Name))
	e.End = c.h.Now()
	e.Outcome = c.m.outcome(e0, err)
	if err != nil {
		e.Err = callErr("", err)
		return e
	}
	e.Sum = Sum(body)
	if verr := VerifyBody(lease.Name, body); verr != nil {
		e.BodyErr = verr.Error()
	}
	return e
}

// ack removes processing/NAME.
func (c *client) ack(lease Event) Event {
	c.begin("unlink processing/" + lease.Name)
	defer c.end()
	e := Event{Kind: KindAck, Client: c.name, Name: lease.Name, Lease: lease.ID, Start: c.h.Now()}
	e0 := c.m.epoch.Load()
	err := unix.Unlink(c.path(StateProcessing, lease.Name))
	e.End = c.h.Now()
	e.Outcome, e.Err = c.m.outcome(e0, err), callErr("unlink", err)
	return e
}

// nack renames processing/NAME back to inbox/.
func (c *client) nack(lease Event) Event {
	c.begin("rename processing/" + lease.Name + " inbox/")
	defer c.end()
	e := Event{Kind: KindNack, Client: c.name, Name: lease.Name, Lease: lease.ID, Start: c.h.Now()}
	e0 := c.m.epoch.Load()
	err := unix.Rename(c.path(StateProcessing, lease.Name), c.path(StateInbox, lease.Name))
	e.End = c.h.Now()
	e.Outcome, e.Err = c.m.outcome(e0, err), callErr("rename", err)
	return e
}

// liveCount counts the messages in inbox/, processing/ and delayed/.
func (c *client) liveCount() (int, error) {
	c.begin("readdir inbox processing delayed")
	defer c.end()
	total := 0
	for _, s := range []string{StateInbox, StateProcessing, StateDelayed} {
		f, err := os.Open(c.path(s))
		if err != nil {
			return 0, err
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return 0, err
		}
		total += len(names)
	}
	return total, nil
}
