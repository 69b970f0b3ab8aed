package main

// The client commands (publish, consume, status, dlq, pause, resume,
// drain) drive a queue through a mount with plain file operations, as a
// shell script would: they never open the store, so they work against any
// daemon, local or as another user, and test the filesystem contract
// itself. This file holds pause, resume and drain, and the helpers the
// client commands share.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// mountEnv names the variable that gives the client commands their mount.
const mountEnv = "YIRANGMQ_MOUNT"

// defaultMount is $YIRANGMQ_MOUNT, else /mnt/mq.
func defaultMount() string {
	if m := os.Getenv(mountEnv); m != "" {
		return m
	}
	return "/mnt/mq"
}

// clientUsage sets a command's --help text: usage line, description, flags.
func clientUsage(fl *pflag.FlagSet, synopsis, description string) {
	fl.SortFlags = false
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "Usage: yirangmq %s\n\n%s\n\nOptions:\n", synopsis, description)
		printOptions(fl)
	}
}

// addMountFlag adds --mount (-m) with its default.
func addMountFlag(fl *pflag.FlagSet, p *string) {
	fl.StringVarP(p, "mount", "m", defaultMount(), "the yirangmq mount ($"+mountEnv+" sets the default)")
}

// checkMount makes sure mount is a directory served by yirangmq (it has
// .stats) and returns its absolute path.
func checkMount(mount string) (string, error) {
	abs, err := filepath.Abs(mount)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(abs, ".stats")); err != nil {
		if errors.Is(err, syscall.ENOTCONN) {
			return "", fmt.Errorf("the mount at %s is dead (its daemon is gone): run yirangmq mount again", abs)
		}
		return "", fmt.Errorf("no yirangmq mount at %s (use --mount or $%s)", abs, mountEnv)
	}
	return abs, nil
}

// queueRef is one queue of a mount.
type queueRef struct {
	mount string // absolute
	name  string
}

// openQueue checks the mount and that the queue exists.
func openQueue(mount, name string) (queueRef, error) {
	if name == "" {
		return queueRef{}, errors.New("--queue is required")
	}
	if strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return queueRef{}, fmt.Errorf("%q is not a queue name", name)
	}
	abs, err := checkMount(mount)
	if err != nil {
		return queueRef{}, err
	}
	q := queueRef{mount: abs, name: name}
	fi, err := os.Stat(q.path())
	switch {
	case errors.Is(err, os.ErrNotExist), err == nil && !fi.IsDir():
		return queueRef{}, fmt.Errorf("queue %s does not exist (mkdir %s creates it)", name, q.path())
	case err != nil:
		return queueRef{}, fmt.Errorf("queue %s: %w", name, err)
	}
	return q, nil
}

// path joins elements to the queue's directory.
func (q queueRef) path(elem ...string) string {
	return filepath.Join(append([]string{q.mount, q.name}, elem...)...)
}

// rel is a message's path relative to the mount, for messages to the user.
func (q queueRef) rel(dir, name string) string { return q.name + "/" + dir + "/" + name }

// readPolicy returns QUEUE/.policy as the daemon has it, defaults filled.
func (q queueRef) readPolicy() (queuecore.Policy, []byte, error) {
	b, err := os.ReadFile(q.path(".policy"))
	if err != nil {
		return queuecore.Policy{}, nil, fmt.Errorf("read policy: %w", err)
	}
	var p queuecore.Policy
	if err := json.Unmarshal(b, &p); err != nil {
		return queuecore.Policy{}, nil, fmt.Errorf("read policy: %w", err)
	}
	return p, b, nil
}

// readStats reads QUEUE/.stats.
func (q queueRef) readStats() (queuecore.QueueStats, error) {
	var s queuecore.QueueStats
	b, err := os.ReadFile(q.path(".stats"))
	if err != nil {
		return s, fmt.Errorf("read stats: %w", err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("read stats: %w", err)
	}
	return s, nil
}

// getXattr reads one user.yirangmq.KEY attribute; "" when the message has
// none.
func getXattr(path, key string) (string, error) {
	buf := make([]byte, 256)
	for {
		var n int
		err := retryEINTR(func() (err error) {
			n, err = unix.Getxattr(path, "user.yirangmq."+key, buf)
			return err
		})
		switch {
		case errors.Is(err, unix.ENODATA):
			return "", nil
		case errors.Is(err, unix.ERANGE):
			size, err := unix.Getxattr(path, "user.yirangmq."+key, nil)
			if err != nil {
				return "", &os.PathError{Op: "getxattr", Path: path, Err: err}
			}
			buf = make([]byte, size+64)
			continue
		case err != nil:
			return "", &os.PathError{Op: "getxattr", Path: path, Err: err}
		}
		return string(buf[:n]), nil
	}
}

// retryEINTR repeats a raw system call interrupted by a signal (Go's own
// preemption signals too), as package os does for its calls.
func retryEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// isTerminal reports whether w is a terminal (progress lines go there only).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// sleepCtx waits d or until ctx is done, and reports whether ctx is still
// alive.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func runPause(ctx context.Context, env *cliEnv, args []string) error {
	return setPaused(env, "pause", true, args)
}

func runResume(ctx context.Context, env *cliEnv, args []string) error {
	return setPaused(env, "resume", false, args)
}

// setPaused edits "paused" in QUEUE/.policy: read the policy in effect,
// change that one field, write the whole document back (the daemon
// replaces the policy at close, so a rejected one fails the close).
func setPaused(env *cliEnv, cmd string, paused bool, args []string) error {
	fl := pflag.NewFlagSet(cmd, pflag.ContinueOnError)
	what := "Pauses the queue: leasing waits (.next blocks, renames into processing/\nfail with EAGAIN) while publishing goes on."
	if !paused {
		what = "Resumes a paused queue: leasing starts again."
	}
	clientUsage(fl, cmd+" [--mount M] --queue Q", what)
	var mount, queue string
	addMountFlag(fl, &mount)
	fl.StringVarP(&queue, "queue", "q", "", "the queue")
	if ok, err := parseFlagsNoArgs(env, fl, args); !ok {
		return err
	}
	q, err := openQueue(mount, queue)
	if err != nil {
		return err
	}
	_, raw, err := q.readPolicy()
	if err != nil {
		return err
	}
	// Edit the document as it is, so fields this binary does not know
	// about survive the round trip.
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("read policy: %w", err)
	}
	doc["paused"] = json.RawMessage(fmt.Sprint(paused))
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(q.path(".policy"), append(out, '\n'), 0o644); err != nil {
		if errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("the daemon rejected the policy of %s (see its log): %w", q.name, err)
		}
		return fmt.Errorf("write policy: %w", err)
	}
	state := "paused"
	if !paused {
		state = "resumed"
	}
	fmt.Fprintf(env.stdout, "%s %s\n", q.name, state)
	return nil
}

// drainPoll is how often drain looks at the queue's stats.
const drainPoll = 200 * time.Millisecond

// runDrain waits until the queue has nothing ready, in flight or delayed:
// the consumers have worked it off. It does not pause the queue.
func runDrain(ctx context.Context, env *cliEnv, args []string) error {
	fl := pflag.NewFlagSet("drain", pflag.ContinueOnError)
	clientUsage(fl, "drain [--mount M] --queue Q [--timeout D]",
		"Waits until the queue is worked off: nothing ready, in flight or delayed\n(dead letters and the archive do not count). Publishing is not stopped:\npause the queue's producers first if it must stay empty.")
	var mount, queue string
	var timeout time.Duration
	var quiet bool
	addMountFlag(fl, &mount)
	fl.StringVarP(&queue, "queue", "q", "", "the queue")
	fl.DurationVar(&timeout, "timeout", 0, "give up (exit 1) after this long; 0 waits for ever")
	fl.BoolVar(&quiet, "quiet", false, "print no progress")
	if ok, err := parseFlagsNoArgs(env, fl, args); !ok {
		return err
	}
	q, err := openQueue(mount, queue)
	if err != nil {
		return err
	}
	start := time.Now()
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	last := ""
	for {
		s, err := q.readStats()
		if err != nil {
			return err
		}
		left := s.Ready + s.Inflight + s.Delayed
		line := fmt.Sprintf("%s: %d ready, %d in flight, %d delayed", q.name, s.Ready, s.Inflight, s.Delayed)
		if left == 0 {
			fmt.Fprintf(env.stdout, "%s drained in %s\n", q.name, time.Since(start).Round(time.Millisecond))
			return nil
		}
		if !quiet && line != last {
			fmt.Fprintln(env.stderr, line)
			last = line
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted with %d messages left", left)
		case <-deadline:
			return fmt.Errorf("not drained after %s: %s", timeout, line)
		case <-tick.C:
		}
	}
}
