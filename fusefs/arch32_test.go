package fusefs

import (
	"maps"
	"math"
	"strconv"
	"testing"
)

// Tests of what differs on a 32-bit machine (armv7); make test-cross runs
// them under qemu-arm too (they need no mount).

// TestInodesFit32Bits: every inode number fits in 32 bits (docs/contract.md:
// a 32-bit program's stat must not fail with EOVERFLOW), message numbers
// stay in their own range whatever the message ID (IDs grow past 2^32 on a
// long-lived store), and the queues' numbers never reach it.
func TestInodesFit32Bits(t *testing.T) {
	for _, id := range []uint64{1, 2, math.MaxInt32, 1 << 31, math.MaxUint32, 1 << 32, 1<<32 + 1, 1 << 40, math.MaxInt64, math.MaxUint64} {
		ino := msgIno(id)
		if ino > math.MaxUint32 || ino < inoMsgBase {
			t.Errorf("msgIno(%d) = %#x: not in [%#x, 2^32)", id, ino, inoMsgBase)
		}
	}
	// Two live messages whose IDs are less than the span apart never share
	// a number, across the 2^32 boundary as well.
	for _, id := range []uint64{1<<32 - 2, 1<<32 + 5, math.MaxUint64 - 3} {
		seen := map[uint64]uint64{}
		for d := uint64(0); d < 1000; d++ {
			ino := msgIno(id + d)
			if prev, dup := seen[ino]; dup {
				t.Fatalf("msgIno(%d) = msgIno(%d) = %#x", id+d, prev, ino)
			}
			seen[ino] = id + d
		}
	}

	// A queue's number is the order it was first seen in; try the edges
	// (the slots wrap after 0xF_0000 queues) and a fresh one.
	f := &FS{queueNo: map[string]uint32{}}
	for _, n := range []uint32{0, 1, 0xF_0000 - 1, 0xF_0000, 0xF_0000 + 1, math.MaxInt32, math.MaxUint32} {
		f.queueNo["q"+strconv.FormatUint(uint64(n), 10)] = n
	}
	for name := range maps.Clone(f.queueNo) {
		for _, q := range []string{name, name + "-new"} {
			for _, k := range []uint32{kQueueDir, kStats, kPolicy, kNext} {
				ino := f.queueIno(q, k)
				if ino > math.MaxUint32 || ino < inoQueueBase || ino >= inoMsgBase {
					t.Fatalf("queue %s (%d), kind %d: inode %#x outside [%#x, %#x)", q, f.queueNo[q], k, ino, inoQueueBase, inoMsgBase)
				}
			}
		}
	}
}

// TestPolicyTruncatePast32Bits: ftruncate of a .policy being written to a
// size past 2^32 keeps the document (it only ever shortens it). int(size)
// wrapped to 1 on armv7 and the slice that followed panicked (EIO to the caller).
func TestPolicyTruncatePast32Bits(t *testing.T) {
	doc := `{"visibilityTimeoutSec": 60}`
	w := &policyWriter{buf: []byte(doc)}
	for _, size := range []uint64{1<<32 + 1, 1 << 32, 1<<32 + uint64(len(doc)), math.MaxInt64, uint64(len(doc))} {
		w.truncate(size)
		if string(w.buf) != doc {
			t.Fatalf("truncate(%d) left %q, want %q", size, w.buf, doc)
		}
	}
	w.truncate(1)
	if string(w.buf) != "{" {
		t.Fatalf("truncate(1) left %q", w.buf)
	}
	w.truncate(0)
	if len(w.buf) != 0 {
		t.Fatalf("truncate(0) left %q", w.buf)
	}
}
