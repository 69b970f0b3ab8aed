package queuecore_test

import (
	"errors"
	"testing"

	"yirangmq/queuecore"
)

// Rename gives a ready message a free name in one step, keeping its ID,
// place in line and attempts; it refuses a leased message, a live name
// and a draft name, and survives a restart.
func TestRename(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", "")
		first := e.publish("q", "tmp-1", "one")
		e.publish("q", "later", "two")
		m, err := e.core.Rename(e.ctx, "q", "tmp-1", "final")
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "id", m.ID, first.ID)
		equal(t, "name", m.Name, "final")
		equalNames(t, "inbox in order", e.names("q", queuecore.StateReady), "final", "later")
		_, err = e.core.Rename(e.ctx, "q", "tmp-1", "again")
		wantErr(t, err, queuecore.ErrNotFound)
		_, err = e.core.Rename(e.ctx, "q", "final", "later")
		wantErr(t, err, queuecore.ErrExists)
		var ie *queuecore.InputError
		if _, err = e.core.Rename(e.ctx, "q", "final", ".draft"); !errors.As(err, &ie) {
			t.Errorf("rename to a draft name: %v, want an InputError", err)
		}
		// The old name is free again: a publish may take it.
		e.publish("q", "tmp-1", "three")
		// A leased message keeps its name: a consumer won the race.
		mustLease(t, e, "later")
		_, err = e.core.Rename(e.ctx, "q", "later", "other")
		wantErr(t, err, queuecore.ErrNotFound)
		equal(t, "ready", e.stats("q").Ready, int64(2))
		e.restart()
		equalNames(t, "inbox after restart", e.names("q", queuecore.StateReady), "final", "tmp-1")
		b, err := e.core.Body(e.ctx, e.get("q", queuecore.StateReady, "final"))
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "body", string(b), "one")
	})
}

// A consumer that sets reason RELEASED on its lease gives the message back
// without an attempt; the next lease's plain nack counts again.
func TestReleaseWithoutAttempt(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"retry": {"limit": 1, "backoff": "fixed", "initialDelaySec": 5, "maxDelaySec": 5}}`)
		e.publish("q", "m", "x")
		for i := 0; i < 3; i++ { // more give-backs than the retry limit: never dead
			mustLease(t, e, "m")
			if err := e.core.SetReason(e.ctx, "q", "m", queuecore.ReasonReleased, ""); err != nil {
				t.Fatal(err)
			}
			r, err := e.core.Nack(e.ctx, "q", "m")
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "state after give-back", r.State, queuecore.StateReady)
			equal(t, "attempts after give-back", r.Attempts, 0)
			equal(t, "reason after give-back", r.Reason, queuecore.ReasonReleased)
		}
		equal(t, "nacked_total", e.stats("q").NackedTotal, int64(0))
		mustLease(t, e, "m")
		r, err := e.core.Nack(e.ctx, "q", "m")
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "state after nack", r.State, queuecore.StateDelayed)
		equal(t, "attempts after nack", r.Attempts, 1)
		equal(t, "reason after nack", r.Reason, queuecore.ReasonNacked)
	})
}
