package format1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/google/btree"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// The snapshot file:
//
//	{"snapshot":1,"lsn":N,"max_id":M,"queues":Q,"messages":K}
//	{"queue":{...}}          Q lines, by name
//	{...message...}          K lines, by queue, state and List order
//	{"end":K,"crc":"xxxxxxxx"}   CRC-32C of every byte before this line
const snapshotVersion = 1

var errBadSnapshot = errors.New("bad snapshot")

// snapshotImage is the metadata of the store at one lsn. Its trees are
// copy-on-write clones, so it can be written out while commits go on.
type snapshotImage struct {
	lsn    uint64
	maxID  uint64
	queues []queuecore.QueueInfo
	trees  []*btree.BTreeG[*entry]
	spills []*spillView // per tree: the queue's spill, merged with its ready tree; mostly nil
	spillQ []*queue
	count  int
}

// release lets go of the image's spill files.
func (img *snapshotImage) release() {
	for i, v := range img.spills {
		if v != nil {
			v.sp.release()
			img.spills[i] = nil
		}
	}
}

// imageLocked takes an image of the index; the caller holds the write lock
// (Clone writes to the tree it clones).
func (s *Store) imageLocked() *snapshotImage {
	img := &snapshotImage{lsn: s.lsn, maxID: s.ix.MaxID}
	for _, q := range s.ix.SortedQueues() {
		img.queues = append(img.queues, q.Info)
		for _, st := range queuecore.States {
			t := q.ByState[st]
			var v *spillView
			if st == queuecore.StateReady && q.Ext.spill != nil {
				v = q.Ext.spill.view(true)
				img.count += q.Ext.spill.live
			} else if t.Len() == 0 {
				continue
			}
			img.trees = append(img.trees, t.Clone())
			img.spills = append(img.spills, v)
			img.spillQ = append(img.spillQ, q)
			img.count += t.Len()
		}
	}
	return img
}

// writeSnapshot writes img durably and returns the file's size.
func writeSnapshot(dir string, img *snapshotImage, sync bool) (int64, error) {
	return writeFileDurably(dir, snapshotName, sync, func(w io.Writer) error {
		crc := crc32.New(crcTable)
		bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 1<<20)
		b := make([]byte, 0, 4096)
		b = append(b, `{"snapshot":`...)
		b = strconv.AppendInt(b, snapshotVersion, 10)
		b = append(b, `,"lsn":`...)
		b = strconv.AppendUint(b, img.lsn, 10)
		b = append(b, `,"max_id":`...)
		b = strconv.AppendUint(b, img.maxID, 10)
		b = append(b, `,"queues":`...)
		b = strconv.AppendInt(b, int64(len(img.queues)), 10)
		b = append(b, `,"messages":`...)
		b = strconv.AppendInt(b, int64(img.count), 10)
		b = append(b, "}\n"...)
		for i := range img.queues {
			b = append(b, `{"queue":`...)
			b = appendQueueJSON(b, &img.queues[i])
			b = append(b, "}\n"...)
		}
		var werr error
		flush := func() {
			if werr == nil {
				_, werr = bw.Write(b)
			}
			b = b[:0]
		}
		flush()
		for i, t := range img.trees {
			write := func(e *entry) bool {
				m := e.Message()
				b = appendMessageJSON(b, &m)
				b = append(b, '\n')
				if len(b) > 3000 {
					flush()
				}
				return werr == nil
			}
			v := img.spills[i]
			if v == nil {
				t.Ascend(write)
				continue
			}
			q := img.spillQ[i]
			err := mergeSpill(t, v, func(b int) ([]*entry, bool, error) {
				es, err := v.block(q, b, v.copiedGone)
				return es, true, err
			}, write)
			if err != nil {
				return err
			}
		}
		flush()
		if werr != nil {
			return werr
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		b = append(b, `{"end":`...)
		b = strconv.AppendInt(b, int64(img.count), 10)
		b = append(b, `,"crc":"`...)
		b = appendHex32(b, crc.Sum32())
		b = append(b, "\"}\n"...)
		_, err := w.Write(b)
		return err
	})
}

// snapshotState is what a snapshot holds besides the index.
type snapshotState struct {
	lsn   uint64
	maxID uint64
	size  int64
}

// readSnapshot loads the snapshot of dir into ix; a store without one is
// empty.
//
// It stays whole: frozen format-1 code (see the package comment).
func readSnapshot(dir string, ix *index) (snapshotState, error) {
	var st snapshotState
	f, err := os.Open(filepath.Join(dir, snapshotName))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	defer f.Close()
	crc := crc32.New(crcTable)
	lr := &lineReader{br: bufio.NewReaderSize(f, 1<<20), crc: crc}

	line, err := lr.next()
	if err != nil {
		return st, fmt.Errorf("%w: header: %w", errBadSnapshot, err)
	}
	var version, nQueues, nMessages uint64
	r := &jsonReader{b: line}
	err = r.object(func(key []byte) error {
		var err error
		switch string(key) {
		case "snapshot":
			version, err = r.uint(1 << 32)
		case "lsn":
			st.lsn, err = r.uint(1<<63 - 1)
		case "max_id":
			st.maxID, err = r.uint(1<<64 - 1)
		case "queues":
			nQueues, err = r.uint(1 << 40)
		case "messages":
			nMessages, err = r.uint(1 << 40)
		default:
			err = r.skip()
		}
		return err
	})
	if err != nil {
		return st, fmt.Errorf("%w: header: %w", errBadSnapshot, err)
	}
	if version != snapshotVersion {
		return st, fmt.Errorf("%w: version %d, this program reads version %d", errBadSnapshot, version, snapshotVersion)
	}
	for range nQueues {
		line, err := lr.next()
		if err != nil {
			return st, fmt.Errorf("%w: queue: %w", errBadSnapshot, err)
		}
		r := &jsonReader{b: line}
		var q queuecore.QueueInfo
		err = r.object(func(key []byte) error {
			if string(key) != "queue" {
				return r.skip()
			}
			var err error
			q, err = decodeQueueJSON(r)
			return err
		})
		if err == nil {
			err = queuecore.CheckQueueName(q.Name)
		}
		if err != nil {
			return st, fmt.Errorf("%w: queue line %d: %w", errBadSnapshot, lr.n, err)
		}
		ix.putQueue(q)
	}
	for range nMessages {
		line, err := lr.next()
		if err != nil {
			return st, fmt.Errorf("%w: message: %w", errBadSnapshot, err)
		}
		m, err := decodeMessageJSON(&jsonReader{b: line})
		if err != nil {
			return st, fmt.Errorf("%w: line %d: %w", errBadSnapshot, lr.n, err)
		}
		if err := ix.load(&m); err != nil {
			return st, fmt.Errorf("%w: line %d: %w", errBadSnapshot, lr.n, err)
		}
	}
	sum := crc.Sum32()
	line, err = lr.next()
	if err != nil {
		return st, fmt.Errorf("%w: trailer: %w", errBadSnapshot, err)
	}
	var want = appendHex32(nil, sum)
	var end uint64
	var got []byte
	r = &jsonReader{b: line}
	err = r.object(func(key []byte) error {
		var err error
		switch string(key) {
		case "end":
			end, err = r.uint(1 << 40)
		case "crc":
			got, _, err = r.rawString()
		default:
			err = r.skip()
		}
		return err
	})
	if err != nil || end != nMessages || !bytes.Equal(got, want) {
		return st, fmt.Errorf("%w: trailer %q does not match the content (crc %s, %d messages)", errBadSnapshot, line, want, nMessages)
	}
	ix.MaxID = max(ix.MaxID, st.maxID)
	st.maxID = ix.MaxID
	if fi, err := f.Stat(); err == nil {
		st.size = fi.Size()
	}
	return st, nil
}

// lineReader reads lines of any length and feeds every byte it returns to
// crc.
type lineReader struct {
	br  *bufio.Reader
	crc hash.Hash32
	n   int // lines read
	buf []byte
}

// next returns the next line without its newline; the slice is valid until
// the next call.
func (lr *lineReader) next() ([]byte, error) {
	line, err := lr.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		lr.buf = append(lr.buf[:0], line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			line, err = lr.br.ReadSlice('\n')
			lr.buf = append(lr.buf, line...)
		}
		line = lr.buf
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	lr.n++
	lr.crc.Write(line)
	return line[:len(line)-1], nil
}

// writeFileDurably is the one durable-write helper of the store: write
// dir/name through a temp file, fsync it, rename it into place and fsync
// the directory, so that after a crash the file is either the old one or
// the whole new one. Without sync (SyncOff) it skips both fsyncs and keeps
// only the atomic rename.
func writeFileDurably(dir, name string, sync bool, write func(w io.Writer) error) (size int64, err error) {
	tmp := filepath.Join(dir, tempPrefix+name)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	cw := &countingWriter{w: f}
	if err := write(cw); err != nil {
		return 0, fmt.Errorf("write %s: %w", tmp, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			return 0, fmt.Errorf("fsync %s: %w", tmp, err)
		}
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return 0, err
	}
	if sync {
		if err := backends.SyncDir(dir); err != nil {
			return 0, err
		}
	}
	return cw.n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
