package queuecore_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"yirangmq/queuecore"
)

// archiveReads counts the store's look-ups of archived names, and fails
// the next Apply when failNext is set.
type archiveReads struct {
	queuecore.Store
	reads    atomic.Int64
	failNext atomic.Bool
}

func (s *archiveReads) Lookup(ctx context.Context, queue, name string, archived bool) (queuecore.Message, error) {
	if archived {
		s.reads.Add(1)
	}
	return s.Store.Lookup(ctx, queue, name, archived)
}

var errApplyRefused = errors.New("apply refused by the test")

func (s *archiveReads) Apply(ctx context.Context, ops []queuecore.Op) error {
	if s.failNext.CompareAndSwap(true, false) {
		return errApplyRefused
	}
	return s.Store.Apply(ctx, ops)
}

// An ack with the archive on replaces the archived message of the same
// name; it reads the store for one only when the archive may hold the
// name: never for a name new to the archive, after a restart too, and
// always once a failed commit left the archive uncounted.
func TestAckReadsArchiveOnlyForKnownNames(t *testing.T) {
	for _, st := range stores[:2] { // the stores of this daemon alone
		t.Run(st.name, func(t *testing.T) {
			open := st.opener(t)
			var rs *archiveReads
			e := newEnv(t, func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
				s, err := open(ctx, dir, sync)
				if err != nil {
					return nil, err
				}
				rs = &archiveReads{Store: s}
				return rs, nil
			})
			e.queue("q", "") // the default policy: the archive is on
			roundTrip := func(name string) queuecore.Message {
				t.Helper()
				p := e.publish("q", name, "body of "+name)
				mustLease(t, e, name)
				if err := e.core.Ack(e.ctx, "q", name); err != nil {
					t.Fatalf("ack %s: %v", name, err)
				}
				return p
			}
			// wantReads checks the reads since the last check.
			var seen int64
			wantReads := func(what string, want int64) {
				t.Helper()
				n := rs.reads.Load()
				if n-seen != want {
					t.Errorf("%s: %d reads of archived names, want %d", what, n-seen, want)
				}
				seen = n
			}
			// wantOneArchived checks that the archive holds name once: the
			// message p.
			wantOneArchived := func(name string, p queuecore.Message) {
				t.Helper()
				n := 0
				for _, a := range e.names("q", queuecore.StateArchived) {
					if a == name {
						n++
					}
				}
				if n != 1 {
					t.Fatalf("archive/ holds %s %d times, want once", name, n)
				}
				if m := e.get("q", queuecore.StateArchived, name); m.ID != p.ID {
					t.Errorf("archive/%s is message %d, want the latest ack's, %d", name, m.ID, p.ID)
				}
				seen = rs.reads.Load() // the checks read the archive too
			}

			for i := range 50 {
				roundTrip(fmt.Sprintf("m%d", i))
			}
			wantReads("50 acks of new names", 0)
			again := roundTrip("m0")
			wantReads("an ack of a name in the archive", 1)
			wantOneArchived("m0", again)

			// Counted again at the open.
			e.restart()
			seen = rs.reads.Load()
			for i := range 20 {
				roundTrip(fmt.Sprintf("n%d", i))
			}
			wantReads("20 acks of new names after a restart", 0)
			again = roundTrip("m1")
			wantReads("an ack of a name archived before the restart", 1)
			wantOneArchived("m1", again)

			// A failed commit may have been kept by the store: the archive
			// is read for every name from then on.
			e.publish("q", "x1", "x")
			mustLease(t, e, "x1")
			rs.failNext.Store(true)
			if err := e.core.Ack(e.ctx, "q", "x1"); !errors.Is(err, errApplyRefused) {
				t.Fatalf("ack with Apply refused: %v, want %v", err, errApplyRefused)
			}
			wantReads("the refused ack", 0)
			if err := e.core.Ack(e.ctx, "q", "x1"); err != nil {
				t.Fatalf("ack x1 again: %v", err)
			}
			roundTrip("x2")
			wantReads("two acks after a failed commit", 2)
		})
	}
}
