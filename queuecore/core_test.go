package queuecore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"yirangmq/queuecore"
	"yirangmq/testenv"
)

// noRetryDelay: retries go straight back to inbox/.
const noRetryDelay = `{"retry": {"limit": 2, "initialDelaySec": 0, "maxDelaySec": 0}}`

func TestPublishLeaseAck(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("jobs", "")
		m := e.publish("jobs", "a.txt", "hello")
		equal(t, "state", m.State, queuecore.StateReady)
		equal(t, "uid", m.UID, uint32(1000))
		if m.MessageID == "" || !m.PublishedAt.Equal(t0) {
			t.Fatalf("publish metadata: %+v", m)
		}
		body, err := e.core.Body(e.ctx, e.get("jobs", queuecore.StateReady, "a.txt"))
		if err != nil || string(body) != "hello" {
			t.Fatalf("peek = %q, %v", body, err)
		}
		l, err := e.core.Lease(e.ctx, "jobs", "a.txt", "uid=0 pid=1 cmd=mv")
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "lease deadline", l.Deadline, t0.Add(30*time.Second))
		equal(t, "consumer", l.Consumer, "uid=0 pid=1 cmd=mv")
		if err := e.core.Ack(e.ctx, "jobs", "a.txt"); err != nil {
			t.Fatal(err)
		}
		a := e.get("jobs", queuecore.StateArchived, "a.txt")
		equal(t, "archived at", a.StateAt, t0)
		s := e.stats("jobs")
		equal(t, "ready", s.Ready, int64(0))
		equal(t, "archived", s.Archived, int64(1))
		equal(t, "published_total", s.PublishedTotal, int64(1))
		equal(t, "leased_total", s.LeasedTotal, int64(1))
		equal(t, "acked_total", s.AckedTotal, int64(1))
		equal(t, "bytes", s.Bytes, int64(5))

		// The name is free again once acked, and archive keeps the latest ack.
		e.publish("jobs", "a.txt", "again")
		if _, err := e.core.Lease(e.ctx, "jobs", "a.txt", ""); err != nil {
			t.Fatal(err)
		}
		if err := e.core.Ack(e.ctx, "jobs", "a.txt"); err != nil {
			t.Fatal(err)
		}
		body, _ = e.core.Body(e.ctx, e.get("jobs", queuecore.StateArchived, "a.txt"))
		equal(t, "archived body", string(body), "again")
		equal(t, "archived count", e.stats("jobs").Archived, int64(1))
	})
}

func TestAckWithoutArchiveDeletes(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"archive": {"enabled": false}}`)
		e.publish("q", "m", "x")
		if _, err := e.core.Lease(e.ctx, "q", "m", ""); err != nil {
			t.Fatal(err)
		}
		if err := e.core.Ack(e.ctx, "q", "m"); err != nil {
			t.Fatal(err)
		}
		for _, s := range queuecore.States {
			if n := len(e.names("q", s)); n != 0 {
				t.Fatalf("%s holds %d messages after ack", s.Dir(), n)
			}
		}
		// A second ack of the same name: ENOENT.
		wantErr(t, e.core.Ack(e.ctx, "q", "m"), queuecore.ErrNotFound)
	})
}

func TestNamesAreUniqueAmongLiveMessages(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", "")
		e.queue("other", "")
		e.publish("q", "x", "1")
		_, err := e.core.Publish(e.ctx, "q", "x", []byte("2"), queuecore.PublishOptions{})
		wantErr(t, err, queuecore.ErrExists)
		if _, err := e.core.Lease(e.ctx, "q", "x", ""); err != nil {
			t.Fatal(err)
		}
		_, err = e.core.Publish(e.ctx, "q", "x", []byte("3"), queuecore.PublishOptions{})
		wantErr(t, err, queuecore.ErrExists) // live in processing/
		e.publish("other", "x", "4")         // other queues are separate
	})
}

func TestBadInput(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"maxMessageBytes": 8}`)
		for _, name := range []string{"", ".hidden", "a/b", "nul\x00", strings.Repeat("n", 256)} {
			_, err := e.core.Publish(e.ctx, "q", name, nil, queuecore.PublishOptions{})
			var ie *queuecore.InputError
			if !errors.As(err, &ie) || !errors.Is(err, queuecore.ErrInvalidName) {
				t.Errorf("publish name %q: %v, want an invalid name error", name, err)
			}
		}
		for _, q := range []string{"", ".q", "a b", "é", strings.Repeat("q", 129), "x/y"} {
			var ie *queuecore.InputError
			if err := e.core.CreateQueue(e.ctx, q, 0, 0, 0o755); !errors.As(err, &ie) {
				t.Errorf("create queue %q: %v, want an input error", q, err)
			}
		}
		wantErr(t, e.core.CreateQueue(e.ctx, "q", 0, 0, 0o755), queuecore.ErrExists)
		_, err := e.core.Publish(e.ctx, "q", "big", []byte("123456789"), queuecore.PublishOptions{})
		wantErr(t, err, queuecore.ErrTooLarge)
		_, err = e.core.Publish(e.ctx, "nope", "m", nil, queuecore.PublishOptions{})
		wantErr(t, err, queuecore.ErrNotFound)
		_, err = e.core.Lease(e.ctx, "q", "missing", "")
		wantErr(t, err, queuecore.ErrNotFound)
		_, err = e.core.Nack(e.ctx, "q", "missing")
		wantErr(t, err, queuecore.ErrNotFound)
		// Operations in the wrong state.
		e.publish("q", "m", "x")
		wantErr(t, e.core.Ack(e.ctx, "q", "m"), queuecore.ErrNotFound) // not leased
		_, err = e.core.Extend(e.ctx, "q", "m", time.Time{})
		wantErr(t, err, queuecore.ErrNotFound)
		_, err = e.core.Redrive(e.ctx, "q", "m")
		wantErr(t, err, queuecore.ErrNotFound)
		wantErr(t, e.core.Delete(e.ctx, "q", queuecore.StateLeased, "m"), queuecore.ErrNotAllowed)
		wantErr(t, e.core.SetReason(e.ctx, "q", "m", "X", ""), queuecore.ErrNotFound)
	})
}

func TestMoveTable(t *testing.T) {
	type row struct {
		from, to queuecore.State
		err      error
	}
	R, L, D, X, A := queuecore.StateReady, queuecore.StateLeased, queuecore.StateDelayed, queuecore.StateDead, queuecore.StateArchived
	rows := []row{
		{R, L, nil}, {L, R, nil}, {R, X, nil}, {L, X, nil}, {D, X, nil}, {X, R, nil}, {A, R, nil}, {D, R, nil},
		{R, D, queuecore.ErrNotAllowed}, {R, A, queuecore.ErrNotAllowed}, {L, A, queuecore.ErrNotAllowed},
		{L, D, queuecore.ErrNotAllowed}, {X, L, queuecore.ErrNotAllowed}, {A, L, queuecore.ErrNotAllowed},
		{X, A, queuecore.ErrNotAllowed}, {D, L, queuecore.ErrNotAllowed}, {A, X, queuecore.ErrNotAllowed},
	}
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"retry": {"limit": 3, "initialDelaySec": 5, "maxDelaySec": 5}}`)
		for i, r := range rows {
			name := fmt.Sprintf("m%d", i)
			// Put a message in state r.from.
			e.publish("q", name, "body")
			switch r.from {
			case L:
				mustLease(t, e, name)
			case D:
				mustLease(t, e, name)
				if _, err := e.core.Nack(e.ctx, "q", name); err != nil {
					t.Fatal(err)
				}
			case X:
				if _, err := e.core.DeadLetter(e.ctx, "q", name, R); err != nil {
					t.Fatal(err)
				}
			case A:
				mustLease(t, e, name)
				if err := e.core.Ack(e.ctx, "q", name); err != nil {
					t.Fatal(err)
				}
			}
			e.get("q", r.from, name)
			_, err := e.core.Move(e.ctx, queuecore.MoveRequest{Queue: "q", From: r.from, Name: name, ToQueue: "q", To: r.to})
			if !errors.Is(err, r.err) || (r.err == nil && err != nil) {
				t.Errorf("%s -> %s: %v, want %v", r.from.Dir(), r.to.Dir(), err, r.err)
				continue
			}
			if r.err == nil {
				want := r.to
				if r.from == L && r.to == R {
					want = D // a nack waits out its backoff
				}
				e.get("q", want, name)
			}
			// Not where the caller says: ENOENT.
			_, err = e.core.Move(e.ctx, queuecore.MoveRequest{Queue: "q", From: r.from, Name: name + "-missing", ToQueue: "q", To: r.to})
			if r.err == nil {
				wantErr(t, err, queuecore.ErrNotFound)
			}
		}
	})
}

func mustLease(t *testing.T, e *env, name string) queuecore.Message {
	t.Helper()
	m, err := e.core.Lease(e.ctx, "q", name, "")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRacingLeasesExactlyOneWins(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", "")
		for round := 0; round < 20; round++ {
			name := fmt.Sprintf("m%d", round)
			e.publish("q", name, "x")
			var wins, losses sync.WaitGroup
			var mu sync.Mutex
			won, lost := 0, 0
			for i := 0; i < 8; i++ {
				wins.Add(1)
				go func() {
					defer wins.Done()
					_, err := e.core.Lease(e.ctx, "q", name, "")
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						won++
					case errors.Is(err, queuecore.ErrNotFound):
						lost++
					default:
						t.Errorf("lease: %v", err)
					}
				}()
			}
			wins.Wait()
			losses.Wait()
			if won != 1 || lost != 7 {
				t.Fatalf("round %d: %d won, %d lost; want 1 and 7", round, won, lost)
			}
		}
	})
}

func TestNextBlocksAndWakes(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", "")
		_, err := e.core.Next(e.ctx, "q", "", true)
		wantErr(t, err, queuecore.ErrEmpty)

		got := make(chan queuecore.Message, 1)
		go func() {
			m, err := e.core.Next(e.ctx, "q", "reader", false)
			if err != nil {
				t.Errorf("next: %v", err)
			}
			got <- m
		}()
		waitBlocked(t, e, "q")
		e.publish("q", "wake", "x")
		select {
		case m := <-got:
			equal(t, "leased", m.Name, "wake")
			equal(t, "state", m.State, queuecore.StateLeased)
		case <-time.After(5 * time.Second):
			t.Fatal("Next did not wake on publish")
		}

		// Cancelled while waiting: returns the context's error, takes no lease.
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan error, 1)
		go func() {
			_, err := e.core.Next(ctx, "q", "", false)
			done <- err
		}()
		waitBlocked(t, e, "q")
		cancel()
		wantErr(t, <-done, context.Canceled)
		e.publish("q", "after", "x")
		e.get("q", queuecore.StateReady, "after")
	})
}

// waitBlocked waits until a Next call waits on queue.
func waitBlocked(t *testing.T, e *env, queue string) {
	t.Helper()
	testenv.MustRetryUntil(t, 5*time.Second, "a Next call waiting on "+queue, func() bool {
		return queuecore.Waiting(e.core, queue) > 0
	})
}

func TestPausedQueue(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"paused": true}`)
		e.publish("q", "m", "x") // publishing goes on
		_, err := e.core.Lease(e.ctx, "q", "m", "")
		wantErr(t, err, queuecore.ErrPaused)
		_, err = e.core.Next(e.ctx, "q", "", true)
		wantErr(t, err, queuecore.ErrPaused)
		got := make(chan error, 1)
		go func() {
			_, err := e.core.Next(e.ctx, "q", "", false)
			got <- err
		}()
		select {
		case err := <-got:
			t.Fatalf("Next returned on a paused queue: %v", err)
		case <-time.After(30 * time.Millisecond):
		}
		if err := e.core.SetPaused(e.ctx, "q", false); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("resume did not wake Next")
		}
		equal(t, "paused stat", e.stats("q").Paused, false)
	})
}

func TestDeliveryOrderPriorityThenFIFO(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"format": "envelope"}`)
		for _, m := range []struct{ name, prio string }{{"low1", "0"}, {"high1", "5"}, {"low2", "0"}, {"high2", "5"}, {"mid", "2"}} {
			e.publish("q", m.name, `{"attributes": {"priority": `+m.prio+`}, "payload": {}}`)
		}
		equalNames(t, "inbox order", e.names("q", queuecore.StateReady), "high1", "high2", "mid", "low1", "low2")
		var leased []string
		for i := 0; i < 5; i++ {
			m, err := e.core.Next(e.ctx, "q", "", true)
			if err != nil {
				t.Fatal(err)
			}
			leased = append(leased, m.Name)
		}
		equalNames(t, "lease order", leased, "high1", "high2", "mid", "low1", "low2")
	})
}

func TestExpiryRetriesThenDeadLetters(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"visibilityTimeoutSec": 10, "retry": {"limit": 1, "backoff": "fixed", "initialDelaySec": 3, "maxDelaySec": 3}}`)
		e.publish("q", "m", "x")
		mustLease(t, e, "m")
		e.clock.Advance(10 * time.Second)
		d := e.waitState("q", queuecore.StateDelayed, "m")
		equal(t, "attempts", d.Attempts, 1)
		equal(t, "reason", d.Reason, queuecore.ReasonLeaseExpired)
		equal(t, "due", d.Deadline, t0.Add(13*time.Second))
		e.clock.Advance(3 * time.Second)
		e.waitState("q", queuecore.StateReady, "m")
		mustLease(t, e, "m")
		e.clock.Advance(10 * time.Second)
		x := e.waitState("q", queuecore.StateDead, "m")
		equal(t, "attempts", x.Attempts, 2)
		equal(t, "reason", x.Reason, queuecore.ReasonLeaseExpired)
		// Counters follow the commit (on the scheduler's goroutine) that a
		// reader of the store may see first.
		var s queuecore.QueueStats
		testenv.RetryUntil(5*time.Second, func() bool { s = e.settledStats("q"); return s.ExpiredTotal >= 2 })
		equal(t, "expired_total", s.ExpiredTotal, int64(2))
		equal(t, "dead_lettered_total", s.DeadLetteredTotal, int64(1))
		equal(t, "dlq", s.DLQ, int64(1))
	})
}

func TestExtendKeepsLease(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"visibilityTimeoutSec": 10, "maxLeaseSec": 60}`)
		e.publish("q", "m", "x")
		mustLease(t, e, "m")
		e.clock.Advance(8 * time.Second)
		m, err := e.core.Extend(e.ctx, "q", "m", time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "deadline", m.Deadline, t0.Add(18*time.Second))
		e.clock.Advance(5 * time.Second)  // past the first deadline, not the new one
		time.Sleep(20 * time.Millisecond) // give a wrong expiry the time to show: nothing marks the scheduler idle
		e.get("q", queuecore.StateLeased, "m")
		m, err = e.core.Extend(e.ctx, "q", "m", t0.Add(24*time.Hour)) // capped
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "capped deadline", m.Deadline, t0.Add(13*time.Second+60*time.Second))
	})
}

func TestNackBackoffAndReason(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"retry": {"limit": 2, "backoff": "exponential", "initialDelaySec": 2, "maxDelaySec": 3}}`)
		e.publish("q", "m", "x")
		mustLease(t, e, "m")
		if err := e.core.SetReason(e.ctx, "q", "m", "BAD_INPUT", "field x missing"); err != nil {
			t.Fatal(err)
		}
		d, err := e.core.Nack(e.ctx, "q", "m")
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "state", d.State, queuecore.StateDelayed)
		equal(t, "due", d.Deadline, t0.Add(2*time.Second))
		equal(t, "reason", d.Reason, "BAD_INPUT")
		if _, err := e.core.RunNow(e.ctx, "q", "m"); err != nil {
			t.Fatal(err)
		}
		mustLease(t, e, "m")
		d, _ = e.core.Nack(e.ctx, "q", "m")
		equal(t, "second backoff (capped)", d.Deadline, t0.Add(3*time.Second))
		equal(t, "default reason", d.Reason, queuecore.ReasonNacked)
		e.clock.Advance(3 * time.Second)
		e.waitState("q", queuecore.StateReady, "m")
		mustLease(t, e, "m")
		x, _ := e.core.Nack(e.ctx, "q", "m")
		equal(t, "state after limit", x.State, queuecore.StateDead)
		equal(t, "nacked_total", e.stats("q").NackedTotal, int64(3))
	})
}

func TestDeadLetterRedriveReplayRunNow(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", noRetryDelay)
		e.publish("q", "m", "body")
		mustLease(t, e, "m")
		x, err := e.core.DeadLetter(e.ctx, "q", "m", queuecore.StateLeased)
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "reason", x.Reason, queuecore.ReasonManual)
		e.clock.Advance(time.Minute)
		r, err := e.core.Redrive(e.ctx, "q", "m")
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "redrives", r.Redrives, 1)
		equal(t, "attempts", r.Attempts, 0)
		equal(t, "first publish kept", r.FirstAt, t0)
		mustLease(t, e, "m")
		if err := e.core.Ack(e.ctx, "q", "m"); err != nil {
			t.Fatal(err)
		}
		p, err := e.core.Replay(e.ctx, "q", "m")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := e.core.Body(e.ctx, p.Message)
		equal(t, "replayed body", string(body), "body")
		e.get("q", queuecore.StateArchived, "m") // the archived copy stays
		_, err = e.core.Replay(e.ctx, "q", "m")
		wantErr(t, err, queuecore.ErrExists) // the name is live again
	})
}

func TestForwardIsOneStep(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("a", "")
		e.queue("b", "")
		e.publish("a", "m", "payload")
		if _, err := e.core.Lease(e.ctx, "a", "m", ""); err != nil {
			t.Fatal(err)
		}
		f, err := e.core.Move(e.ctx, queuecore.MoveRequest{Queue: "a", From: queuecore.StateLeased, Name: "m", ToQueue: "b", To: queuecore.StateReady})
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "forwarded queue", f.Queue, "b")
		e.get("a", queuecore.StateArchived, "m")
		body, _ := e.core.Body(e.ctx, e.get("b", queuecore.StateReady, "m"))
		equal(t, "forwarded body", string(body), "payload")
		// Only leased messages may be forwarded.
		e.publish("a", "n", "x")
		_, err = e.core.Move(e.ctx, queuecore.MoveRequest{Queue: "a", From: queuecore.StateReady, Name: "n", ToQueue: "b", To: queuecore.StateReady})
		wantErr(t, err, queuecore.ErrNotAllowed)
		// A name live in the target: EEXIST, nothing moves.
		e.publish("b", "n", "y")
		if _, err := e.core.Lease(e.ctx, "a", "n", ""); err != nil {
			t.Fatal(err)
		}
		_, err = e.core.Forward(e.ctx, "a", "n", "b")
		wantErr(t, err, queuecore.ErrExists)
		e.get("a", queuecore.StateLeased, "n")
	})
}

func TestDeleteAndPurge(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", "")
		for i := 0; i < 600; i++ {
			e.publish("q", fmt.Sprintf("m%03d", i), "x")
		}
		if err := e.core.Delete(e.ctx, "q", queuecore.StateReady, "m000"); err != nil {
			t.Fatal(err)
		}
		wantErr(t, e.core.Delete(e.ctx, "q", queuecore.StateReady, "m000"), queuecore.ErrNotFound)
		mustLease(t, e, "m001")
		n, err := e.core.Purge(e.ctx, "q", queuecore.StateReady)
		if err != nil {
			t.Fatal(err)
		}
		equal(t, "purged", n, 598)
		s := e.stats("q")
		equal(t, "ready", s.Ready, int64(0))
		equal(t, "inflight", s.Inflight, int64(1))
		wantErr(t, e.core.DeleteQueue(e.ctx, "q", false), queuecore.ErrNotEmpty)
		if err := e.core.DeleteQueue(e.ctx, "q", true); err != nil {
			t.Fatal(err)
		}
		_, err = e.core.Stats(e.ctx, "q")
		wantErr(t, err, queuecore.ErrNotFound)
		e.queue("q", "") // the name can be used again, empty
		equal(t, "ready in new queue", e.stats("q").Ready, int64(0))
	})
}

func TestValidationKeepsRejectsInDLQ(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("j", `{"format": "json"}`)
		e.queue("s", `{"format": "json", "schema": {"type": "object", "required": ["temp"], "properties": {"temp": {"type": "number"}}}}`)
		e.queue("env", `{"format": "envelope"}`)
		cases := []struct{ q, name, body string }{
			{"j", "bad-json", "{oops"},
			{"j", "two-values", "1 2"},
			{"j", "empty", ""},
			{"s", "no-temp", `{"hum": 3}`},
			{"s", "temp-string", `{"temp": "hot"}`},
			{"env", "not-object", `[1]`},
			{"env", "unknown-field", `{"payload": {}, "colour": "red"}`},
			{"env", "no-payload", `{"type": "x"}`},
			{"env", "bad-time", `{"payload": 1, "timestamp": "yesterday"}`},
			{"env", "wrong-queue", `{"payload": 1, "queue": "other"}`},
			{"env", "bad-priority", `{"payload": 1, "attributes": {"priority": "high"}}`},
		}
		for _, c := range cases {
			_, err := e.core.Publish(e.ctx, c.q, c.name, []byte(c.body), queuecore.PublishOptions{})
			var ve *queuecore.ValidationError
			if !errors.As(err, &ve) || !ve.Kept {
				t.Errorf("%s/%s: %v, want a kept validation error", c.q, c.name, err)
				continue
			}
			x := e.get(c.q, queuecore.StateDead, c.name)
			equal(t, c.name+" reason", x.Reason, queuecore.ReasonValidation)
			if x.ReasonMessage == "" {
				t.Errorf("%s: no reason message", c.name)
			}
		}
		equal(t, "rejected_total", e.stats("env").RejectedTotal, int64(6))
		e.publish("s", "ok", `{"temp": 21.5}`)
		e.publish("j", "ok", `[1, 2]`)
	})
}

func TestEnvelopeFillsIDAndDelays(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"format": "envelope"}`)
		m := e.publish("q", "m", `{"type": "t", "payload": {"a": 1}}`)
		body, _ := e.core.Body(e.ctx, m)
		if !strings.Contains(string(body), `"messageId":"`+m.MessageID+`"`) || !strings.Contains(string(body), `"timestamp":"2026-01-13T10:00:00Z"`) {
			t.Fatalf("envelope not filled in: %s", body)
		}
		d := e.publish("q", "later", `{"messageId": "id-1", "attributes": {"delaySec": 5}, "payload": null}`)
		equal(t, "state", d.State, queuecore.StateDelayed)
		equal(t, "message id", d.MessageID, "id-1")
		e.clock.Advance(5 * time.Second)
		e.waitState("q", queuecore.StateReady, "later")
	})
}

func TestDedupWindow(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"format": "envelope", "dedupWindowSec": 60}`)
		e.publish("q", "a", `{"deduplicationKey": "k1", "payload": 1}`)
		r, err := e.core.Publish(e.ctx, "q", "b", []byte(`{"deduplicationKey": "k1", "payload": 2}`), queuecore.PublishOptions{})
		if err != nil || !r.Deduplicated {
			t.Fatalf("duplicate: %+v, %v", r, err)
		}
		e.clock.Advance(61 * time.Second)
		e.publish("q", "c", `{"deduplicationKey": "k1", "payload": 3}`)
		s := e.stats("q")
		equal(t, "ready", s.Ready, int64(2))
		equal(t, "deduplicated_total", s.DeduplicatedTotal, int64(1))
	})
}

func TestMaxReadyBackpressure(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"maxReady": 2}`)
		e.publish("q", "a", "x")
		e.publish("q", "b", "x")
		_, err := e.core.Publish(e.ctx, "q", "c", []byte("x"), queuecore.PublishOptions{})
		wantErr(t, err, queuecore.ErrQueueFull)
		mustLease(t, e, "a")
		e.publish("q", "c", "x")
	})
}

func TestFanoutCopies(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("sub1", "")
		e.queue("sub2", "")
		e.queue("topic", `{"fanout": ["sub1", "sub2"]}`)
		e.publish("topic", "ev", "data")
		for _, q := range []string{"topic", "sub1", "sub2"} {
			body, _ := e.core.Body(e.ctx, e.get(q, queuecore.StateReady, "ev"))
			equal(t, q+" body", string(body), "data")
		}
		var ie *queuecore.InputError
		if err := e.core.SetPolicy(e.ctx, "topic", []byte(`{"fanout": ["missing"]}`)); !errors.As(err, &ie) {
			t.Fatalf("fanout to a missing queue: %v", err)
		}
	})
}

func TestRetention(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"archive": {"enabled": true, "retentionSec": 100, "maxMessages": 3}, "dlq": {"enabled": true, "retentionDays": 1}}`)
		for i := 0; i < 5; i++ {
			name := fmt.Sprintf("m%d", i)
			e.publish("q", name, "x")
			mustLease(t, e, name)
			if err := e.core.Ack(e.ctx, "q", name); err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(time.Second)
		}
		// A shared store's gauge read that overlaps the pruner's commits
		// may count one of them twice until the next read (sharedGauges):
		// wait until the gauge and the listing agree.
		if !testenv.RetryUntil(5*time.Second, func() bool {
			return e.settledStats("q").Archived == 3 && len(e.names("q", queuecore.StateArchived)) == 3
		}) {
			t.Fatalf("archive holds %d (gauge %d), want 3 (maxMessages)", len(e.names("q", queuecore.StateArchived)), e.settledStats("q").Archived)
		}
		equalNames(t, "archive keeps the newest", e.names("q", queuecore.StateArchived), "m2", "m3", "m4")
		e.publish("q", "dead", "x")
		if _, err := e.core.DeadLetter(e.ctx, "q", "dead", queuecore.StateReady); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(100 * time.Second)
		if !testenv.RetryUntil(5*time.Second, func() bool { return e.settledStats("q").Archived == 0 }) {
			t.Fatal("archive retention did not run")
		}
		equal(t, "dlq before a day", e.settledStats("q").DLQ, int64(1))
		e.clock.Advance(24 * time.Hour)
		if !testenv.RetryUntil(5*time.Second, func() bool { return e.settledStats("q").DLQ == 0 }) {
			t.Fatal("dlq retention did not run")
		}
	})
}

func TestLeasesSurviveRestart(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"visibilityTimeoutSec": 60}`)
		e.publish("q", "kept", "x")
		e.publish("q", "expires", "y")
		e.publish("q", "ready", "z")
		mustLease(t, e, "kept")
		mustLease(t, e, "expires")
		e.restart()
		if err := e.core.Ack(e.ctx, "q", "kept"); err != nil {
			t.Fatalf("ack after restart: %v", err)
		}
		e.clock.Advance(61 * time.Second)
		m := e.waitState("q", queuecore.StateDelayed, "expires")
		equal(t, "attempts", m.Attempts, 1)
		s := e.stats("q")
		equal(t, "ready after restart", s.Ready, int64(1))
		equal(t, "archived after restart", s.Archived, int64(1))
		// IDs are never reused after a restart.
		n := e.publish("q", "new", "w")
		if n.ID <= m.ID {
			t.Fatalf("new id %d not above %d", n.ID, m.ID)
		}
	})
}

func TestSchedulerSleepsWhenNothingIsDue(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"archive": {"enabled": false}}`)
		e.publish("q", "m", "x")
		mustLease(t, e, "m")
		if !testenv.RetryUntil(5*time.Second, func() bool { return e.clock.Pending() == 1 }) {
			t.Fatalf("%d timers armed for one lease, want 1", e.clock.Pending())
		}
		if err := e.core.Ack(e.ctx, "q", "m"); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(31 * time.Second) // the old timer fires, finds nothing
		if !testenv.RetryUntil(5*time.Second, func() bool { return e.clock.Pending() == 0 }) {
			t.Fatalf("%d timers armed with nothing due, want 0", e.clock.Pending())
		}
	})
}

// An ack that leaves no message leased or delayed drops the timer armed
// for its lease at once: an idle daemon does not wake when that lease
// would have run out. A timer another lease still needs stays.
func TestAckDropsTheTimerOfItsLease(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		if _, shared := e.store.(queuecore.SharedStore); shared {
			t.Skip("a shared store's leases are also other daemons': its timer stays")
		}
		e.queue("q", `{"archive": {"enabled": false}}`)
		e.publish("q", "a", "x")
		e.publish("q", "b", "x")
		mustLease(t, e, "a")
		if !testenv.RetryUntil(5*time.Second, func() bool { return e.clock.Pending() == 1 }) {
			t.Fatalf("%d timers armed for one lease, want 1", e.clock.Pending())
		}
		e.clock.Advance(10 * time.Second)
		mustLease(t, e, "b") // runs out 10 s after a's lease
		if err := e.core.Ack(e.ctx, "q", "a"); err != nil {
			t.Fatal(err)
		}
		if n := e.clock.Pending(); n != 1 {
			t.Fatalf("%d timers armed with b still leased, want 1", n)
		}
		e.clock.Advance(21 * time.Second) // a's deadline passes, b's is 10 s on
		if !testenv.RetryUntil(5*time.Second, func() bool { return e.clock.Pending() == 1 }) {
			t.Fatalf("%d timers armed with b still leased, want 1", e.clock.Pending())
		}
		equalNames(t, "leased after a's deadline", e.names("q", queuecore.StateLeased), "b")
		if err := e.core.Ack(e.ctx, "q", "b"); err != nil {
			t.Fatal(err)
		}
		if n := e.clock.Pending(); n != 0 {
			t.Fatalf("%d timers armed after the last ack, want 0 (no clock advance)", n)
		}
		// The next lease arms again, and its expiry still comes.
		e.publish("q", "c", "x")
		mustLease(t, e, "c")
		if !testenv.RetryUntil(5*time.Second, func() bool { return e.clock.Pending() == 1 }) {
			t.Fatalf("%d timers armed for a new lease, want 1", e.clock.Pending())
		}
		e.clock.Advance(31 * time.Second)
		e.waitState("q", queuecore.StateDelayed, "c")
	})
}

// Deleting a queue with leases takes them off the count of timed
// messages: a lease of another queue still expires, and its ack then
// drops the timer.
func TestDeletedQueueLeavesTheTimerRight(t *testing.T) {
	for _, st := range stores[:2] { // the stores of this daemon alone
		t.Run(st.name, func(t *testing.T) {
			e := newEnv(t, st.opener(t))
			e.queue("a", `{"archive": {"enabled": false}}`)
			e.queue("q", `{"archive": {"enabled": false}, "visibilityTimeoutSec": 60}`)
			for _, n := range []string{"a1", "a2"} {
				e.publish("a", n, "x")
				if _, err := e.core.Lease(e.ctx, "a", n, ""); err != nil {
					t.Fatal(err)
				}
			}
			e.publish("q", "m", "x")
			e.publish("q", "n", "x")
			mustLease(t, e, "m")
			if err := e.core.DeleteQueue(e.ctx, "a", true); err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(61 * time.Second)
			e.waitState("q", queuecore.StateDelayed, "m") // its lease ran out
			mustLease(t, e, "n")
			testenv.MustRetryUntil(t, 5*time.Second, "a timer for n's lease", func() bool { return e.clock.Pending() >= 1 })
			if err := e.core.Ack(e.ctx, "q", "n"); err != nil {
				t.Fatal(err)
			}
			// m is delayed (its backoff), so a timer stays for it.
			if n := e.clock.Pending(); n != 1 {
				t.Fatalf("%d timers armed with m delayed, want 1", n)
			}
			e.clock.Advance(time.Hour)
			e.waitState("q", queuecore.StateReady, "m")
			mustLease(t, e, "m")
			if err := e.core.Ack(e.ctx, "q", "m"); err != nil {
				t.Fatal(err)
			}
			if n := e.clock.Pending(); n != 0 {
				t.Fatalf("%d timers armed with nothing leased or delayed, want 0 (the deleted queue's leases still counted?)", n)
			}
		})
	}
}

// countingStore counts the scheduler's reads of the next due time.
type countingStore struct {
	queuecore.Store
	nextDue atomic.Int64
}

func (s *countingStore) NextDue(ctx context.Context) (time.Time, bool, error) {
	s.nextDue.Add(1)
	return s.Store.NextDue(ctx)
}

// Round trips one at a time arm the timer from the lease's own deadline:
// no scheduler run per lease, though each ack drops the timer.
func TestRoundTripsRunNoSchedulerPass(t *testing.T) {
	for _, st := range stores[:2] { // the stores of this daemon alone
		t.Run(st.name, func(t *testing.T) {
			open := st.opener(t)
			var cs *countingStore
			e := newEnv(t, func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
				s, err := open(ctx, dir, sync)
				if err != nil {
					return nil, err
				}
				cs = &countingStore{Store: s}
				return cs, nil
			})
			e.queue("q", `{"archive": {"enabled": false}}`)
			e.publish("q", "first", "x")
			mustLease(t, e, "first")
			if err := e.core.Ack(e.ctx, "q", "first"); err != nil {
				t.Fatal(err)
			}
			testenv.MustRetryUntil(t, 5*time.Second, "the scheduler's first runs", func() bool { return cs.nextDue.Load() > 0 })
			time.Sleep(50 * time.Millisecond) // a run kicked by the first lease ends
			before := cs.nextDue.Load()
			for i := range 100 {
				name := fmt.Sprintf("m%d", i)
				e.publish("q", name, "x")
				mustLease(t, e, name)
				if err := e.core.Ack(e.ctx, "q", name); err != nil {
					t.Fatal(err)
				}
			}
			// None is due; a few are allowed for a run still under way at
			// the start on a loaded machine (one per lease: 47 here).
			if n := cs.nextDue.Load() - before; n > 10 {
				t.Errorf("%d scheduler runs for 100 round trips, want none", n)
			}
			if n := e.clock.Pending(); n != 0 {
				t.Errorf("%d timers armed after the last ack, want 0", n)
			}
		})
	}
}

func TestNotifierHearsDaemonMoves(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"visibilityTimeoutSec": 1, "retry": {"limit": 0}}`)
		e.publish("q", "m", "x")
		mustLease(t, e, "m")
		for len(e.notes.ch) > 0 {
			<-e.notes.ch
		}
		e.clock.Advance(time.Second)
		select {
		case ev := <-e.notes.ch:
			want := queuecore.Event{Queue: "q", Name: "m", From: queuecore.StateLeased, To: queuecore.StateDead, ByDaemon: true}
			equal(t, "event", ev, want)
		case <-time.After(5 * time.Second):
			t.Fatal("no event for an expiry")
		}
	})
}

func TestConcurrentPublishersAndConsumers(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", "")
		const producers, each = 4, 50
		var wg sync.WaitGroup
		for p := 0; p < producers; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					if _, err := e.core.Publish(e.ctx, "q", fmt.Sprintf("p%d-%d", p, i), []byte("x"), queuecore.PublishOptions{}); err != nil {
						t.Errorf("publish: %v", err)
					}
				}
			}()
		}
		seen := sync.Map{}
		ctx, cancel := context.WithCancel(e.ctx)
		var cw sync.WaitGroup
		var count sync.WaitGroup
		count.Add(producers * each)
		for c := 0; c < 4; c++ {
			cw.Add(1)
			go func() {
				defer cw.Done()
				for {
					m, err := e.core.Next(ctx, "q", "", false)
					if err != nil {
						return
					}
					if _, dup := seen.LoadOrStore(m.Name, true); dup {
						t.Errorf("%s delivered twice", m.Name)
					}
					if err := e.core.Ack(e.ctx, "q", m.Name); err != nil {
						t.Errorf("ack: %v", err)
					}
					count.Done()
				}
			}()
		}
		wg.Wait()
		count.Wait()
		cancel()
		cw.Wait()
		s := e.stats("q")
		equal(t, "acked", s.AckedTotal, int64(producers*each))
		equal(t, "ready", s.Ready, int64(0))
		equal(t, "inflight", s.Inflight, int64(0))
	})
}
