package queuecore

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDefaultPolicyRoundTrips(t *testing.T) {
	p, err := ParsePolicy(DefaultPolicy().JSON())
	if err != nil {
		t.Fatal(err)
	}
	if string(p.JSON()) != string(DefaultPolicy().JSON()) {
		t.Fatalf("default policy changed in a round trip:\n%s", p.JSON())
	}
	// A partial document keeps the defaults of what it leaves out.
	p, err = ParsePolicy([]byte(`{"retry": {"limit": 9}}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Retry.Limit != 9 || p.Retry.Backoff != "exponential" || p.VisibilityTimeoutSec != 30 {
		t.Fatalf("partial policy: %+v", p)
	}
}

func TestInvalidPolicies(t *testing.T) {
	cases := []struct{ doc, field string }{
		{``, "policy"},
		{`[]`, "policy"},
		{`{"visibilityTimeoutSec": "30"}`, "policy"},
		{`{"unknown": 1}`, "policy"},
		{`{"visibilityTimeoutSec": 0}`, "visibilityTimeoutSec"},
		{`{"visibilityTimeoutSec": 999999999}`, "visibilityTimeoutSec"},
		{`{"maxLeaseSec": 5}`, "maxLeaseSec"},
		{`{"retry": {"limit": -1}}`, "retry.limit"},
		{`{"retry": {"limit": 100000}}`, "retry.limit"},
		{`{"retry": {"backoff": "random"}}`, "retry.backoff"},
		{`{"retry": {"initialDelaySec": -1}}`, "retry.initialDelaySec"},
		{`{"retry": {"initialDelaySec": 10, "maxDelaySec": 5}}`, "retry.maxDelaySec"},
		{`{"dlq": {"retentionDays": -3}}`, "dlq.retentionDays"},
		{`{"dlq": {"enabled": "yes"}}`, "policy"},
		{`{"archive": {"retentionSec": -1}}`, "archive.retentionSec"},
		{`{"archive": {"maxMessages": -1}}`, "archive.maxMessages"},
		{`{"maxMessageBytes": 0}`, "maxMessageBytes"},
		{`{"maxMessageBytes": 1e12}`, "policy"},
		{`{"maxReady": -1}`, "maxReady"},
		{`{"format": "xml"}`, "format"},
		{`{"schema": {"type": "object"}}`, "schema"},
		{`{"format": "json", "schema": {"type": 12}}`, "schema"},
		{`{"format": "json", "schema": {"$ref": "http://example.com/s.json"}}`, "schema"},
		{`{"dedupWindowSec": -5}`, "dedupWindowSec"},
		{`{"fanout": ["bad name"]}`, "fanout"},
		{`{"fanout": ["a", "a"]}`, "fanout"},
		{`{"paused": 1}`, "policy"},
		{`{} {}`, "policy"},
		{strings.Repeat(`{"a":`, 20000) + "1" + strings.Repeat("}", 20000), "policy"},
	}
	for _, c := range cases {
		_, err := ParsePolicy([]byte(c.doc))
		var ie *InputError
		if !errors.As(err, &ie) {
			t.Errorf("%.60s: %v, want an input error", c.doc, err)
			continue
		}
		if !strings.Contains(ie.Field, c.field) {
			t.Errorf("%.60s: field %q, want it to name %q (%v)", c.doc, ie.Field, c.field, err)
		}
	}
}

func TestBackoff(t *testing.T) {
	p := DefaultPolicy()
	p.Retry = RetryPolicy{Limit: 10, Backoff: "exponential", InitialDelaySec: 1, MaxDelaySec: 60}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 60 * time.Second, 60 * time.Second}
	for i, w := range want {
		if got := p.Backoff(i + 1); got != w {
			t.Errorf("exponential attempt %d: %v, want %v", i+1, got, w)
		}
	}
	p.Retry.Backoff = "linear"
	if got := p.Backoff(3); got != 3*time.Second {
		t.Errorf("linear attempt 3: %v", got)
	}
	p.Retry.Backoff = "fixed"
	if got := p.Backoff(7); got != time.Second {
		t.Errorf("fixed attempt 7: %v", got)
	}
	if got := p.Backoff(1 << 30); got != time.Second {
		t.Errorf("fixed, huge attempt: %v", got)
	}
}

func FuzzParsePolicy(f *testing.F) {
	f.Add(DefaultPolicy().JSON())
	f.Add([]byte(`{"retry": {"limit": 3}, "format": "json", "schema": {"type": "object"}}`))
	f.Add([]byte(`{"fanout": ["a", "b"], "maxReady": 10}`))
	f.Add([]byte(`{"schema": {"$ref": "#/definitions/x"}, "format": "envelope"}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		p, err := ParsePolicy(doc)
		if err != nil {
			var ie *InputError
			if !errors.As(err, &ie) {
				t.Fatalf("error is not an InputError: %v", err)
			}
			return
		}
		// What is accepted renders to a document that is accepted again.
		p2, err := ParsePolicy(p.JSON())
		if err != nil {
			t.Fatalf("accepted policy does not round-trip: %v\n%s", err, p.JSON())
		}
		if string(p2.JSON()) != string(p.JSON()) {
			t.Fatalf("round trip changed the policy")
		}
	})
}

func FuzzParseEnvelope(f *testing.F) {
	f.Add([]byte(`{"messageId": "1", "timestamp": "2026-01-13T10:21:00+09:00", "queue": "q", "type": "t", "version": 1, "attributes": {"priority": 3, "delaySec": 1.5}, "traceId": "x", "deduplicationKey": "k", "payload": {}}`))
	f.Add([]byte(`{"payload": null}`))
	f.Add([]byte(` {"payload": [1,2,3]} `))
	f.Fuzz(func(t *testing.T, body []byte) {
		env, err := ParseEnvelope(body, "q")
		if err != nil {
			return
		}
		facts, err := env.facts()
		if err != nil {
			t.Fatalf("accepted envelope has bad facts: %v", err)
		}
		if facts.Priority < -maxPriority || facts.Priority > maxPriority || facts.Delay < 0 {
			t.Fatalf("facts out of range: %+v", facts)
		}
		// Filling in the id and timestamp keeps it a valid envelope.
		filled := fillEnvelope(body, env, time.Unix(0, 0))
		if _, err := ParseEnvelope(filled, "q"); err != nil {
			t.Fatalf("filled envelope is invalid: %v\n%s", err, filled)
		}
	})
}

func FuzzCheckBody(f *testing.F) {
	f.Add([]byte(`{"temp": 1}`), uint8(0))
	f.Add([]byte(`{"payload": {"temp": 1}}`), uint8(1))
	f.Add([]byte(`[[[[[[[[[[]]]]]]]]]]`), uint8(2))
	schema := json.RawMessage(`{"type": "object", "properties": {"temp": {"type": "number"}, "payload": {"type": "object"}}}`)
	f.Fuzz(func(t *testing.T, body []byte, mode uint8) {
		p := DefaultPolicy()
		p.Format = []string{"raw", "json", "envelope"}[mode%3]
		if mode%2 == 1 && p.Format != "raw" {
			p.Schema = schema
		}
		if err := p.check(); err != nil {
			t.Fatal(err)
		}
		c, err := p.checkBody("q", body, time.Unix(0, 0))
		if err == nil && p.Format != "raw" && checkJSON(c.body) != nil {
			t.Fatalf("accepted body is not JSON: %q", c.body)
		}
	})
}
