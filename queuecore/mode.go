package queuecore

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// What changes when other daemons share the store is chosen once, in Open,
// and kept in four fields of the Core; the code that uses them reads the
// same either way. The store of this daemon alone has the types of this
// file, named local…; a SharedStore has those of shared.go, named
// shared…: localIDs and sharedIDs, localGauges and sharedGauges,
// localLeaser and sharedLeaser, localNames and sharedNames.
//
//   - ids (idSource): where message IDs and Seqs come from.
//   - gauges (gaugeSource): where the counts of .stats and maxReady come
//     from, and how fresh they are.
//   - leaser: who does the timed work (lease expiry, the end of backoffs
//     and delays, retention) and how Next picks a message.
//   - names (nameSource): whether the live names of a queue are cached.
//
// Left as branches on Core.shared: the queue record writes of CreateQueue,
// DeleteQueue and updateQueue (each picks the store call that checks what
// another daemon may have done meanwhile, next to the reason why) and the
// subscription to the store's hints in Open.

// idSource hands out message IDs (newID) and the Seq of a message entering
// inbox/ (newSeq), which orders delivery among equal priorities.
type idSource interface {
	newID() (uint64, error)
	newSeq() uint64
}

// localIDs is one counter for both, from the largest ID in the store.
type localIDs struct {
	last atomic.Uint64 // last message ID or Seq handed out
}

func (l *localIDs) newID() (uint64, error) { return l.last.Add(1), nil }
func (l *localIDs) newSeq() uint64         { return l.last.Add(1) }

// gaugeSource keeps the gauges of the queues (ready, inflight, … in
// .stats; maxReady goes by ready) in step with the store.
type gaugeSource interface {
	// refresh brings the gauges up to date before something that goes by
	// them, when they may be too old.
	refresh(ctx context.Context) error
	// force makes the next refresh read the store.
	force()
	// committing is called before the store commits the changes ds of
	// the gauges, and done once applied has added them (or the commit
	// failed).
	committing(ds []gaugeDelta)
	done(ds []gaugeDelta)
}

// localGauges: every change in a store of this daemon alone is one of its
// own commits, so the gauges that applied keeps are exact.
type localGauges struct{}

func (localGauges) refresh(context.Context) error { return nil }
func (localGauges) force()                        {}
func (localGauges) committing([]gaugeDelta)       {}
func (localGauges) done([]gaugeDelta)             {}

// leaser does what only some daemons of a store may do, and leases.
type leaser interface {
	// pick is one attempt of Next (see picked).
	pick(ctx context.Context, q *queue, consumer string, nonblock bool) (picked, error)
	// poll is how often a blocked Next looks again with no wake-up (0:
	// only when woken).
	poll() time.Duration
	// duty reports whether this core does the timed work now.
	duty() bool
	// reportDuty is what DaemonStats says of the duty: nil when there is
	// no other daemon to share it with.
	reportDuty() *bool
	// backstop runs once per pass of the scheduler on every daemon, with
	// the duty or without: what must happen even when hints are lost.
	backstop(ctx context.Context, now time.Time)
	// beforeRetention runs once per pass of the scheduler, before
	// retention, and returns the archive counts that retention by count
	// goes by: nil for the core's gauges.
	beforeRetention(ctx context.Context, now time.Time) (map[string]map[State]Count, error)
	// lookAgain is the latest time the scheduler must look again, whatever
	// is due (zero: none).
	lookAgain(now time.Time) time.Time
	// oneByOne says to commit due messages one at a time.
	oneByOne() bool
	// lostRace reports whether err, from a commit of the timed work, only
	// means that another daemon moved one of its messages first.
	lostRace(err error) bool
}

// localLeaser is the leaser of a store of this daemon alone: it does all the
// timed work, and its Next waits to be woken by its own commits.
type localLeaser struct{ c *Core }

func (a localLeaser) pick(ctx context.Context, q *queue, consumer string, nonblock bool) (picked, error) {
	return a.c.pickLocal(ctx, q, consumer, nonblock)
}
func (localLeaser) poll() time.Duration                 { return 0 }
func (localLeaser) duty() bool                          { return true }
func (localLeaser) reportDuty() *bool                   { return nil }
func (localLeaser) backstop(context.Context, time.Time) {}
func (localLeaser) beforeRetention(context.Context, time.Time) (map[string]map[State]Count, error) {
	return nil, nil
}
func (localLeaser) lookAgain(time.Time) time.Time { return time.Time{} }
func (localLeaser) oneByOne() bool                { return false }
func (localLeaser) lostRace(error) bool           { return false }

// nameSource says what the store holds under a live name.
type nameSource interface {
	// lookup returns the live message of q called name (ErrNotFound if
	// none).
	lookup(ctx context.Context, q *queue, name string) (Message, error)
	// opened runs when the core opens q holding live messages.
	opened(ctx context.Context, q *queue, live int64) error
	// created runs when this core has created q: it holds no message.
	created(q *queue)
	// wrote runs once a batch that wrote ts is committed.
	wrote(ts []touch)
}

// localNames is the name cache of namecache.go, exact because every
// change of a live name is a commit of this core.
type localNames struct{ c *Core }

func (n localNames) lookup(ctx context.Context, q *queue, name string) (Message, error) {
	if e, ok := q.names.get(name); ok {
		if !e.live {
			return Message{}, ErrNotFound
		}
		return e.m, nil
	}
	gen := q.names.generation()
	m, err := n.c.store.Lookup(ctx, q.name, name, false)
	switch {
	case err == nil:
		q.names.learn(gen, name, nameEntry{m: m, live: true})
	case errors.Is(err, ErrNotFound):
		q.names.learn(gen, name, nameEntry{})
	}
	return m, err
}

func (n localNames) opened(ctx context.Context, q *queue, live int64) error {
	return n.c.loadNames(ctx, q, live)
}

func (localNames) created(q *queue) { q.names.complete = true }

func (localNames) wrote(ts []touch) {
	for _, t := range ts {
		t.q.names.wrote(t.m, t.gone)
	}
}

// sharedNames reads the store every time: other daemons change the names
// of a shared store without this core's commits, so nothing is cached.
type sharedNames struct{ store Store }

func (n sharedNames) lookup(ctx context.Context, q *queue, name string) (Message, error) {
	return n.store.Lookup(ctx, q.name, name, false)
}
func (sharedNames) opened(context.Context, *queue, int64) error { return nil }
func (sharedNames) created(*queue)                              {}
func (sharedNames) wrote([]touch)                               {}
