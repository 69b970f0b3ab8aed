package queuecore

import (
	"context"
	"fmt"
)

// ErrConflict is what a shared store returns when an update or delete finds
// the message changed since the core read it: another daemon moved it
// first. It wraps ErrNotFound, so that a caller sees "not where you said"
// (ENOENT) and never a second lease.
var ErrConflict = fmt.Errorf("%w (changed by another daemon)", ErrNotFound)

// SharedStore is a Store that several daemons, on one or several hosts,
// use at the same time (the postgres store). The core then keeps nothing
// about messages that another daemon could change without it: every
// operation is checked against the store, the timed work is done by one
// daemon at a time, and what other daemons commit reaches it as hints.
//
// On top of the Store contract:
//
//   - Apply checks revisions: an OpUpdate or OpDelete applies only if the
//     stored message still has revision Msg.Rev, and an update stores
//     revision Msg.Rev+1. Otherwise the whole batch fails with ErrConflict
//     and nothing of it is applied. Lookup, List, Due and LeaseNext return
//     each message with its current revision.
//   - Every committed batch is announced to the other daemons (Subscribe).
type SharedStore interface {
	Store

	// ReserveIDs returns the first of n consecutive message IDs that no
	// other daemon of the store will ever use.
	ReserveIDs(ctx context.Context, n int) (first uint64, err error)

	// LeaseNext takes, in one transaction, the first ready message of queue
	// in delivery order (by SortKey, then Seq) whose name is not in skip and
	// that no other transaction holds (FOR UPDATE SKIP LOCKED), stores
	// change(m) in its place (with the revision check above) and returns
	// what it stored. ErrEmpty when there is none.
	LeaseNext(ctx context.Context, queue string, skip []string, change func(Message) Message) (Message, error)

	// Subscribe registers fn to hear what other daemons commit. Changes are
	// hints: they can be late or lost, and a Change with an empty Queue
	// means "anything may have changed" (sent after the store lost and
	// regained its connection). fn is called on one goroutine and must not
	// block for long.
	Subscribe(fn func(Change))

	// Duty reports whether this daemon now holds the store's timed work:
	// lease expiry, the end of backoffs and delays, retention. At most one
	// daemon of a store holds it at a time; when it dies another takes it
	// over within seconds.
	Duty() bool
}

// Change is a hint from a shared store that another daemon committed a
// change. Name is empty for a change of the queue itself (created, deleted,
// new policy or owner); Queue is empty for "anything may have changed".
type Change struct {
	Queue, Name string
	From, To    State // as in Event
}
