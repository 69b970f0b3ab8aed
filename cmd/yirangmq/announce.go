package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// runAnnounce makes inbox/ raise an inotify event whenever it gains a
// ready message, including the ones the daemon makes ready by itself (the
// end of a delay or a backoff, an expired lease, a move by another daemon
// of a shared store), which the kernel never hears of: the daemon must not
// notify the kernel of its own moves (an entry invalidation can keep a
// killed daemon from exiting, docs/fusefs.md), and must never call into
// its own mount. This separate process can: it watches the queue's
// counters, and for each message it finds newly in inbox/ it makes a
// chmod to the mode the message has, which the mount accepts and ignores
// (docs/contract.md §2) and which raises IN_ATTRIB in inbox/. A chmod never
// extends a lease, so a stale name does no harm.
func runAnnounce(ctx context.Context, env *cliEnv, args []string) error {
	fl := pflag.NewFlagSet("announce", pflag.ContinueOnError)
	clientUsage(fl, "announce [--mount M] --queue Q [--interval D]",
		"Makes QUEUE/inbox/ raise an inotify event (IN_ATTRIB, with the message's name)\nfor every message that becomes ready, also the ones that become ready by\nthemselves (end of a delay or backoff, expired lease), within --interval.\nRuns until SIGINT or SIGTERM. It polls QUEUE/.stats every interval and lists\ninbox/ when the queue changed.")
	var mount, queue string
	var interval time.Duration
	addMountFlag(fl, &mount)
	fl.StringVarP(&queue, "queue", "q", "", "the queue")
	fl.DurationVar(&interval, "interval", time.Second, "how often to look at the queue")
	if ok, err := parseFlagsNoArgs(env, fl, args); !ok {
		return err
	}
	if interval < 10*time.Millisecond {
		fmt.Fprintf(env.stderr, "yirangmq announce: --interval must be at least 10ms\n")
		return errUsage
	}
	q, err := openQueue(mount, queue)
	if err != nil {
		return err
	}
	a := announcer{q: q, seen: map[string]bool{}}
	for {
		if err := a.round(); err != nil {
			fmt.Fprintf(env.stderr, "yirangmq announce: %v\n", err)
		}
		if !sleepCtx(ctx, interval) {
			return nil
		}
	}
}

// announcer remembers what it saw of one queue.
type announcer struct {
	q     queueRef
	last  [6]int64        // the counters that move messages into or out of inbox/
	seen  map[string]bool // names in inbox/ at the last listing
	ready bool            // a listing was made
}

// round looks at the counters, and lists and announces when they moved.
func (a *announcer) round() error {
	s, err := a.q.readStats()
	if err != nil {
		return err
	}
	now := [6]int64{s.Ready, s.PublishedTotal, s.LeasedTotal, s.NackedTotal, s.ExpiredTotal, s.RedrivenTotal}
	if a.ready && now == a.last {
		return nil
	}
	a.last, a.ready = now, true
	if s.Ready == 0 {
		clear(a.seen)
		return nil
	}
	return a.announce()
}

// announce lists inbox/ and chmods every name it had not seen there.
func (a *announcer) announce() error {
	f, err := os.Open(a.q.path("inbox"))
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	now := make(map[string]bool, len(names))
	for _, name := range names {
		now[name] = true
		if a.seen[name] {
			continue
		}
		err := retryEINTR(func() error { return unix.Chmod(a.q.path("inbox", name), 0o644) })
		if err != nil && !errors.Is(err, unix.ENOENT) { // leased or gone meanwhile: nothing to say
			return fmt.Errorf("announce %s: %w", a.q.rel("inbox", name), err)
		}
	}
	a.seen = now
	return nil
}
