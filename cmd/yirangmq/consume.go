package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// runConsume runs a command for every message of a queue, through the
// mount: a worker leases with a read of QUEUE/.next, runs the handler with
// the body on stdin, touches the message while the handler runs (the
// lease's heartbeat), and acks (unlink) on exit 0 or nacks (rename back to
// inbox/, reason HANDLER_FAILED) otherwise.
//
// SIGINT or SIGTERM stops it cleanly: no new lease is taken (blocked .next
// reads are interrupted), running handlers get the signal and are waited
// for, and every lease ends acked, nacked or given back (RELEASED).
func runConsume(ctx context.Context, env *cliEnv, args []string) error {
	fl := pflag.NewFlagSet("consume", pflag.ContinueOnError)
	clientUsage(fl, "consume [--mount M] --queue Q [--concurrency N] [--max-messages K] [--drain] -- COMMAND [ARGS]",
		"Runs COMMAND for every message of the queue, with the body on stdin and the\nmessage's path in $YIRANGMQ_MESSAGE. Exit 0 acks the message; any other exit\nnacks it with reason HANDLER_FAILED and the last line of stderr. The lease is\nextended while COMMAND runs. SIGINT/SIGTERM take no new message, are passed\non to running commands, and leave no lease behind: a message whose command\nwas stopped goes back to inbox/ with reason RELEASED, its attempts unchanged.")
	c := &consumer{}
	var mount, queue string
	addMountFlag(fl, &mount)
	fl.StringVarP(&queue, "queue", "q", "", "the queue to consume")
	fl.IntVarP(&c.workers, "concurrency", "c", 1, "messages handled at once")
	fl.Int64Var(&c.max, "max-messages", 0, "exit after this many messages (0: no limit)")
	fl.BoolVar(&c.drain, "drain", false, "exit once the queue is worked off: nothing ready, in flight (other consumers' leases too) or delayed, as yirangmq drain waits for (failed messages are retried after their backoff until they succeed or are dead-lettered)")
	fl.BoolVarP(&c.verbose, "verbose", "v", false, "say what happens to every message on stderr")
	if ok, err := parseFlags(env, fl, args); !ok {
		return err
	}
	// The command comes after --, always: without it, a word meant as an
	// option of the command (or a typo of ours) would be taken for the
	// command, or for an option of consume.
	switch at := fl.ArgsLenAtDash(); {
	case at < 0 && fl.NArg() > 0:
		fmt.Fprintf(env.stderr, "yirangmq consume: put -- before the command: yirangmq consume --queue Q -- %s\n", strings.Join(fl.Args(), " "))
		return errUsage
	case at > 0:
		fmt.Fprintf(env.stderr, "yirangmq consume: unexpected argument %q before -- (the command goes after it)\n", fl.Arg(0))
		return errUsage
	}
	c.argv = fl.Args()
	if len(c.argv) == 0 {
		fmt.Fprintln(env.stderr, "yirangmq consume: a COMMAND is needed after -- (see yirangmq consume --help)")
		return errUsage
	}
	if c.workers < 1 || c.max < 0 {
		fmt.Fprintln(env.stderr, "yirangmq consume: --concurrency must be at least 1 and --max-messages not negative")
		return errUsage
	}
	if _, err := exec.LookPath(c.argv[0]); err != nil {
		return fmt.Errorf("handler: %w", err)
	}
	q, err := openQueue(mount, queue)
	if err != nil {
		return err
	}
	c.q = q
	c.stdout, c.stderr = lockWriter(env.stdout), lockWriter(env.stderr)
	return c.run(ctx)
}

// errStopped says a .next read was interrupted because the consumer stops.
var errStopped = errors.New("stopped")

type consumer struct {
	q       queueRef
	argv    []string
	workers int
	max     int64
	drain   bool
	verbose bool
	stdout  io.Writer
	stderr  io.Writer

	stop     chan struct{} // closed: take no new message
	stopOnce sync.Once
	taken    atomic.Int64 // messages leased or about to be (--max-messages)

	// For --drain: the consumer is done when every live worker found
	// nothing ready while no handler ran.
	mu       sync.Mutex
	cond     *sync.Cond
	alive    int
	idle     int
	finished int // handlers finished so far: new work may be ready
	drained  bool

	procMu sync.Mutex
	procs  map[*os.Process]bool
	sig    os.Signal // forwarded to every handler, once stopping

	failed atomic.Value // first fatal error of a worker
}

func (c *consumer) run(ctx context.Context) error {
	c.stop = make(chan struct{})
	c.cond = sync.NewCond(&c.mu)
	c.procs = map[*os.Process]bool{}
	c.alive = c.workers

	finished := make(chan struct{})
	defer close(finished)
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go c.watchSignals(ctx, sigs, finished)

	var wg sync.WaitGroup
	for i := 0; i < c.workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.work(); err != nil {
				c.failed.CompareAndSwap(nil, err)
				c.halt()
			}
			c.mu.Lock()
			c.alive--
			c.cond.Broadcast()
			c.mu.Unlock()
		}()
	}
	wg.Wait()
	if err, _ := c.failed.Load().(error); err != nil {
		return err
	}
	return nil
}

// watchSignals stops the consumer when ctx ends or a signal comes, and
// passes the signal on to the handlers (in their own process groups, so a
// terminal's ^C reaches them once, through us).
func (c *consumer) watchSignals(ctx context.Context, sigs <-chan os.Signal, finished <-chan struct{}) {
	select {
	case <-finished:
		return
	case s := <-sigs:
		c.halt()
		c.forward(s)
	case <-ctx.Done():
		c.halt()
		// main's signal context ended ctx; the signal itself comes on
		// sigs too. Without one (a caller cancelled), say SIGTERM.
		select {
		case s := <-sigs:
			c.forward(s)
		case <-time.After(100 * time.Millisecond):
			c.forward(syscall.SIGTERM)
		case <-finished:
			return
		}
	}
	for {
		select {
		case s := <-sigs:
			c.forward(s)
		case <-finished:
			return
		}
	}
}

// halt stops taking messages and wakes whoever waits.
func (c *consumer) halt() {
	c.stopOnce.Do(func() {
		close(c.stop)
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
}

func (c *consumer) stopping() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

func (c *consumer) forward(s os.Signal) {
	c.procMu.Lock()
	defer c.procMu.Unlock()
	c.sig = s
	for p := range c.procs {
		signalGroup(p, s)
	}
}

func signalGroup(p *os.Process, s os.Signal) {
	if n, ok := s.(syscall.Signal); ok {
		_ = syscall.Kill(-p.Pid, n)
	}
}

// work is one worker: lease, handle, repeat.
func (c *consumer) work() error {
	next := c.q.path(".next")
	for !c.stopping() {
		if c.max > 0 && c.taken.Add(1) > c.max {
			return nil // the others take the last ones
		}
		name, err := readNext(c.stop, next, c.drain)
		switch {
		case err == nil:
		case errors.Is(err, errStopped):
			return nil
		case errors.Is(err, syscall.EAGAIN):
			c.taken.Add(-1)
			if c.waitForWork() {
				return nil
			}
			continue
		case errors.Is(err, syscall.ENOENT):
			return fmt.Errorf("queue %s does not exist", c.q.name)
		case errors.Is(err, syscall.EBUSY):
			return fmt.Errorf("the daemon refuses more blocked .next readers: lower --concurrency: %w", err)
		default:
			return err
		}
		if c.stopping() {
			// The lease came as the read was interrupted: give it back.
			c.release(name)
			return nil
		}
		c.handle(name)
		c.mu.Lock()
		c.finished++
		c.cond.Broadcast()
		c.mu.Unlock()
	}
	return nil
}

// waitForWork is --drain's wait after an EAGAIN: it reports true when the
// consumer is done (stopping, or every live worker idle at once while the
// queue has nothing ready, in flight or delayed), false when it may have
// work: a handler finished meanwhile, or the queue still holds messages
// that will be ready (a backoff, a delay, another consumer's lease).
func (c *consumer) waitForWork() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.idle++
	gen := c.finished
	for {
		switch {
		case c.drained:
			return true
		case c.stopping():
			return true
		case c.finished != gen:
			c.idle--
			return false
		case c.idle >= c.alive:
			// The last worker to find nothing looks at what the queue
			// still holds, as `yirangmq drain` does.
			c.mu.Unlock()
			left, err := c.left()
			c.mu.Lock()
			if err == nil && left == 0 {
				c.drained = true
				c.cond.Broadcast()
				return true
			}
			c.idle--
			c.mu.Unlock()
			select { // then tries .next again
			case <-c.stop:
			case <-time.After(drainPoll):
			}
			c.mu.Lock()
			return false
		}
		c.cond.Wait()
	}
}

// left is how many messages the queue holds ready, in flight or delayed:
// what `yirangmq drain` waits to see at 0.
func (c *consumer) left() (int64, error) {
	s, err := c.q.readStats()
	if err != nil {
		return 0, err
	}
	return s.Ready + s.Inflight + s.Delayed, nil
}

// handle runs the handler for one leased message and acks or nacks it.
func (c *consumer) handle(name string) {
	path := c.q.path("processing", name)
	body, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(c.stderr, "yirangmq consume: %s: lease lost before the handler ran: %v\n", name, err)
		return
	}
	defer body.Close()
	interval := time.Second
	if p, _, err := c.q.readPolicy(); err == nil && p.VisibilityTimeoutSec > 0 {
		interval = time.Duration(p.VisibilityTimeoutSec) * time.Second / 3
	}

	cmd := exec.Command(c.argv[0], c.argv[1:]...)
	cmd.Stdin = body
	cmd.Stdout = c.stdout
	tail := &tailWriter{w: c.stderr}
	cmd.Stderr = tail
	cmd.Env = append(os.Environ(), "YIRANGMQ_MESSAGE="+path, "YIRANGMQ_QUEUE="+c.q.name, mountEnv+"="+c.q.mount)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		c.nack(name, "HANDLER_FAILED", "cannot start: "+err.Error())
		return
	}
	c.procMu.Lock()
	c.procs[cmd.Process] = true
	if c.sig != nil { // stopped as it started
		signalGroup(cmd.Process, c.sig)
	}
	c.procMu.Unlock()

	beat := make(chan struct{})
	var hb sync.WaitGroup
	hb.Add(1)
	go func() {
		defer hb.Done()
		c.heartbeat(path, name, interval, beat)
	}()
	err = cmd.Wait()
	close(beat)
	hb.Wait()
	c.procMu.Lock()
	delete(c.procs, cmd.Process)
	c.procMu.Unlock()

	if err == nil {
		c.ack(name)
		return
	}
	if c.stopping() {
		// The handler was stopped with us (it got our signal): that is no
		// failure of the message. Give it back without counting an
		// attempt, so that a deploy or a restart never pushes messages
		// towards the dead-letter queue.
		c.release(name)
		return
	}
	msg := err.Error()
	if line := tail.last(); line != "" {
		msg += ": " + line
	}
	c.nack(name, "HANDLER_FAILED", msg)
}

// release gives a leased message back to inbox/ at once without counting
// an attempt: reason RELEASED on the lease, then the rename a nack makes
// (docs/contract.md, "Giving a message back").
func (c *consumer) release(name string) {
	path := c.q.path("processing", name)
	err := retryEINTR(func() error { return unix.Setxattr(path, "user.yirangmq.reason", []byte("RELEASED"), 0) })
	if err == nil {
		err = retryEINTR(func() error { return os.Rename(path, c.q.path("inbox", name)) })
	}
	switch {
	case err == nil:
		if c.verbose {
			fmt.Fprintf(c.stderr, "yirangmq consume: %s: given back unhandled (stopping)\n", name)
		}
	case errors.Is(err, os.ErrNotExist):
		fmt.Fprintf(c.stderr, "yirangmq consume: %s: stopping; the message had already left processing/\n", name)
	default:
		fmt.Fprintf(c.stderr, "yirangmq consume: %s: giving the message back failed: %v\n", name, err)
	}
}

// heartbeat extends the lease every interval, as touch(1) does (the
// deadline becomes now + the visibility timeout), until done closes.
func (c *consumer) heartbeat(path, name string, interval time.Duration, done <-chan struct{}) {
	if interval < 100*time.Millisecond {
		interval = 100 * time.Millisecond
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	now := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		err := retryEINTR(func() error { return unix.UtimesNanoAt(unix.AT_FDCWD, path, now, 0) })
		switch {
		case errors.Is(err, unix.ENOENT):
			return // the handler moved the message, or the lease was lost
		case err != nil:
			fmt.Fprintf(c.stderr, "yirangmq consume: %s: extending the lease failed: %v\n", name, err)
		}
	}
}

// ack unlinks processing/NAME. ENOENT means the handler moved the message
// itself (forwarded, dead-lettered, acked) or the lease was lost.
func (c *consumer) ack(name string) {
	err := os.Remove(c.q.path("processing", name))
	switch {
	case err == nil:
		if c.verbose {
			fmt.Fprintf(c.stderr, "yirangmq consume: %s: acked\n", name)
		}
	case errors.Is(err, os.ErrNotExist):
		if c.verbose {
			fmt.Fprintf(c.stderr, "yirangmq consume: %s: handler succeeded; the message had already left processing/\n", name)
		}
	default:
		fmt.Fprintf(c.stderr, "yirangmq consume: %s: ack failed: %v\n", name, err)
	}
}

// nack records why (when given) and renames processing/NAME back to
// inbox/: the queue counts the attempt and retries it after its backoff,
// or dead-letters it.
func (c *consumer) nack(name, reason, msg string) {
	path := c.q.path("processing", name)
	if reason != "" {
		err := retryEINTR(func() error { return unix.Setxattr(path, "user.yirangmq.reason", []byte(reason), 0) })
		if err == nil {
			err = retryEINTR(func() error { return unix.Setxattr(path, "user.yirangmq.reason_message", []byte(msg), 0) })
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			fmt.Fprintf(c.stderr, "yirangmq consume: %s: recording the failure: %v\n", name, err)
		}
	}
	err := os.Rename(path, c.q.path("inbox", name))
	switch {
	case err == nil:
		if reason != "" {
			fmt.Fprintf(c.stderr, "yirangmq consume: %s: %s: %s\n", name, c.whereNacked(name), msg)
		} else if c.verbose {
			fmt.Fprintf(c.stderr, "yirangmq consume: %s: returned unhandled (stopping)\n", name)
		}
	case errors.Is(err, os.ErrNotExist):
		fmt.Fprintf(c.stderr, "yirangmq consume: %s: handler failed (%s); the message had already left processing/\n", name, msg)
	default:
		fmt.Fprintf(c.stderr, "yirangmq consume: %s: nack failed: %v\n", name, err)
	}
}

// whereNacked says what a nack made of a message: the queue retries it
// after its backoff (in delayed/), or, its retries spent, dead-letters it
// (in dlq/) or drops it (a queue that keeps no dead letters). Names are
// unique among the live messages of a queue, so dlq/NAME is this one.
// Each place is asked with a getxattr, which the daemon answers for the
// message there now (a stat could be answered from a name the kernel
// kept from an earlier attempt).
func (c *consumer) whereNacked(name string) string {
	there := func(dir string) bool {
		id, err := getXattr(c.q.path(dir, name), "id")
		return err == nil && id != ""
	}
	switch {
	case there("dlq"):
		return "dead-lettered (its retries are spent; see dlq/)"
	case there("delayed"), there("inbox"), there("processing"):
		return "nacked (retried after its backoff)"
	}
	return "dropped (its retries are spent and the queue keeps no dead letters)"
}
