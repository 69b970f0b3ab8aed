package format1

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// The journal and the snapshot hold metadata as JSON objects, one per line,
// so that they can be read by hand. Times are Unix nanoseconds (key suffix
// _ns) and are left out when zero; other zero values are left out too. A
// string that is not valid UTF-8 (a message name may be any bytes) is
// written in base64 under its key with the suffix "~b64", since JSON would
// replace the bad bytes.
//
// The encoder and decoder are written by hand: the snapshot of a large
// store holds a million of these lines and encoding/json is several times
// slower on them.

const b64Suffix = "~b64"

// appendMessageJSON appends m as one JSON object.
func appendMessageJSON(b []byte, m *queuecore.Message) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, m.ID, 10)
	b = appendTextField(b, "queue", m.Queue, true)
	b = appendTextField(b, "name", m.Name, true)
	b = appendUintField(b, "state", uint64(m.State), true)
	b = appendUintField(b, "seq", m.Seq, true)
	b = appendIntField(b, "size", m.Size, true)
	b = appendIntField(b, "priority", int64(m.Priority), false)
	b = appendTextField(b, "message_id", m.MessageID, false)
	b = appendTimeField(b, "published_ns", m.PublishedAt)
	b = appendTimeField(b, "first_ns", m.FirstAt)
	b = appendTimeField(b, "state_ns", m.StateAt)
	b = appendTimeField(b, "deadline_ns", m.Deadline)
	b = appendIntField(b, "attempts", int64(m.Attempts), false)
	b = appendIntField(b, "redrives", int64(m.Redrives), false)
	b = appendTextField(b, "reason", m.Reason, false)
	b = appendTextField(b, "reason_message", m.ReasonMessage, false)
	b = appendTimeField(b, "failed_ns", m.FailedAt)
	b = appendTextField(b, "consumer", m.Consumer, false)
	b = appendTextField(b, "dedup_key", m.DedupKey, false)
	b = appendUintField(b, "uid", uint64(m.UID), false)
	b = appendUintField(b, "gid", uint64(m.GID), false)
	return append(b, '}')
}

// decodeMessageJSON reads one object written by appendMessageJSON.
func decodeMessageJSON(r *jsonReader) (queuecore.Message, error) {
	var m queuecore.Message
	err := r.object(func(key []byte) error {
		key, b64 := bytes.CutSuffix(key, []byte(b64Suffix))
		var err error
		switch string(key) {
		case "id":
			m.ID, err = r.uint(math.MaxUint64)
		case "queue":
			m.Queue, err = r.text(b64)
		case "name":
			m.Name, err = r.text(b64)
		case "state":
			var st uint64
			st, err = r.uint(math.MaxUint8)
			m.State = queuecore.State(st)
		case "seq":
			m.Seq, err = r.uint(math.MaxUint64)
		case "size":
			m.Size, err = r.int()
		case "priority":
			var n int64
			n, err = r.int()
			m.Priority = int(n)
		case "message_id":
			m.MessageID, err = r.text(b64)
		case "published_ns":
			m.PublishedAt, err = r.time()
		case "first_ns":
			m.FirstAt, err = r.time()
		case "state_ns":
			m.StateAt, err = r.time()
		case "deadline_ns":
			m.Deadline, err = r.time()
		case "attempts":
			var n int64
			n, err = r.int()
			m.Attempts = int(n)
		case "redrives":
			var n int64
			n, err = r.int()
			m.Redrives = int(n)
		case "reason":
			m.Reason, err = r.text(b64)
		case "reason_message":
			m.ReasonMessage, err = r.text(b64)
		case "failed_ns":
			m.FailedAt, err = r.time()
		case "consumer":
			m.Consumer, err = r.text(b64)
		case "dedup_key":
			m.DedupKey, err = r.text(b64)
		case "uid":
			var n uint64
			n, err = r.uint(math.MaxUint32)
			m.UID = uint32(n)
		case "gid":
			var n uint64
			n, err = r.uint(math.MaxUint32)
			m.GID = uint32(n)
		default:
			err = r.skip() // a field of a later version
		}
		return err
	})
	return m, err
}

// appendQueueJSON appends q as one JSON object. The policy is kept as a
// string: the store keeps what it is given, valid JSON or not. Queue names
// are checked ASCII, so the name needs no base64 form.
func appendQueueJSON(b []byte, q *queuecore.QueueInfo) []byte {
	b = append(b, `{"name":`...)
	b = appendQuoted(b, q.Name)
	b = appendTextField(b, "policy", string(q.Policy), false)
	b = appendUintField(b, "uid", uint64(q.UID), false)
	b = appendUintField(b, "gid", uint64(q.GID), false)
	b = appendUintField(b, "mode", uint64(q.Mode), false)
	b = appendTimeField(b, "created_ns", q.CreatedAt)
	return append(b, '}')
}

// decodeQueueJSON reads one object written by appendQueueJSON.
func decodeQueueJSON(r *jsonReader) (queuecore.QueueInfo, error) {
	var q queuecore.QueueInfo
	err := r.object(func(key []byte) error {
		key, b64 := bytes.CutSuffix(key, []byte(b64Suffix))
		var err error
		var n uint64
		switch string(key) {
		case "name":
			q.Name, err = r.text(b64)
		case "policy":
			var s string
			s, err = r.text(b64)
			if s != "" {
				q.Policy = []byte(s)
			}
		case "uid":
			n, err = r.uint(math.MaxUint32)
			q.UID = uint32(n)
		case "gid":
			n, err = r.uint(math.MaxUint32)
			q.GID = uint32(n)
		case "mode":
			n, err = r.uint(math.MaxUint32)
			q.Mode = uint32(n)
		case "created_ns":
			q.CreatedAt, err = r.time()
		default:
			err = r.skip()
		}
		return err
	})
	return q, err
}

// The field appenders write ,"key":value; with always false they leave out
// a zero value.

func appendKey(b []byte, key string) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	return append(b, '"', ':')
}

func appendUintField(b []byte, key string, v uint64, always bool) []byte {
	if v == 0 && !always {
		return b
	}
	return strconv.AppendUint(appendKey(b, key), v, 10)
}

func appendIntField(b []byte, key string, v int64, always bool) []byte {
	if v == 0 && !always {
		return b
	}
	return strconv.AppendInt(appendKey(b, key), v, 10)
}

func appendTimeField(b []byte, key string, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	return strconv.AppendInt(appendKey(b, key), backends.Nanos(t), 10)
}

func appendTextField(b []byte, key, s string, always bool) []byte {
	if s == "" && !always {
		return b
	}
	if utf8.ValidString(s) {
		return appendQuoted(appendKey(b, key), s)
	}
	b = appendKey(b, key+b64Suffix)
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, []byte(s))
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendQuoted appends s, valid UTF-8, as a JSON string.
func appendQuoted(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

var errJSON = errors.New("malformed JSON")

// jsonReader reads the JSON this package writes: objects, arrays, strings
// and integers (and skips any other value).
type jsonReader struct {
	b []byte
	i int
}

func (r *jsonReader) fail(what string) error {
	return fmt.Errorf("%w: %s at byte %d", errJSON, what, r.i)
}

func (r *jsonReader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// peek is the next byte after white space, 0 at the end.
func (r *jsonReader) peek() byte {
	r.space()
	if r.i < len(r.b) {
		return r.b[r.i]
	}
	return 0
}

func (r *jsonReader) consume(c byte) error {
	if r.peek() != c {
		return r.fail(fmt.Sprintf("want %q", c))
	}
	r.i++
	return nil
}

// object calls field for each key, with the reader at its value, which
// field must read or skip.
func (r *jsonReader) object(field func(key []byte) error) error {
	if err := r.consume('{'); err != nil {
		return err
	}
	if r.peek() == '}' {
		r.i++
		return nil
	}
	for {
		key, _, err := r.rawString()
		if err != nil {
			return err
		}
		if err := r.consume(':'); err != nil {
			return err
		}
		r.space()
		if err := field(key); err != nil {
			return err
		}
		if r.peek() == ',' {
			r.i++
			continue
		}
		return r.consume('}')
	}
}

// array calls elem for each element.
func (r *jsonReader) array(elem func() error) error {
	if err := r.consume('['); err != nil {
		return err
	}
	if r.peek() == ']' {
		r.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		if r.peek() == ',' {
			r.i++
			continue
		}
		return r.consume(']')
	}
}

// rawString reads a string and returns its bytes between the quotes.
func (r *jsonReader) rawString() (raw []byte, escaped bool, err error) {
	if err := r.consume('"'); err != nil {
		return nil, false, err
	}
	start := r.i
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case '"':
			raw = r.b[start:r.i]
			r.i++
			return raw, escaped, nil
		case '\\':
			escaped = true
			r.i += 2
		default:
			r.i++
		}
	}
	return nil, false, r.fail("unterminated string")
}

// text reads a string, or the base64 of one if b64.
func (r *jsonReader) text(b64 bool) (string, error) {
	r.space()
	start := r.i
	raw, escaped, err := r.rawString()
	if err != nil {
		return "", err
	}
	if b64 {
		d, err := base64.StdEncoding.DecodeString(string(raw))
		if err != nil {
			return "", fmt.Errorf("%w: bad base64: %v", errJSON, err)
		}
		return string(d), nil
	}
	if !escaped {
		return string(raw), nil
	}
	var s string
	if err := json.Unmarshal(r.b[start:r.i], &s); err != nil {
		return "", fmt.Errorf("%w: %v", errJSON, err)
	}
	return s, nil
}

// uint reads a non-negative integer no larger than limit.
func (r *jsonReader) uint(limit uint64) (uint64, error) {
	r.space()
	start := r.i
	var n uint64
	for r.i < len(r.b) && '0' <= r.b[r.i] && r.b[r.i] <= '9' {
		d := uint64(r.b[r.i] - '0')
		if n > (limit-d)/10 {
			return 0, r.fail("number out of range")
		}
		n = n*10 + d
		r.i++
	}
	if r.i == start {
		return 0, r.fail("want a number")
	}
	return n, nil
}

// int reads an int64.
func (r *jsonReader) int() (int64, error) {
	if r.peek() == '-' {
		r.i++
		n, err := r.uint(1 << 63)
		return -int64(n), err // -(1<<63) wraps to itself: MinInt64
	}
	n, err := r.uint(math.MaxInt64)
	return int64(n), err
}

// time reads a time as format 1 did: 0 is the Unix epoch, not the zero
// time (backends.FromNanos), since format 1 writes no field for a zero time.
func (r *jsonReader) time() (time.Time, error) {
	n, err := r.int()
	return time.Unix(0, n), err
}

// skip reads over any value.
func (r *jsonReader) skip() error {
	switch r.peek() {
	case '"':
		_, _, err := r.rawString()
		return err
	case '{':
		return r.object(func([]byte) error { return r.skip() })
	case '[':
		return r.array(r.skip)
	}
	start := r.i
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			if r.i == start {
				return r.fail("want a value")
			}
			return nil
		}
		r.i++
	}
	if r.i == start {
		return r.fail("want a value")
	}
	return nil
}
