package queuecore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Envelope is the JSON envelope of docs/contract.md §5: the fields a producer may
// send. Anything else in the object is rejected, so a typo is caught at
// close(2) instead of in a consumer.
type Envelope struct {
	MessageID        string          `json:"messageId,omitempty"`
	Timestamp        string          `json:"timestamp,omitempty"`
	Queue            string          `json:"queue,omitempty"`
	Type             string          `json:"type,omitempty"`
	Version          json.Number     `json:"version,omitempty"`
	Attributes       map[string]any  `json:"attributes,omitempty"`
	TraceID          string          `json:"traceId,omitempty"`
	DeduplicationKey string          `json:"deduplicationKey,omitempty"`
	Payload          json.RawMessage `json:"payload"`
}

// envelopeFacts is what the core takes from an envelope.
type envelopeFacts struct {
	MessageID string
	Priority  int
	Delay     time.Duration
	DedupKey  string
}

const (
	maxPriority = 1000
	maxIDLength = 256
)

// ParseEnvelope checks an envelope for queue and returns it. Errors are
// plain sentences, meant for the producer's log.
func ParseEnvelope(body []byte, queue string) (*Envelope, error) {
	if err := checkJSON(body); err != nil {
		return nil, err
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, errors.New("envelope must be a JSON object")
	}
	var env Envelope
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&env); err != nil {
		return nil, fmt.Errorf("envelope: %s", describeJSONError(err))
	}
	if env.Payload == nil {
		return nil, errors.New("envelope has no payload")
	}
	if len(env.MessageID) > maxIDLength || len(env.DeduplicationKey) > maxIDLength || len(env.TraceID) > maxIDLength {
		return nil, fmt.Errorf("envelope ids may be at most %d bytes", maxIDLength)
	}
	if env.Timestamp != "" {
		if _, err := time.Parse(time.RFC3339Nano, env.Timestamp); err != nil {
			return nil, fmt.Errorf("envelope timestamp %q is not an RFC 3339 time", env.Timestamp)
		}
	}
	if env.Queue != "" && env.Queue != queue {
		return nil, fmt.Errorf("envelope is for queue %q, not %q", env.Queue, queue)
	}
	if env.Version != "" {
		if _, err := env.Version.Int64(); err != nil {
			return nil, fmt.Errorf("envelope version %s is not an integer", env.Version)
		}
	}
	if _, err := env.facts(); err != nil {
		return nil, err
	}
	return &env, nil
}

func (env *Envelope) facts() (envelopeFacts, error) {
	f := envelopeFacts{MessageID: env.MessageID, DedupKey: env.DeduplicationKey}
	if v, ok := env.Attributes["priority"]; ok {
		n, ok := v.(json.Number)
		i, err := n.Int64()
		if !ok || err != nil || i < -maxPriority || i > maxPriority {
			return f, fmt.Errorf("envelope attributes.priority must be an integer from %d to %d", -maxPriority, maxPriority)
		}
		f.Priority = int(i)
	}
	if v, ok := env.Attributes["delaySec"]; ok {
		n, ok := v.(json.Number)
		s, err := n.Float64()
		if !ok || err != nil || s < 0 || s > maxDelaySec || math.IsNaN(s) {
			return f, fmt.Errorf("envelope attributes.delaySec must be a number from 0 to %d", maxDelaySec)
		}
		f.Delay = time.Duration(s * float64(time.Second))
	}
	return f, nil
}

// checkJSON accepts exactly one JSON value.
func checkJSON(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("message is empty, not JSON")
		}
		return fmt.Errorf("message is not JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("message holds more than one JSON value")
	}
	return nil
}

// checked is a message body that passed its queue's format.
type checked struct {
	body  []byte // possibly with messageId and timestamp filled in
	facts envelopeFacts
}

// checkBody applies the queue's format and schema to a body. On failure it
// returns the reason as a sentence.
func (p *Policy) checkBody(queue string, body []byte, now time.Time) (checked, error) {
	c := checked{body: body}
	switch p.Format {
	case "json":
		if err := checkJSON(body); err != nil {
			return c, err
		}
	case "envelope":
		env, err := ParseEnvelope(body, queue)
		if err != nil {
			return c, err
		}
		c.facts, _ = env.facts()
		c.body = fillEnvelope(body, env, now)
		c.facts.MessageID = env.MessageID
	}
	if p.schema != nil {
		v, err := decodeForSchema(c.body)
		if err != nil {
			return c, err
		}
		if err := validateBounded(p.schema, v); err == errSchemaTimeout {
			return c, err
		} else if err != nil {
			return c, fmt.Errorf("schema: %s", oneLine(err.Error()))
		}
	}
	return c, nil
}

func decodeForSchema(body []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("message is not JSON: %w", err)
	}
	return v, nil
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// fillEnvelope puts messageId and timestamp in front of the producer's
// fields when they are absent, keeping the producer's bytes as they are.
func fillEnvelope(body []byte, env *Envelope, now time.Time) []byte {
	var head []byte
	if env.MessageID == "" {
		env.MessageID = uuid.NewString()
		head = fmt.Appendf(head, `"messageId":%q,`, env.MessageID)
	}
	if env.Timestamp == "" {
		env.Timestamp = now.Format(time.RFC3339Nano)
		head = fmt.Appendf(head, `"timestamp":%q,`, env.Timestamp)
	}
	if head == nil {
		return body
	}
	i := bytes.IndexByte(body, '{') // ParseEnvelope made sure the body is an object with a payload
	out := make([]byte, 0, len(body)+len(head))
	out = append(out, body[:i+1]...)
	out = append(out, head...)
	return append(out, body[i+1:]...)
}
