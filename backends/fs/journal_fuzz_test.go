package fs

import (
	"testing"

	"yirangmq/queuecore"
)

// FuzzDecodeRecord: a journal record's payload, whatever its bytes, is
// decoded or refused with an error, never a panic; a decoded record's
// bodies lie inside the payload, and a staged body is an insert's.
func FuzzDecodeRecord(f *testing.F) {
	m := tmsg(7, "q", "m", ready)
	for _, staged := range [][]*stagedBody{nil, {{n: 300000, crc: 0xdeadbeef}, nil}} {
		frame, _ := encodeApplyRecord(3, []queuecore.Op{tins(m), tdel(5)}, staged)
		f.Add(frame[frameHeaderLen:])
	}
	f.Add([]byte(`{"lsn":1,"ops":[{"op":"insert","file":5,"msg":{}}]}` + "\n"))
	f.Add([]byte(`{"lsn":1,"ops":[{"op":"delete","id":2,"file":5,"crc":1}]}` + "\n"))
	f.Add([]byte(`{"lsn":1,"ops":[{"op":"insert","body":3,"file":5,"crc":1,"msg":{}}]}` + "\nabc"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		rec, err := decodeRecord(payload)
		if err != nil {
			return
		}
		if rec.staged != nil && len(rec.staged) != len(rec.ops) {
			t.Fatalf("%d staged entries for %d ops", len(rec.staged), len(rec.ops))
		}
		for i, op := range rec.ops {
			staged := rec.staged != nil && rec.staged[i] != nil
			if staged && (op.Kind != queuecore.OpInsert || op.Body != nil) {
				t.Fatalf("op %d: a staged body on a %v op with %d body bytes", i, op.Kind, len(op.Body))
			}
			if op.Kind == queuecore.OpInsert && !staged && rec.bodyAt[i]+len(op.Body) > len(payload) {
				t.Fatalf("op %d: body past the payload", i)
			}
		}
	})
}
