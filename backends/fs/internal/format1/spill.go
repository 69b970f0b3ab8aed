package format1

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/google/btree"
	"golang.org/x/sys/unix"

	"yirangmq/backends/fs/internal/memindex"
	"yirangmq/queuecore"
)

// A queue's ready messages are kept in memory up to a threshold (spillAt,
// default defaultSpillAt). Past it, the newer ready messages of a backlog
// go to the queue's spill file instead of the index: see "Spill" in the
// package comment. The spill is a cache of metadata that the snapshot and
// the journal hold already; it is never read at Open (DIR/spill is emptied
// there and rebuilt while the snapshot loads).

const (
	spillDir = "spill"
	// defaultSpillAt is the number of ready messages a queue keeps in the
	// index before newer ones spill: about 1 MiB of index per queue.
	defaultSpillAt = 4096
	// spillPerBlock records make a block, the unit read from the file; the
	// index keeps an offset and a first ID per block.
	spillPerBlock = 64
	// defaultSpillTrimAt is the least number of gone records at the head
	// of a spill that a trim drops: see trim.
	defaultSpillTrimAt = 1 << 16
)

// spill.gone is a word of 64 bits per block: a trim drops whole words.
var _ = [1]struct{}{}[spillPerBlock-64]

// spill is one queue's spill file and the compact index of its records.
// Records are appended in (key, seq, id) order, so the file is in List
// order. IDs are nearly in that order too (queuecore gives IDs and Seqs
// close together): a record's ID must be larger than every ID two blocks
// before its own, so that a record is found by ID with a binary search
// over the blocks' running maximum and a read of at most two blocks. Names are found through an open-addressing table of
// record numbers keyed by a 32-bit hash of the name; a hit is confirmed by
// reading the record. A record that leaves the ready state (lease, rename,
// delete) is marked gone; the file is removed once no record in it is
// live, and the gone records at its head are dropped by trim once they are
// many, so that a backlog that never drains costs memory and disk for the
// records it holds, not for every record it ever held.
//
// The index's lock (the Store's mu) guards every field but refs; records
// below n are immutable, so they may be read without the lock by whoever
// holds a reference (List, a checkpoint).
type spill struct {
	f    *os.File
	path string
	refs atomic.Int32 // the queue's reference plus one per reader; the last closes f
	seed maphash.Seed

	size     int64    // bytes written (file offset of the next record)
	punched  int64    // bytes at the start of the file given back to the file system (trim)
	n        int      // records written since the last trim
	head     int      // every record before head is gone
	live     int      // records not gone
	dropped  bool     // the queue let go of this spill
	blockOff []int64  // file offset of record b*spillPerBlock
	blockMax []uint64 // largest ID in blocks 0 to b
	hashes   []uint32 // per record: hash of its name
	gone     []uint64 // per record: one bit, set once it left the spill
	table    []uint32 // record+1 by name hash; 0 is an empty slot
	inTable  int      // records in table (live or gone)

	lastKey       int64
	lastSeq, last uint64 // seq and ID of the last record
	trimmed       int64  // records dropped by trims
	keepBytes     bool   // a trim of the file failed: trims leave it alone
}

func newSpill(dir string, gen uint64, q string) (*spill, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s.%d", q, gen))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	sp := &spill{f: f, path: path, seed: maphash.MakeSeed()}
	sp.refs.Store(1)
	return sp, nil
}

// release drops one reference; the last one closes and removes the file.
func (sp *spill) release() {
	if sp.refs.Add(-1) == 0 {
		_ = sp.f.Close()
		_ = os.Remove(sp.path)
	}
}

// after says whether e sorts after the last record.
func (sp *spill) after(e *entry) bool {
	if sp.n == 0 {
		return true
	}
	last := entry{Key: sp.lastKey, Seq: sp.lastSeq, ID: sp.last}
	return memindex.LessOrder(&last, e)
}

// canTake says whether e can be appended: it sorts after the last record
// and its ID is larger than those of the blocks before the one before.
func (sp *spill) canTake(e *entry) bool {
	if b := sp.n/spillPerBlock - 2; b >= 0 && e.ID <= sp.blockMax[b] {
		return false
	}
	return sp.after(e)
}

func (sp *spill) hash(name string) uint32 {
	return uint32(maphash.String(sp.seed, name))
}

func slotOf(h uint32, bits uint) uint32 { return (h * 0x9E3779B1) >> (32 - bits) }

// append writes e as the next record and returns its number.
func (sp *spill) append(e *entry) (int, error) {
	var buf [320]byte
	rec := binary.AppendUvarint(buf[:0], e.ID)
	rec = binary.AppendUvarint(rec, e.Seq)
	rec = binary.AppendVarint(rec, e.Key)
	rec = binary.AppendVarint(rec, e.Size)
	rec = append(rec, e.NLen)
	rec = append(rec, e.Data...)
	var hdr [binary.MaxVarintLen64]byte
	h := binary.PutUvarint(hdr[:], uint64(len(rec)))
	out := make([]byte, 0, h+len(rec))
	out = append(append(out, hdr[:h]...), rec...)
	if _, err := sp.f.WriteAt(out, sp.size); err != nil {
		return 0, err
	}
	r := sp.n
	if r%spillPerBlock == 0 {
		prev := uint64(0)
		if len(sp.blockMax) > 0 {
			prev = sp.blockMax[len(sp.blockMax)-1]
		}
		sp.blockOff = append(sp.blockOff, sp.size)
		sp.blockMax = append(sp.blockMax, prev)
	}
	sp.blockMax[len(sp.blockMax)-1] = max(sp.blockMax[len(sp.blockMax)-1], e.ID)
	sp.size += int64(len(out))
	sp.n++
	sp.live++
	sp.hashes = append(sp.hashes, sp.hash(e.Name()))
	if r/64 >= len(sp.gone) {
		sp.gone = append(sp.gone, 0)
	}
	sp.lastKey, sp.lastSeq, sp.last = e.Key, e.Seq, e.ID
	if (sp.inTable+1)*4 > len(sp.table)*3 {
		sp.rebuildTable()
	}
	sp.tableAdd(r)
	return r, nil
}

func (sp *spill) isGone(r int) bool { return sp.gone[r/64]&(1<<(r%64)) != 0 }

// del marks record r gone.
func (sp *spill) del(r int) {
	if sp.isGone(r) {
		return
	}
	sp.gone[r/64] |= 1 << (r % 64)
	sp.live--
	for sp.head < sp.n && sp.isGone(sp.head) {
		sp.head++
	}
}

// rebuildTable sizes the name table for a load of at most a half with the
// live records, and fills it with them (gone records leave it here). It is
// rebuilt at a load of three quarters: 5 to 12 bytes a record.
func (sp *spill) rebuildTable() {
	size := 64
	for size < (sp.live+1)*2 {
		size *= 2
	}
	sp.table = make([]uint32, size)
	sp.inTable = 0
	for r := sp.head; r < sp.n; r++ {
		if !sp.isGone(r) {
			sp.tableAdd(r)
		}
	}
}

func (sp *spill) tableAdd(r int) {
	bits := uint(bitsOf(len(sp.table)))
	mask := uint32(len(sp.table) - 1)
	for i := slotOf(sp.hashes[r], bits); ; i = (i + 1) & mask {
		if sp.table[i] == 0 {
			sp.table[i] = uint32(r + 1)
			sp.inTable++
			return
		}
	}
}

func bitsOf(n int) int {
	b := 0
	for 1<<b < n {
		b++
	}
	return b
}

// find returns the live record named name, or -1.
func (sp *spill) find(q *queue, name string) (int, *entry, error) {
	if sp.live == 0 || len(sp.table) == 0 {
		return -1, nil, nil
	}
	h := sp.hash(name)
	bits := uint(bitsOf(len(sp.table)))
	mask := uint32(len(sp.table) - 1)
	for i := slotOf(h, bits); sp.table[i] != 0; i = (i + 1) & mask {
		r := int(sp.table[i] - 1)
		if sp.hashes[r] != h || sp.isGone(r) {
			continue
		}
		e, err := sp.read(q, r)
		if err != nil {
			return -1, nil, err
		}
		if e.Name() == name {
			return r, e, nil
		}
	}
	return -1, nil, nil
}

// byID returns the live record of message id, or -1. Only the first block
// whose running maximum reaches id and the one after can hold it (see
// canTake).
func (sp *spill) byID(q *queue, id uint64) (int, *entry, error) {
	nb := len(sp.blockMax)
	if sp.live == 0 || id > sp.blockMax[nb-1] {
		return -1, nil, nil
	}
	b0 := sort.Search(nb, func(i int) bool { return sp.blockMax[i] >= id })
	for b := max(b0, sp.head/spillPerBlock); b <= b0+1 && b < nb; b++ {
		es, err := sp.readBlock(q, b)
		if err != nil {
			return -1, nil, err
		}
		for _, e := range es {
			// A message can come back to the spill (a nack, a rename):
			// its gone records stay, so skip them.
			if r := int(e.Slot - 1); e.ID == id && !sp.isGone(r) {
				return r, e, nil
			}
		}
	}
	return -1, nil, nil
}

// read returns record r.
func (sp *spill) read(q *queue, r int) (*entry, error) {
	es, err := sp.readBlock(q, r/spillPerBlock)
	if err != nil {
		return nil, err
	}
	return es[r%spillPerBlock], nil
}

// readBlock decodes block b: records b*spillPerBlock up to the next block
// or n. It needs no lock as long as n is read under one.
func (sp *spill) readBlock(q *queue, b int) ([]*entry, error) {
	end := sp.size
	if b+1 < len(sp.blockOff) {
		end = sp.blockOff[b+1]
	}
	return sp.decodeBlock(q, b, sp.blockOff[b], end, min(sp.n-b*spillPerBlock, spillPerBlock))
}

func (sp *spill) decodeBlock(q *queue, b int, off, end int64, count int) ([]*entry, error) {
	buf := make([]byte, end-off)
	if _, err := sp.f.ReadAt(buf, off); err != nil {
		return nil, fmt.Errorf("read spill %s: %w", sp.path, err)
	}
	es := make([]*entry, 0, count)
	r := memindex.NewReader(string(buf))
	for range count {
		s := r.Str() // a record: its uvarint length, then itself
		if r.Err() != nil {
			return nil, fmt.Errorf("spill %s block %d: %w", sp.path, b, r.Err())
		}
		rec := memindex.NewReader(s)
		e := &entry{Q: q, State: queuecore.StateReady}
		e.ID = rec.Uvarint()
		e.Seq = rec.Uvarint()
		e.Key = rec.Varint()
		e.Size = rec.Varint()
		e.NLen = rec.Byte()
		e.Data = rec.Rest()
		if rec.Err() != nil || len(e.Data) < int(e.NLen) {
			return nil, fmt.Errorf("spill %s block %d: %w", sp.path, b, memindex.ErrCorruptEntry)
		}
		e.Slot = int32(b*spillPerBlock + len(es) + 1)
		es = append(es, e)
	}
	return es, nil
}

// spillView is a reader's hold on a spill: the records below n, which are
// immutable, with the gone bits as of when it was taken (snapshot) or read
// live under the lock (List).
type spillView struct {
	sp       *spill
	from     int
	n        int
	size     int64
	blockOff []int64  // the spill's, as of the view: appends may move the spill's slice
	gone     []uint64 // a copy, for a checkpoint; nil: ask the spill under the lock
}

// view takes a reference; the caller holds the index's lock.
func (sp *spill) view(copyGone bool) *spillView {
	sp.refs.Add(1)
	v := &spillView{sp: sp, from: sp.head, n: sp.n, size: sp.size, blockOff: sp.blockOff}
	if copyGone {
		v.gone = append([]uint64(nil), sp.gone...)
	}
	return v
}

// block returns the live records of block b that the view sees, in order.
// isGone reports a record gone; with a copied gone set it needs no lock.
func (v *spillView) block(q *queue, b int, isGone func(r int) bool) ([]*entry, error) {
	sp := v.sp
	end := v.size
	if b+1 < len(v.blockOff) && (b+1)*spillPerBlock < v.n {
		end = v.blockOff[b+1]
	}
	es, err := sp.decodeBlock(q, b, v.blockOff[b], end, min(v.n-b*spillPerBlock, spillPerBlock))
	if err != nil {
		return nil, err
	}
	out := es[:0]
	for _, e := range es {
		r := int(e.Slot - 1)
		if r >= v.from && !isGone(r) {
			out = append(out, e)
		}
	}
	return out, nil
}

func (v *spillView) copiedGone(r int) bool { return v.gone[r/64]&(1<<(r%64)) != 0 }

// listSpilled is List of the ready messages of a queue that has a spill:
// the ready tree (a copy-on-write clone) merged with the spill file, read
// a block at a time. The gone marks of a block are read under the lock
// when it is read, so a message leased meanwhile is not listed, and one
// that came back to the tree after the clone is not listed twice.
func (s *Store) listSpilled(ctx context.Context, queue string, fn func(queuecore.Message) bool) error {
	s.mu.Lock()
	q := s.ix.Queues[queue]
	if q == nil {
		s.mu.Unlock()
		return fmt.Errorf("list queue %q: %w", queue, queuecore.ErrNotFound)
	}
	t := q.ByState[queuecore.StateReady].Clone()
	var v *spillView
	if q.Ext.spill != nil {
		v = q.Ext.spill.view(false)
	}
	s.mu.Unlock()
	if v != nil {
		defer v.sp.release()
	}
	return mergeSpill(t, v, func(b int) ([]*entry, bool, error) {
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		s.mu.RLock()
		defer s.mu.RUnlock()
		if v.sp.dropped {
			return nil, false, nil // every record in it is gone
		}
		es, err := v.block(q, b, v.sp.isGone)
		if err != nil {
			err = fmt.Errorf("list queue %q: %w", queue, err)
		}
		return es, true, err
	}, func(e *entry) bool { return fn(e.Message()) })
}

// mergeSpill calls fn with the entries of t and of the view's spill in
// (key, seq, id) order. block returns the live records of one block, more
// false when the rest of the spill is gone.
func mergeSpill(t *btree.BTreeG[*entry], v *spillView, block func(b int) (es []*entry, more bool, err error), fn func(*entry) bool) error {
	next, stop := iter.Pull(func(yield func(*entry) bool) { t.Ascend(yield) })
	defer stop()
	mem, memOK := next()
	var buf []*entry
	b, nb := 0, 0
	if v != nil {
		b, nb = v.from/spillPerBlock, (v.n+spillPerBlock-1)/spillPerBlock
	}
	for {
		if len(buf) == 0 && b < nb {
			es, more, err := block(b)
			if err != nil {
				return err
			}
			buf = es
			b++
			if !more {
				nb = 0
			}
			continue
		}
		var e *entry
		switch {
		case len(buf) > 0 && (!memOK || memindex.LessOrder(buf[0], mem)):
			e, buf = buf[0], buf[1:]
		case memOK:
			e = mem
			mem, memOK = next()
		default:
			return nil
		}
		if !fn(e) {
			return nil
		}
	}
}

// each calls fn with every live record, in order; the caller holds the
// lock. A nil spill has none.
func (sp *spill) each(q *queue, fn func(*entry)) error {
	if sp == nil {
		return nil
	}
	for b := sp.head / spillPerBlock; b*spillPerBlock < sp.n; b++ {
		es, err := sp.readBlock(q, b)
		if err != nil {
			return err
		}
		for _, e := range es {
			if !sp.isGone(int(e.Slot - 1)) {
				fn(e)
			}
		}
	}
	return nil
}

// trimmable says whether a trim of the spill is due and allowed: the
// whole blocks of its gone head hold at least trimAt records and at least
// as many records as the rest (so that what a trim copies in memory, the
// records it keeps, is paid for by the records it drops), and no reader
// holds the spill (a view reads records by their numbers, which a trim
// changes). The caller holds the index's lock.
func (sp *spill) trimmable(trimAt int) bool {
	cut := sp.head / spillPerBlock * spillPerBlock
	return cut > 0 && cut >= trimAt && cut >= sp.n-cut && sp.refs.Load() == 1
}

// punchHole gives the file system the blocks of f's bytes [off, off+n)
// back; a variable so that a test can take it away.
var punchHole = func(f *os.File, off, n int64) error {
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

// trim drops the blocks before the one that holds head, all of whose
// records are gone, and numbers the records again from 0: the memory of a
// spill is its records since the last trim. On disk the dropped bytes are
// punched out of the file, so its offsets stay; where the file system
// cannot punch holes, the records kept are copied to a new file (when
// they are few: the copy is made under the index's lock). The memory is
// trimmed whatever happens to the file; an error says the file kept its
// bytes, and the file is not trimmed again (it is removed with the spill).
// The caller holds the index's lock, trimmable said yes, and no entry
// read from the spill is still to be used (its slot is a record number).
func (sp *spill) trim() error {
	cb := sp.head / spillPerBlock
	cut := cb * spillPerBlock
	var shift int64
	var err error
	if !sp.keepBytes {
		shift, err = sp.dropBytes(sp.blockOff[cb])
		sp.keepBytes = err != nil
	}
	sp.hashes = slices.Clone(sp.hashes[cut:])
	sp.gone = slices.Clone(sp.gone[cb:]) // a word of bits per block
	// The running maxima keep the IDs of the dropped blocks: still an
	// upper bound, which is all that byID and canTake need.
	sp.blockMax = slices.Clone(sp.blockMax[cb:])
	off := slices.Clone(sp.blockOff[cb:])
	for i := range off {
		off[i] -= shift
	}
	sp.blockOff = off
	sp.size -= shift
	sp.n -= cut
	sp.head -= cut
	sp.trimmed += int64(cut)
	sp.rebuildTable()
	return err
}

// spillCopyMax is the most bytes a trim copies to a new file where the
// file system cannot punch holes.
const spillCopyMax = 8 << 20

// dropBytes lets go of the file's bytes before off, and returns by how
// much the offsets of the bytes after it moved (0 when punched).
func (sp *spill) dropBytes(off int64) (shift int64, err error) {
	end := off &^ 4095 // whole file system blocks only
	if end <= sp.punched {
		return 0, nil
	}
	err = punchHole(sp.f, sp.punched, end-sp.punched)
	if err == nil {
		sp.punched = end
		return 0, nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return 0, fmt.Errorf("give back the head of spill %s: %w", sp.path, err)
	}
	if sp.size-off > spillCopyMax {
		return 0, fmt.Errorf("punch a hole in spill %s: %w (and %d bytes are too many to copy)", sp.path, err, sp.size-off)
	}
	// Copy the records kept to a new file under the same name.
	tmp := sp.path + ".trim"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err == nil {
		_, err = io.Copy(f, io.NewSectionReader(sp.f, off, sp.size-off))
		if err == nil {
			err = os.Rename(tmp, sp.path)
		}
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("copy the rest of spill %s: %w", sp.path, err)
	}
	_ = sp.f.Close()
	sp.f = f
	sp.punched = 0
	return off, nil
}
