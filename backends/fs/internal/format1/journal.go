package format1

import (
	"bufio"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"strconv"

	"yirangmq/queuecore"
)

// A journal record is a frame: "#LLLLLLLL CCCCCCCC\n" (payload length and
// CRC-32C of the payload, 8 lowercase hex digits each), then the payload:
//
//	{"lsn":7,"ops":[{"op":"insert","body":11,"msg":{...}},{"op":"update","msg":{...}},{"op":"delete","id":3}]}\n
//	<the bodies of the inserts, raw, one after the other>
//
// or {"lsn":8,"put_queue":{...}}\n or {"lsn":9,"delete_queue":"jobs"}\n.
const (
	frameHeaderLen = 19
	maxPayload     = 1<<31 - 1
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// journal is one journal file. Positions in the store are logical: base is
// the position of the file's first byte, so that positions keep growing
// across a rotation.
//
// The build that wrote format 1 extended the file with zeros ahead of the
// records, a chunk at a time; replay reads a header of zeros as the end of
// the journal.
type journal struct {
	f    *os.File
	base int64
	size int64 // bytes of records

	// prev, in SyncFull and SyncStrict, is the journal this one replaced
	// while its tail and the store directory (the names journal.old and
	// journal) are not synced yet: the rotation leaves both to the next
	// sync (Store.syncRotationLocked), which clears it. Guarded by
	// Store.syncMu.
	prev *journal
}

func (j *journal) end() int64 { return j.base + j.size }

func appendHex32(b []byte, v uint32) []byte {
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, hexDigits[(v>>uint(shift))&0xf])
	}
	return b
}

// parseFrameHeader reads a header; ok is false for anything else (a torn
// or zeroed tail).
func parseFrameHeader(h []byte) (n int, crc uint32, ok bool) {
	if len(h) != frameHeaderLen || h[0] != '#' || h[9] != ' ' || h[18] != '\n' {
		return 0, 0, false
	}
	l, err1 := strconv.ParseUint(string(h[1:9]), 16, 32)
	c, err2 := strconv.ParseUint(string(h[10:18]), 16, 32)
	if err1 != nil || err2 != nil || l > maxPayload {
		return 0, 0, false
	}
	return int(l), uint32(c), true
}

// record is a decoded journal record: one of ops, putQueue or deleteQueue.
type record struct {
	lsn         uint64
	ops         []queuecore.Op // bodies point into the payload
	bodyAt      []int          // offset of op i's body in the payload
	staged      []*stagedBody  // op i's staged body, if its body is in DIR/staged (nil if none is)
	putQueue    *queuecore.QueueInfo
	deleteQueue string
}

var errBadRecord = errors.New("bad journal record")

// decodeRecord reads one journal record's payload.
//
// It stays whole: frozen format-1 code (see the package comment).
func decodeRecord(payload []byte) (*record, error) {
	nl := 0
	for nl < len(payload) && payload[nl] != '\n' {
		nl++
	}
	if nl == len(payload) {
		return nil, fmt.Errorf("%w: no end of line", errBadRecord)
	}
	rec := &record{}
	var bodyLen []int
	r := &jsonReader{b: payload[:nl]}
	hasLSN := false
	err := r.object(func(key []byte) error {
		var err error
		switch string(key) {
		case "lsn":
			rec.lsn, err = r.uint(1<<63 - 1)
			hasLSN = true
		case "ops":
			err = r.array(func() error {
				var op queuecore.Op
				n := -1
				var sb *stagedBody
				hasCRC := false
				err := r.object(func(key []byte) error {
					var err error
					switch string(key) {
					case "op":
						var kind string
						kind, err = r.text(false)
						switch kind {
						case "insert":
							op.Kind = queuecore.OpInsert
						case "update":
							op.Kind = queuecore.OpUpdate
						case "delete":
							op.Kind = queuecore.OpDelete
						default:
							err = fmt.Errorf("%w: op %q", errBadRecord, kind)
						}
					case "body":
						var v uint64
						v, err = r.uint(maxPayload)
						n = int(v)
					case "file":
						var v uint64
						v, err = r.uint(math.MaxInt) // a body's size is an int here
						if sb == nil {
							sb = &stagedBody{}
						}
						sb.n = int(v)
					case "crc":
						var v uint64
						v, err = r.uint(1<<32 - 1)
						if sb == nil {
							sb = &stagedBody{}
						}
						sb.crc, hasCRC = uint32(v), true
					case "msg":
						op.Msg, err = decodeMessageJSON(r)
					case "id":
						op.Msg.ID, err = r.uint(1<<64 - 1)
					default:
						err = r.skip()
					}
					return err
				})
				if err != nil {
					return err
				}
				if sb != nil {
					// A staged body: the record has its size and CRC, not its bytes.
					if op.Kind != queuecore.OpInsert || n >= 0 || !hasCRC {
						return fmt.Errorf("%w: a staged body outside an insert, or without its crc", errBadRecord)
					}
					if rec.staged == nil {
						rec.staged = make([]*stagedBody, len(rec.ops), len(rec.ops)+1)
					}
				} else if op.Kind == 0 || (op.Kind == queuecore.OpInsert) != (n >= 0) {
					return fmt.Errorf("%w: op without kind or body", errBadRecord)
				}
				if rec.staged != nil {
					rec.staged = append(rec.staged, sb)
				}
				rec.ops = append(rec.ops, op)
				bodyLen = append(bodyLen, n)
				return nil
			})
		case "put_queue":
			var q queuecore.QueueInfo
			q, err = decodeQueueJSON(r)
			rec.putQueue = &q
		case "delete_queue":
			rec.deleteQueue, err = r.text(false)
		default:
			err = r.skip()
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBadRecord, err)
	}
	if !hasLSN {
		return nil, fmt.Errorf("%w: no lsn", errBadRecord)
	}
	off := nl + 1
	rec.bodyAt = make([]int, len(rec.ops))
	for i, n := range bodyLen {
		if n < 0 {
			continue
		}
		if n > len(payload)-off {
			return nil, fmt.Errorf("%w: bodies longer than the record", errBadRecord)
		}
		rec.bodyAt[i] = off
		rec.ops[i].Body = payload[off : off+n : off+n]
		off += n
	}
	if off != len(payload) {
		return nil, fmt.Errorf("%w: %d bytes after the bodies", errBadRecord, len(payload)-off)
	}
	return rec, nil
}

// scanJournal reads the frames of f from the start and calls fn with each
// intact one's payload and the file offset where that payload starts. It
// stops at the end of the file or at the first frame that is cut short or
// fails its CRC (torn), and returns the offset just past the last intact
// frame. An error from fn stops the scan; errStaleRecord from fn stops it
// as if the frame were torn.
func scanJournal(f *os.File, fn func(off int64, payload []byte) error) (good int64, torn bool, err error) {
	st, err := f.Stat()
	if err != nil {
		return 0, false, err
	}
	size := st.Size()
	br := bufio.NewReaderSize(io.NewSectionReader(f, 0, size), 1<<20)
	var hdr [frameHeaderLen]byte
	for {
		n, err := io.ReadFull(br, hdr[:])
		if err == io.EOF || n > 0 && hdr[0] == 0 {
			return good, false, nil // the end, or the zeros ahead of it
		}
		if err == io.ErrUnexpectedEOF {
			return good, true, nil
		}
		if err != nil {
			return good, false, err
		}
		plen, crc, ok := parseFrameHeader(hdr[:])
		if !ok || int64(plen) > size-good-frameHeaderLen {
			return good, true, nil
		}
		payload := make([]byte, plen)
		if _, err := io.ReadFull(br, payload); err != nil {
			return good, true, nil
		}
		if crc32.Checksum(payload, crcTable) != crc {
			return good, true, nil
		}
		if err := fn(good+frameHeaderLen, payload); err != nil {
			if errors.Is(err, errStaleRecord) {
				return good, true, nil
			}
			return good, false, err
		}
		good += frameHeaderLen + int64(plen)
	}
}

// errStaleRecord: a record older than the one before it in the same file,
// left behind a truncation that did not reach the disk.
var errStaleRecord = errors.New("stale journal record")
