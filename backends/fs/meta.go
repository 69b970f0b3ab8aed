package fs

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"yirangmq/queuecore"
)

// A message's metadata lives in extended attributes of its body file, one
// attribute a field, as plain text: decimal numbers, RFC 3339 times in UTC,
// state directory names and raw strings. `getfattr -d FILE` shows them and
// `setfattr` changes them; rename(2) and link(2) carry them along with the
// file, and `cp -a`, `tar --xattrs` and `rsync -X` copy them.
const (
	xattrPrefix = "user.yirangmq."

	keyID            = "id"
	keyState         = "state" // the state directory the daemon last put the file in
	keyQueue         = "queue" // the queue the daemon last put the file in
	keySeq           = "seq"
	keyPriority      = "priority"
	keyMessageID     = "message_id"
	keyPublishedAt   = "published_at"
	keyFirstAt       = "first_at" // absent: the same as published_at
	keyStateAt       = "state_at" // absent: the same as published_at
	keyDeadline      = "deadline"
	keyAttempts      = "attempts"
	keyRedrives      = "redrives"
	keyReason        = "reason"
	keyReasonMessage = "reason_message"
	keyFailedAt      = "failed_at"
	keyConsumer      = "consumer"
	keyDedupKey      = "dedup_key"
	keyUID           = "uid"
	keyGID           = "gid"
	// keyTxn is set only while the daemon changes a file that more than
	// one syscall changes (a move with new fields, several fields at once):
	// the whole new metadata and where the file goes. Until it is removed
	// it is the truth about the file, whatever the other attributes say;
	// a start that finds it finishes the change (see the package comment).
	keyTxn = "txn"
	// Keys of policy.json, the queue's file.
	keyMode      = "mode"
	keyCreatedAt = "created_at"
)

// fieldKeys are the message keys, in the order fields lists them.
var fieldKeys = []string{
	keyID, keyState, keyQueue, keySeq, keyPriority, keyMessageID, keyPublishedAt,
	keyFirstAt, keyStateAt, keyDeadline, keyAttempts, keyRedrives, keyReason,
	keyReasonMessage, keyFailedAt, keyConsumer, keyDedupKey, keyUID, keyGID,
}

// field is one attribute: its key without the prefix, and its value.
type field struct{ key, val string }

// timeText is t as an attribute value: RFC 3339 with nanoseconds, in UTC;
// the zero time is the empty string.
func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

// fields is m's metadata as attributes. Fields at their default are left
// out: zero numbers, empty strings, a zero deadline and failure time, and
// first and state times equal to the publish time.
func fields(m *queuecore.Message) []field {
	f := make([]field, 0, 12)
	add := func(k, v string) { f = append(f, field{k, v}) }
	num := func(k string, n int64) {
		if n != 0 {
			add(k, strconv.FormatInt(n, 10))
		}
	}
	str := func(k, v string) {
		if v != "" {
			add(k, v)
		}
	}
	add(keyID, strconv.FormatUint(m.ID, 10))
	add(keyState, m.State.Dir())
	add(keyQueue, m.Queue)
	add(keySeq, strconv.FormatUint(m.Seq, 10))
	num(keyPriority, int64(m.Priority))
	str(keyMessageID, m.MessageID)
	str(keyPublishedAt, timeText(m.PublishedAt))
	if !m.FirstAt.Equal(m.PublishedAt) {
		add(keyFirstAt, timeText(m.FirstAt))
	}
	if !m.StateAt.Equal(m.PublishedAt) {
		add(keyStateAt, timeText(m.StateAt))
	}
	str(keyDeadline, timeText(m.Deadline))
	num(keyAttempts, int64(m.Attempts))
	num(keyRedrives, int64(m.Redrives))
	str(keyReason, m.Reason)
	str(keyReasonMessage, m.ReasonMessage)
	str(keyFailedAt, timeText(m.FailedAt))
	str(keyConsumer, m.Consumer)
	str(keyDedupKey, m.DedupKey)
	num(keyUID, int64(m.UID))
	num(keyGID, int64(m.GID))
	return f
}

// fieldDiff is what turns the attributes old into new: values to set and
// keys to remove.
func fieldDiff(old, new []field) (set []field, remove []string) {
	have := make(map[string]string, len(old))
	for _, f := range old {
		have[f.key] = f.val
	}
	for _, f := range new {
		if v, ok := have[f.key]; !ok || v != f.val {
			set = append(set, f)
		}
		delete(have, f.key)
	}
	for _, k := range fieldKeys {
		if _, ok := have[k]; ok {
			remove = append(remove, k)
		}
	}
	return set, remove
}

// found is the metadata read from a file: the message (ID, Queue, State
// and every field the attributes hold; Name and Size are the file's) and
// what could not be read.
type found struct {
	msg queuecore.Message
	// has says which of ID, State and Queue the attributes gave (a file
	// written by hand has none of them).
	hasID, hasState, hasQueue bool
	problems                  []string // fields that could not be read, each said once in the log
}

// errNoField is a key the attributes do not have.
var errNoField = errors.New("no such field")

// parseFields reads a message's metadata with get, which returns a key's
// value or errNoField. A field that cannot be read is left at its default
// and noted in problems: a person may have written it, and the rest of the
// message is still worth keeping.
func parseFields(get func(key string) (string, error)) found {
	r := fieldReader{get: get}
	m := &r.fd.msg
	r.id()
	r.place()
	m.Seq, _ = r.unum(keySeq, 64)
	m.Priority = int(r.inum(keyPriority, 32))
	m.MessageID, _ = r.val(keyMessageID)
	m.PublishedAt, _ = r.time(keyPublishedAt)
	m.FirstAt, m.StateAt = m.PublishedAt, m.PublishedAt
	if t, ok := r.time(keyFirstAt); ok {
		m.FirstAt = t
	}
	if t, ok := r.time(keyStateAt); ok {
		m.StateAt = t
	}
	m.Deadline, _ = r.time(keyDeadline)
	m.Attempts = int(r.inum(keyAttempts, 32))
	m.Redrives = int(r.inum(keyRedrives, 32))
	m.Reason, _ = r.val(keyReason)
	m.ReasonMessage, _ = r.val(keyReasonMessage)
	m.FailedAt, _ = r.time(keyFailedAt)
	m.Consumer, _ = r.val(keyConsumer)
	m.DedupKey, _ = r.val(keyDedupKey)
	uid, _ := r.unum(keyUID, 32)
	gid, _ := r.unum(keyGID, 32)
	m.UID, m.GID = uint32(uid), uint32(gid)
	return r.fd
}

// fieldReader reads fields for parseFields, noting what it cannot read.
type fieldReader struct {
	get func(key string) (string, error)
	fd  found
}

func (r *fieldReader) bad(k, v string, err error) {
	r.fd.problems = append(r.fd.problems, fmt.Sprintf("%s=%q: %v", k, v, err))
}

func (r *fieldReader) val(k string) (string, bool) {
	v, err := r.get(k)
	if err != nil {
		if !errors.Is(err, errNoField) {
			r.bad(k, "", err)
		}
		return "", false
	}
	return v, true
}

func (r *fieldReader) unum(k string, bits int) (uint64, bool) {
	v, ok := r.val(k)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, bits)
	if err != nil {
		r.bad(k, v, err)
		return 0, false
	}
	return n, true
}

func (r *fieldReader) inum(k string, bits int) int64 {
	v, ok := r.val(k)
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, bits)
	if err != nil {
		r.bad(k, v, err)
		return 0
	}
	return n
}

func (r *fieldReader) time(k string) (time.Time, bool) {
	v, ok := r.val(k)
	if !ok {
		return time.Time{}, false
	}
	t, err := parseTime(v)
	if err != nil {
		r.bad(k, v, err)
		return time.Time{}, false
	}
	return t, true
}

// id reads the ID; 0 is none (IDs start at 1).
func (r *fieldReader) id() {
	r.fd.msg.ID, r.fd.hasID = r.unum(keyID, 64)
	if r.fd.hasID && r.fd.msg.ID == 0 {
		r.bad(keyID, "0", errors.New("IDs start at 1"))
		r.fd.hasID = false
	}
}

// place reads where the daemon last put the file: its state and queue.
func (r *fieldReader) place() {
	if v, ok := r.val(keyState); ok {
		if st, known := queuecore.StateFromDir(v); known {
			r.fd.msg.State, r.fd.hasState = st, true
		} else {
			r.bad(keyState, v, errors.New("not a state directory"))
		}
	}
	if v, ok := r.val(keyQueue); ok {
		if err := queuecore.CheckQueueName(v); err != nil {
			r.bad(keyQueue, v, err)
		} else {
			r.fd.msg.Queue, r.fd.hasQueue = v, true
		}
	}
}

// txn is a change under way on one file: the whole metadata it is to have
// and the paths (relative to DIR/queues) it goes from and to.
type txn struct {
	from, to string
	fields   []field
}

// encodeTxn is the value of keyTxn: one line per item, "key=" and the
// value as a Go string literal, so that any byte of a value survives.
func encodeTxn(t txn) []byte {
	var b strings.Builder
	line := func(k, v string) {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(v))
		b.WriteByte('\n')
	}
	line("from", t.from)
	line("to", t.to)
	for _, f := range t.fields {
		line(f.key, f.val)
	}
	return []byte(b.String())
}

var errBadTxn = errors.New("unreadable txn attribute")

// decodeTxn reads what encodeTxn wrote. Anything else is errBadTxn: a
// txn is only ever written whole, by one setxattr(2).
func decodeTxn(b []byte) (txn, error) {
	var t txn
	seen := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		k, q, ok := strings.Cut(line, "=")
		if !ok || seen[k] {
			return txn{}, errBadTxn
		}
		seen[k] = true
		v, err := strconv.Unquote(q)
		if err != nil {
			return txn{}, errBadTxn
		}
		switch k {
		case "from":
			t.from = v
		case "to":
			t.to = v
		default:
			t.fields = append(t.fields, field{k, v})
		}
	}
	if t.to == "" {
		return txn{}, errBadTxn
	}
	return t, nil
}

// get looks a key up in t's fields, for parseFields.
func (t txn) get(key string) (string, error) {
	for _, f := range t.fields {
		if f.key == key {
			return f.val, nil
		}
	}
	return "", errNoField
}

// splitRel splits a path relative to DIR/queues into queue, state and
// name, checking each; ok is false for anything else.
func splitRel(rel string) (queue string, st queuecore.State, name string, ok bool) {
	q, rest, ok1 := strings.Cut(rel, "/")
	d, name, ok2 := strings.Cut(rest, "/")
	if !ok1 || !ok2 || queuecore.CheckQueueName(q) != nil || queuecore.CheckMessageName(name) != nil {
		return "", 0, "", false
	}
	st, ok = queuecore.StateFromDir(d)
	return q, st, name, ok
}

// relPath is the path of a message file relative to DIR/queues.
func relPath(queue string, st queuecore.State, name string) string {
	return queue + "/" + st.Dir() + "/" + name
}
