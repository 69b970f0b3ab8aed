package queuecore_test

import (
	"errors"
	"strings"
	"testing"

	"yirangmq/queuecore"
)

// A consumer is never handed a message that fails its queue's current
// validation: a redrive, a replay and a forward check the body again
// (issue 40: `mv dlq/bad inbox/` of a message that had failed the schema
// was delivered and acked).
func TestRedriveReplayForwardValidateAgain(t *testing.T) {
	const schema = `{"format": "json", "schema": {"type": "object", "required": ["order"], "properties": {"order": {"type": "number"}}}}`
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", schema)
		wantValidation := func(what string, err error) {
			t.Helper()
			var ve *queuecore.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("%s: %v, want a validation error", what, err)
			}
		}
		nothingReady := func(what string) {
			t.Helper()
			if m, err := e.core.Next(e.ctx, "q", "", true); !errors.Is(err, queuecore.ErrEmpty) {
				t.Fatalf("%s: a consumer got %q (%v)", what, m.Name, err)
			}
		}

		// Dead-lettered by its validation, then redriven.
		_, err := e.core.Publish(e.ctx, "q", "bad-3", []byte(`{"order": "x"}`), queuecore.PublishOptions{})
		wantValidation("publish", err)
		_, err = e.core.Redrive(e.ctx, "q", "bad-3")
		wantValidation("redrive", err)
		e.get("q", queuecore.StateDead, "bad-3") // stays where it was
		nothingReady("after the redrive")
		_, err = e.core.Move(e.ctx, queuecore.MoveRequest{Queue: "q", From: queuecore.StateDead, Name: "bad-3", ToQueue: "q", To: queuecore.StateReady})
		wantValidation("mv dlq/bad-3 inbox/", err)

		// Published before the schema was set, dead-lettered by hand.
		e.queue("late", "")
		e.publish("late", "old", "plain text")
		if _, err := e.core.DeadLetter(e.ctx, "late", "old", queuecore.StateReady); err != nil {
			t.Fatal(err)
		}
		if err := e.core.SetPolicy(e.ctx, "late", []byte(`{"format": "json"}`)); err != nil {
			t.Fatal(err)
		}
		_, err = e.core.Redrive(e.ctx, "late", "old")
		wantValidation("redrive under a new format", err)
		// With the format it was published under, it goes.
		if err := e.core.SetPolicy(e.ctx, "late", []byte(`{"format": "raw"}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.core.Redrive(e.ctx, "late", "old"); err != nil {
			t.Fatal(err)
		}

		// Replayed from the archive after the queue's format changed:
		// kept in dlq/, never ready.
		e.queue("r", "")
		e.publish("r", "m", "not json")
		mustLeaseFrom(t, e, "r", "m")
		if err := e.core.Ack(e.ctx, "r", "m"); err != nil {
			t.Fatal(err)
		}
		if err := e.core.SetPolicy(e.ctx, "r", []byte(`{"format": "json"}`)); err != nil {
			t.Fatal(err)
		}
		_, err = e.core.Replay(e.ctx, "r", "m")
		wantValidation("replay", err)
		if names := e.names("r", queuecore.StateReady); len(names) != 0 {
			t.Fatalf("replay of an invalid body made %q ready", names)
		}

		// Forwarded to a queue whose schema it fails: stays leased here.
		e.queue("a", "")
		e.publish("a", "f", `{"order": "x"}`)
		mustLeaseFrom(t, e, "a", "f")
		_, err = e.core.Forward(e.ctx, "a", "f", "q")
		wantValidation("forward", err)
		e.get("a", queuecore.StateLeased, "f")
		nothingReady("after the forward")

		// A valid message is redriven as before.
		e.publish("q", "good", `{"order": 1}`)
		mustLeaseFrom(t, e, "q", "good")
		if _, err := e.core.DeadLetter(e.ctx, "q", "good", queuecore.StateLeased); err != nil {
			t.Fatal(err)
		}
		if _, err := e.core.Redrive(e.ctx, "q", "good"); err != nil {
			t.Fatal(err)
		}
		e.get("q", queuecore.StateReady, "good")
	})
}

func mustLeaseFrom(t *testing.T, e *env, q, name string) {
	t.Helper()
	if _, err := e.core.Lease(e.ctx, q, name, ""); err != nil {
		t.Fatalf("lease %s/%s: %v", q, name, err)
	}
}

// A refused policy names the field as the document does, also since the
// document is read through a struct that takes .policy's "lastRefused".
func TestPolicyErrorNamesTheField(t *testing.T) {
	_, err := queuecore.ParsePolicy([]byte(`{"visibilityTimeoutSec": "abc"}`))
	if err == nil || !strings.Contains(err.Error(), `field "visibilityTimeoutSec" must be a number`) {
		t.Errorf("policy with a string timeout: %v, want it to name the field", err)
	}
	_, err = queuecore.ParsePolicy([]byte(`{"retry": {"limit": "x"}}`))
	if err == nil || !strings.Contains(err.Error(), `field "retry.limit"`) {
		t.Errorf("policy with a string retry.limit: %v, want it to name the field", err)
	}
	// What .policy shows of a refusal is taken back and ignored.
	p, err := queuecore.ParsePolicy([]byte(`{"maxReady": 7, "lastRefused": {"errno": "EINVAL", "reason": "x"}}`))
	if err != nil || p.MaxReady != 7 {
		t.Errorf("a policy carrying lastRefused: %v, %v", p.MaxReady, err)
	}
}
