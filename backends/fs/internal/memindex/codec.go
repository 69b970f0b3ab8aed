package memindex

import (
	"encoding/binary"
	"errors"
	"time"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// The packed form of an entry's data, after the name:
//
//	varint   Priority
//	string   MessageID           (uvarint length, bytes)
//	byte     mask of the times that are not zero: bit 0 PublishedAt, 1 FirstAt,
//	         2 StateAt, 3 Deadline, 4 FailedAt
//	varint   each time present, in Unix nanoseconds (backends.Nanos); all but
//	         PublishedAt as the difference from PublishedAt (or from 0
//	         without it), which is small
//	varint   Attempts, Redrives
//	string   Reason, ReasonMessage, Consumer, DedupKey
//	uvarint  UID, GID
//
// Strings are substrings of data when unpacked, so a decoded Message costs
// no allocation beyond its own.

// ErrCorruptEntry is packed data that does not decode.
var ErrCorruptEntry = errors.New("corrupt packed message")

// NewEntry packs m, which must have passed CheckPlace, as an entry of q.
func NewEntry[X any](m *queuecore.Message, q *Queue[X]) *Entry[X] {
	var buf [256]byte
	b := append(buf[:0], m.Name...)
	b = binary.AppendVarint(b, int64(m.Priority))
	b = appendPackedString(b, m.MessageID)
	times := [...]time.Time{m.PublishedAt, m.FirstAt, m.StateAt, m.Deadline, m.FailedAt}
	var mask byte
	for i, t := range times {
		if !t.IsZero() {
			mask |= 1 << i
		}
	}
	b = append(b, mask)
	var base int64
	for i, t := range times {
		if mask&(1<<i) == 0 {
			continue
		}
		n := backends.Nanos(t)
		b = binary.AppendVarint(b, n-base) // wraps for far-apart times; unpack wraps back
		if i == 0 {
			base = n
		}
	}
	b = binary.AppendVarint(b, int64(m.Attempts))
	b = binary.AppendVarint(b, int64(m.Redrives))
	b = appendPackedString(b, m.Reason)
	b = appendPackedString(b, m.ReasonMessage)
	b = appendPackedString(b, m.Consumer)
	b = appendPackedString(b, m.DedupKey)
	b = binary.AppendUvarint(b, uint64(m.UID))
	b = binary.AppendUvarint(b, uint64(m.GID))
	return &Entry[X]{
		ID:    m.ID,
		Seq:   m.Seq,
		Key:   m.SortKey(),
		Size:  m.Size,
		Q:     q,
		Data:  string(b),
		NLen:  uint8(len(m.Name)),
		State: m.State,
	}
}

func appendPackedString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Message unpacks e.
func (e *Entry[X]) Message() queuecore.Message {
	m := queuecore.Message{
		ID:    e.ID,
		Queue: e.Q.Name,
		Name:  e.Name(),
		State: e.State,
		Seq:   e.Seq,
		Size:  e.Size,
	}
	r := Reader{s: e.Data[e.NLen:]}
	m.Priority = int(r.Varint())
	m.MessageID = r.Str()
	mask := r.Byte()
	var base int64
	for i, p := range [...]*time.Time{&m.PublishedAt, &m.FirstAt, &m.StateAt, &m.Deadline, &m.FailedAt} {
		if mask&(1<<i) == 0 {
			continue
		}
		n := r.Varint() + base
		if i == 0 {
			base = n
		}
		*p = backends.FromNanos(n)
	}
	m.Attempts = int(r.Varint())
	m.Redrives = int(r.Varint())
	m.Reason = r.Str()
	m.ReasonMessage = r.Str()
	m.Consumer = r.Str()
	m.DedupKey = r.Str()
	m.UID = uint32(r.Uvarint())
	m.GID = uint32(r.Uvarint())
	if r.err != nil {
		// Only a bug can get here: Data is built by NewEntry in this
		// process (or read back from format 1's spill, which checks it).
		panic(ErrCorruptEntry)
	}
	return m
}

// Deadline is e's Message().Deadline: of a leased or delayed message, when
// it is due.
func (e *Entry[X]) Deadline() time.Time { return e.Message().Deadline }

// Reader reads packed data: varints, bytes and strings after their
// length. The first error sticks (Err); what follows it reads as zero.
type Reader struct {
	s   string
	err error
}

// NewReader reads s.
func NewReader(s string) Reader { return Reader{s: s} }

// Err is ErrCorruptEntry once a read ran past the data, else nil.
func (r *Reader) Err() error { return r.err }

// Rest is what is left to read.
func (r *Reader) Rest() string { return r.s }

// Uvarint reads an unsigned varint.
func (r *Reader) Uvarint() uint64 {
	var x uint64
	var shift uint
	for i := 0; i < len(r.s); i++ {
		c := r.s[i]
		if c < 0x80 {
			if i > 9 || i == 9 && c > 1 {
				break
			}
			r.s = r.s[i+1:]
			return x | uint64(c)<<shift
		}
		x |= uint64(c&0x7f) << shift
		shift += 7
	}
	r.err = ErrCorruptEntry
	r.s = ""
	return 0
}

// Varint reads a signed (zig-zag) varint.
func (r *Reader) Varint() int64 {
	ux := r.Uvarint()
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

// Byte reads one byte.
func (r *Reader) Byte() byte {
	if r.s == "" {
		r.err = ErrCorruptEntry
		return 0
	}
	c := r.s[0]
	r.s = r.s[1:]
	return c
}

// Str reads a string after its uvarint length.
func (r *Reader) Str() string {
	n := r.Uvarint()
	if n > uint64(len(r.s)) {
		r.err = ErrCorruptEntry
		r.s = ""
		return ""
	}
	s := r.s[:n]
	r.s = r.s[n:]
	return s
}
