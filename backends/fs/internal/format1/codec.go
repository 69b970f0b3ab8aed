package format1

import (
	"encoding/binary"
	"errors"
	"math"
	"time"

	"yirangmq/queuecore"
)

// The packed form of an entry's data, after the name:
//
//	varint   Priority
//	string   MessageID           (uvarint length, bytes)
//	byte     mask of the times that are not zero: bit 0 PublishedAt, 1 FirstAt,
//	         2 StateAt, 3 Deadline, 4 FailedAt
//	varint   each time present, in Unix nanoseconds; all but PublishedAt as the
//	         difference from PublishedAt (or from 0 without it), which is small
//	varint   Attempts, Redrives
//	string   Reason, ReasonMessage, Consumer, DedupKey
//	uvarint  UID, GID
//
// Strings are substrings of data when unpacked, so a decoded Message costs
// no allocation beyond its own.

var errCorruptEntry = errors.New("corrupt packed message")

// newEntry packs m, which must have passed checkPlace.
func newEntry(m *queuecore.Message, q *queue) *entry {
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
		n := toNanos(t)
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
	return &entry{
		id:    m.ID,
		seq:   m.Seq,
		key:   m.SortKey(),
		size:  m.Size,
		q:     q,
		data:  string(b),
		nlen:  uint8(len(m.Name)),
		state: m.State,
	}
}

func appendPackedString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// message unpacks e.
func (e *entry) message() queuecore.Message {
	m := queuecore.Message{
		ID:    e.id,
		Queue: e.q.name,
		Name:  e.name(),
		State: e.state,
		Seq:   e.seq,
		Size:  e.size,
	}
	r := packedReader{s: e.data[e.nlen:]}
	m.Priority = int(r.varint())
	m.MessageID = r.str()
	mask := r.byte()
	var base int64
	for i, p := range [...]*time.Time{&m.PublishedAt, &m.FirstAt, &m.StateAt, &m.Deadline, &m.FailedAt} {
		if mask&(1<<i) == 0 {
			continue
		}
		n := r.varint() + base
		if i == 0 {
			base = n
		}
		*p = fromNanos(n)
	}
	m.Attempts = int(r.varint())
	m.Redrives = int(r.varint())
	m.Reason = r.str()
	m.ReasonMessage = r.str()
	m.Consumer = r.str()
	m.DedupKey = r.str()
	m.UID = uint32(r.uvarint())
	m.GID = uint32(r.uvarint())
	if r.err != nil {
		// Only a bug can get here: data is built by newEntry in this process.
		panic(errCorruptEntry)
	}
	return m
}

type packedReader struct {
	s   string
	err error
}

func (r *packedReader) uvarint() uint64 {
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
	r.err = errCorruptEntry
	r.s = ""
	return 0
}

func (r *packedReader) varint() int64 {
	ux := r.uvarint()
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

func (r *packedReader) byte() byte {
	if r.s == "" {
		r.err = errCorruptEntry
		return 0
	}
	c := r.s[0]
	r.s = r.s[1:]
	return c
}

func (r *packedReader) str() string {
	n := r.uvarint()
	if n > uint64(len(r.s)) {
		r.err = errCorruptEntry
		r.s = ""
		return ""
	}
	s := r.s[:n]
	r.s = r.s[n:]
	return s
}

// toNanos is t in Unix nanoseconds, clamped to what an int64 holds (the
// years 1678 to 2262) so that it is defined for every t.
func toNanos(t time.Time) int64 {
	const maxSec = math.MaxInt64/1_000_000_000 - 1
	switch s := t.Unix(); {
	case s > maxSec:
		return math.MaxInt64
	case s < -maxSec:
		return math.MinInt64
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time { return time.Unix(0, n) }
