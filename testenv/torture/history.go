package torture

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// Kind is what a client did.
type Kind string

// The kinds of events in a history.
const (
	KindPublish     Kind = "publish"      // create+write+close inbox/NAME (or a draft renamed)
	KindLease       Kind = "lease"        // read of .next
	KindLeaseRename Kind = "lease-rename" // mv inbox/NAME processing/
	KindRead        Kind = "read"         // read of processing/NAME while holding the lease
	KindAck         Kind = "ack"          // rm processing/NAME
	KindNack        Kind = "nack"         // mv processing/NAME inbox/
	KindAbandon     Kind = "abandon"      // the consumer walked away: the lease will expire
	KindKill        Kind = "kill"         // SIGKILL of the daemon, dead mount detached
	KindRestart     Kind = "restart"      // the daemon mounted again and said ready
)

// Outcome is what a call's result says about its effect.
type Outcome string

// The outcomes of a call.
const (
	// OK: the call returned 0; it took effect.
	OK Outcome = "ok"
	// Failed: a live daemon refused the call (or it never reached one
	// that could act on it): it took no effect.
	Failed Outcome = "failed"
	// Unknown: the mount died around the call, or the call failed in a
	// way that does not say; it may or may not have taken effect.
	Unknown Outcome = "unknown"
)

// Event is one client call (or one kill or restart of the daemon).
type Event struct {
	ID     int    `json:"id"`
	Kind   Kind   `json:"kind"`
	Client string `json:"client"`          // p3, c1, runner
	Name   string `json:"name,omitempty"`  // the message
	Via    string `json:"via,omitempty"`   // publish: create or draft
	Lease  int    `json:"lease,omitempty"` // read, ack, nack, abandon: ID of the lease event
	// Sum is the SHA-256 of the body a publish wrote or a read returned.
	Sum string `json:"sum,omitempty"`
	// BodyErr says what is wrong with the bytes a read returned ("" when
	// they verify against their embedded checksum and name).
	BodyErr string        `json:"body_err,omitempty"`
	Start   time.Duration `json:"start"` // since the history began
	End     time.Duration `json:"end"`
	Outcome Outcome       `json:"outcome"`
	Err     string        `json:"err,omitempty"` // the failing call and its errno
}

func (e Event) String() string {
	s := fmt.Sprintf("#%d %s %s", e.ID, e.Client, e.Kind)
	if e.Name != "" {
		s += " " + e.Name
	}
	if e.Lease != 0 {
		s += fmt.Sprintf(" (lease #%d)", e.Lease)
	}
	s += fmt.Sprintf(" [%v..%v] %s", e.Start.Round(time.Millisecond), e.End.Round(time.Millisecond), e.Outcome)
	if e.Err != "" {
		s += " " + e.Err
	}
	if e.BodyErr != "" {
		s += " body: " + e.BodyErr
	}
	return s
}

// History is every event of a run, safe for concurrent clients.
type History struct {
	mu     sync.Mutex
	start  time.Time
	events []Event
}

// NewHistory starts an empty history; its clock starts now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the time since the history began (monotonic).
func (h *History) Now() time.Duration { return time.Since(h.start) }

// Add records e, gives it the next ID and returns that ID.
func (h *History) Add(e Event) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	e.ID = len(h.events) + 1
	h.events = append(h.events, e)
	return e.ID
}

// Events returns a copy of the events so far, in the order recorded.
func (h *History) Events() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.events...)
}

// WriteJSONL writes the history as one JSON object a line.
func WriteJSONL(w io.Writer, events []Event) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, e := range events {
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Sum is the checksum recorded for a body.
func Sum(body []byte) string {
	s := sha256.Sum256(body)
	return hex.EncodeToString(s[:])
}

// The body of a torture message carries its own name and checksum, so
// that any bytes read back can be checked on their own — a torn write, a
// body served under another message's name, a short read — even for a
// publish whose outcome the history does not know:
//
//	yirangmq-torture NAME SIZE\n
//	PAYLOAD (SIZE random letters)\n
//	sha256 HEX\n          (of everything above this line)
const bodyMagic = "yirangmq-torture"

// MakeBody builds the body of the message called name with a payload of
// size random letters.
func MakeBody(name string, size int, rnd *rand.Rand) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s %d\n", bodyMagic, name, size)
	for i := 0; i < size; i++ {
		b.WriteByte(byte('a' + rnd.IntN(26)))
	}
	b.WriteByte('\n')
	fmt.Fprintf(&b, "sha256 %s\n", Sum(b.Bytes()))
	return b.Bytes()
}

// VerifyBody checks that body is a whole torture message called name.
func VerifyBody(name string, body []byte) error {
	head, rest, ok := bytes.Cut(body, []byte("\n"))
	if !ok {
		return fmt.Errorf("%d bytes, no header line", len(body))
	}
	var magic, gotName, sizeStr string
	if n, _ := fmt.Sscan(string(head), &magic, &gotName, &sizeStr); n != 3 || magic != bodyMagic {
		return fmt.Errorf("%d bytes, bad header %.60q", len(body), head)
	}
	if gotName != name {
		return fmt.Errorf("body of message %q served under the name %q", gotName, name)
	}
	size, err := strconv.Atoi(sizeStr)
	if err != nil || size < 0 {
		return fmt.Errorf("bad size %q in header", sizeStr)
	}
	if len(rest) < size+1 || rest[size] != '\n' {
		return fmt.Errorf("%d bytes, payload of %d bytes cut short", len(body), size)
	}
	signed := len(head) + 1 + size + 1
	want := fmt.Sprintf("sha256 %s\n", Sum(body[:signed]))
	if got := string(body[signed:]); got != want {
		if len(got) < len(want) {
			return fmt.Errorf("%d bytes, checksum line cut short (%q)", len(body), got)
		}
		return errors.New("checksum does not match the bytes")
	}
	return nil
}
