package queuecore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Policy is what a queue does with its messages (QUEUE/.policy). The JSON
// form is the contract of docs/contract.md §5; fields left out take their defaults.
type Policy struct {
	VisibilityTimeoutSec int           `json:"visibilityTimeoutSec"`
	MaxLeaseSec          int           `json:"maxLeaseSec"` // cap on a deadline set by touch -d
	Retry                RetryPolicy   `json:"retry"`
	DLQ                  DLQPolicy     `json:"dlq"`
	Archive              ArchivePolicy `json:"archive"`
	MaxMessageBytes      int64         `json:"maxMessageBytes"`
	MaxReady             int64         `json:"maxReady"` // 0: no limit
	Format               string        `json:"format"`   // raw, json or envelope
	// Schema is a JSON Schema every committed message must satisfy, or
	// null. It needs format json or envelope.
	Schema         json.RawMessage `json:"schema"`
	DedupWindowSec int             `json:"dedupWindowSec"`
	Fanout         []string        `json:"fanout"`
	Paused         bool            `json:"paused"`

	schema *jsonschema.Schema // compiled Schema
	// broken says why the stored policy could not be loaded: the queue
	// then runs closed (paused, publishes refused with ErrPolicyBroken)
	// until a valid policy is written.
	broken string

	skipCompile bool // see parsePolicy
}

// RetryPolicy says how often and how late a failed message is retried.
type RetryPolicy struct {
	// Limit is the number of retries: a message that fails Limit+1 times
	// is dead-lettered.
	Limit           int     `json:"limit"`
	Backoff         string  `json:"backoff"` // exponential, linear or fixed
	InitialDelaySec float64 `json:"initialDelaySec"`
	MaxDelaySec     float64 `json:"maxDelaySec"`
}

// DLQPolicy: with Enabled false, messages that spend their retries are
// dropped (and logged); dead letters by hand and validation failures still
// go to dlq/, so nothing a producer sent disappears unseen.
type DLQPolicy struct {
	Enabled       bool `json:"enabled"`
	RetentionDays int  `json:"retentionDays"` // 0: keep forever
}

// ArchivePolicy: acked messages are kept in archive/ for RetentionSec
// seconds (0: no time limit), at most MaxMessages of them (0: no limit).
type ArchivePolicy struct {
	Enabled      bool  `json:"enabled"`
	RetentionSec int64 `json:"retentionSec"`
	MaxMessages  int64 `json:"maxMessages"`
}

// Limits on policy values: generous, but bounded so that a typo cannot
// make a queue hold a lease for years or a message of gigabytes.
const (
	maxVisibilitySec   = 7 * 24 * 3600
	maxRetryLimit      = 1000
	maxDelaySec        = 7 * 24 * 3600
	maxMessageBytesCap = 64 << 20
	maxFanout          = 16
	maxPolicyBytes     = 1 << 20
)

// DefaultPolicy is the policy of a new queue.
func DefaultPolicy() Policy {
	return Policy{
		VisibilityTimeoutSec: 30,
		MaxLeaseSec:          12 * 3600,
		Retry:                RetryPolicy{Limit: 5, Backoff: "exponential", InitialDelaySec: 1, MaxDelaySec: 60},
		DLQ:                  DLQPolicy{Enabled: true, RetentionDays: 14},
		Archive:              ArchivePolicy{Enabled: true, RetentionSec: 86400, MaxMessages: 10000},
		MaxMessageBytes:      262144,
		Format:               "raw",
		Schema:               json.RawMessage("null"),
		Fanout:               []string{},
	}
}

// ParsePolicy reads a policy document strictly: unknown fields, wrong types
// and values out of range are errors (*InputError naming the field); fields
// left out take their defaults.
func ParsePolicy(data []byte) (Policy, error) { return parsePolicy(data, true) }

// parsePolicy is ParsePolicy; without compile, a schema is checked against
// its static bounds but not compiled (for a document whose schema was just
// compiled in another form).
func parsePolicy(data []byte, compile bool) (Policy, error) {
	p := DefaultPolicy()
	p.skipCompile = !compile
	if len(data) > maxPolicyBytes {
		return p, &InputError{Field: "policy", Msg: fmt.Sprintf("document is larger than %d bytes", maxPolicyBytes)}
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return p, &InputError{Field: "policy", Msg: "document is empty"}
	}
	// A JSON null decodes into the struct as nothing at all: without this
	// check `echo null > .policy` silently reset the queue to the defaults.
	if trimmed[0] != '{' {
		return p, &InputError{Field: "policy", Msg: "document must be a JSON object"}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	// "lastRefused" is what .policy shows of a refused document
	// (refusals.go): a document read, edited and written back carries it,
	// and it is ignored.
	doc := struct {
		*Policy
		LastRefused json.RawMessage `json:"lastRefused"`
	}{Policy: &p}
	if err := dec.Decode(&doc); err != nil {
		return DefaultPolicy(), &InputError{Field: "policy", Msg: describeJSONError(err)}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return DefaultPolicy(), &InputError{Field: "policy", Msg: "trailing data after the JSON object"}
	}
	if p.Fanout == nil {
		p.Fanout = []string{}
	}
	if len(p.Schema) == 0 {
		p.Schema = json.RawMessage("null")
	}
	if err := p.check(); err != nil {
		return DefaultPolicy(), err
	}
	return p, nil
}

func describeJSONError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		// The document is decoded through a struct that embeds Policy
		// (parsePolicy): its fields are the document's, without the prefix.
		te.Field = strings.TrimPrefix(te.Field, "Policy.")
		// A number that does not fit the field's type (on a 32-bit
		// machine, an int field past 2^31-1): say so, not "must be a
		// number, not a number".
		if kind := jsonKind(te.Type.Kind().String()); kind == "number" && strings.HasPrefix(te.Value, "number") {
			return fmt.Sprintf("field %q: %s is out of range", te.Field, te.Value)
		}
		return fmt.Sprintf("field %q must be a %s, not a JSON %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "json: unknown field ") {
		return "unknown field " + strings.TrimPrefix(msg, "json: unknown field ")
	}
	return strings.TrimPrefix(msg, "json: ")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int64", "float64":
		return "number"
	case "bool":
		return "boolean"
	case "slice":
		return "list"
	case "struct":
		return "object"
	}
	return goKind
}

func (p *Policy) check() error {
	bad := func(field, msg string) error { return &InputError{Field: "policy field " + field, Msg: msg} }
	switch {
	case p.VisibilityTimeoutSec < 1 || p.VisibilityTimeoutSec > maxVisibilitySec:
		return bad("visibilityTimeoutSec", fmt.Sprintf("must be 1 to %d seconds", maxVisibilitySec))
	case p.MaxLeaseSec < p.VisibilityTimeoutSec || p.MaxLeaseSec > maxVisibilitySec:
		return bad("maxLeaseSec", fmt.Sprintf("must be visibilityTimeoutSec (%d) to %d seconds", p.VisibilityTimeoutSec, maxVisibilitySec))
	case p.Retry.Limit < 0 || p.Retry.Limit > maxRetryLimit:
		return bad("retry.limit", fmt.Sprintf("must be 0 to %d", maxRetryLimit))
	case p.Retry.Backoff != "exponential" && p.Retry.Backoff != "linear" && p.Retry.Backoff != "fixed":
		return bad("retry.backoff", "must be exponential, linear or fixed, not "+quote(p.Retry.Backoff))
	case p.Retry.InitialDelaySec < 0 || p.Retry.InitialDelaySec > maxDelaySec:
		return bad("retry.initialDelaySec", fmt.Sprintf("must be 0 to %d seconds", maxDelaySec))
	case p.Retry.MaxDelaySec < p.Retry.InitialDelaySec || p.Retry.MaxDelaySec > maxDelaySec:
		return bad("retry.maxDelaySec", fmt.Sprintf("must be initialDelaySec (%g) to %d seconds", p.Retry.InitialDelaySec, maxDelaySec))
	case p.DLQ.RetentionDays < 0 || p.DLQ.RetentionDays > 3650:
		return bad("dlq.retentionDays", "must be 0 (forever) to 3650 days")
	case p.Archive.RetentionSec < 0 || p.Archive.RetentionSec > 3650*86400:
		return bad("archive.retentionSec", "must be 0 (no time limit) to 10 years")
	case p.Archive.MaxMessages < 0:
		return bad("archive.maxMessages", "must be 0 (no limit) or more")
	case p.MaxMessageBytes < 1 || p.MaxMessageBytes > maxMessageBytesCap:
		return bad("maxMessageBytes", fmt.Sprintf("must be 1 to %d bytes", maxMessageBytesCap))
	case p.MaxReady < 0:
		return bad("maxReady", "must be 0 (no limit) or more")
	case p.Format != "raw" && p.Format != "json" && p.Format != "envelope":
		return bad("format", "must be raw, json or envelope, not "+quote(p.Format))
	case p.DedupWindowSec < 0 || p.DedupWindowSec > maxDelaySec:
		return bad("dedupWindowSec", fmt.Sprintf("must be 0 (off) to %d seconds", maxDelaySec))
	case len(p.Fanout) > maxFanout:
		return bad("fanout", fmt.Sprintf("may name at most %d queues", maxFanout))
	}
	seen := map[string]bool{}
	for _, q := range p.Fanout {
		if err := CheckQueueName(q); err != nil {
			return bad("fanout", err.Error())
		}
		if seen[q] {
			return bad("fanout", "names "+quote(q)+" twice")
		}
		seen[q] = true
	}
	if s := bytes.TrimSpace(p.Schema); !bytes.Equal(s, []byte("null")) {
		if p.Format == "raw" {
			return bad("schema", "needs format json or envelope")
		}
		compiled, err := compileSchemaBounded(s, !p.skipCompile)
		if err != nil {
			return bad("schema", err.Error())
		}
		p.schema = compiled
	}
	return nil
}

// compileSchema compiles a schema document read by jsonschema.UnmarshalJSON
// (see compileSchemaBounded for its bounds).
func compileSchema(v any) (*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	// Never fetch a $ref from the network or the disk: a policy is
	// untrusted input.
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, v); err != nil {
		return nil, err
	}
	return c.Compile(schemaURL)
}

// schemaURL is where a policy's schema lives for the compiler. A fixed,
// absolute name: a relative one is resolved against the daemon's working
// directory, which then showed in error texts (dlq reasons, xattrs) that
// other users read.
const schemaURL = "urn:yirangmq:schema"

type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema may not refer to %s: only references inside the schema are allowed", url)
}

// StoredJSON is the form a store keeps: compact, without HTML escapes, so
// that it is never longer than needed. SetPolicy checks that it reads back
// (ParsePolicy, the same limits as at load) before it is stored.
func (p Policy) StoredJSON() []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(p)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// brokenPolicy is what a queue runs on when its stored policy cannot be
// loaded: closed. Leasing is paused and publishes are refused, so that no
// message is accepted or handled without the schema, format or fanout the
// owner set.
func brokenPolicy(err error) Policy {
	p := DefaultPolicy()
	p.Paused = true
	p.broken = err.Error()
	return p
}

// Broken returns why the queue's stored policy could not be loaded, or "".
func (p *Policy) Broken() string { return p.broken }

// JSON renders the policy with every field, as .policy shows it.
func (p Policy) JSON() []byte {
	b, _ := json.MarshalIndent(p, "", "  ")
	return append(b, '\n')
}

// VisibilityTimeout is the lease length.
func (p *Policy) VisibilityTimeout() time.Duration {
	return time.Duration(p.VisibilityTimeoutSec) * time.Second
}

// Backoff is the wait before retry number attempts (1 for the first retry).
func (p *Policy) Backoff(attempts int) time.Duration {
	d := p.Retry.InitialDelaySec
	switch p.Retry.Backoff {
	case "exponential":
		for i := 1; i < attempts && d < p.Retry.MaxDelaySec; i++ {
			d *= 2
		}
	case "linear":
		d *= float64(attempts)
	}
	if d > p.Retry.MaxDelaySec {
		d = p.Retry.MaxDelaySec
	}
	return time.Duration(d * float64(time.Second))
}
