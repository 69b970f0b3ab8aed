package fs

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// intent is the record of a batch of several messages under way: what
// Open needs to finish it (see the package comment). It is the file
// "intent" of the batch's directory DIR/intents/N, beside the bodies of
// the batch's new messages (named by ID).
type intent struct {
	Batch uint64     `json:"batch"`
	Ops   []intentOp `json:"ops"`
	End   bool       `json:"end"` // written last: an intent without it was cut short
}

type intentOp struct {
	Op     string            `json:"op"` // insert, update or delete
	ID     uint64            `json:"id"`
	From   string            `json:"from,omitempty"` // update, delete: where the file is, relative to DIR/queues
	To     string            `json:"to,omitempty"`   // insert, update: where it goes
	Fields map[string]string `json:"fields,omitempty"`
}

const intentName = "intent"

// intentOpsLocked is what the applied changes do, as intent ops.
func (s *Store) intentOpsLocked(changes []change) []intentOp {
	ops := make([]intentOp, 0, len(changes))
	for _, c := range changes {
		switch {
		case c.New == nil:
			ops = append(ops, intentOp{Op: "delete", ID: c.Old.ID, From: rel(s.qdir, s.entryPath(c.Old))})
		case c.Old == nil:
			ops = append(ops, intentOp{Op: "insert", ID: c.New.ID, To: rel(s.qdir, s.entryPath(c.New))})
		default:
			m := c.New.Message()
			ops = append(ops, intentOp{Op: "update", ID: c.New.ID, From: rel(s.qdir, s.entryPath(c.Old)), To: rel(s.qdir, s.entryPath(c.New)), Fields: fieldMap(fields(&m))})
		}
	}
	return ops
}

// sameOps reports whether two plans are the same changes of the tree.
func sameOps(a, b []intentOp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Op != b[i].Op || a[i].ID != b[i].ID || a[i].From != b[i].From || a[i].To != b[i].To || !maps.Equal(a[i].Fields, b[i].Fields) {
			return false
		}
	}
	return true
}

func fieldMap(fs []field) map[string]string {
	m := make(map[string]string, len(fs))
	for _, f := range fs {
		m[f.key] = f.val
	}
	return m
}

// batchDir is the directory of a batch with an intent: made under a temp
// name, renamed to DIR/intents/N once the intent is in it, removed once
// the batch is durable.
type batchDir struct {
	s          *Store
	n          uint64
	tmp, final string
	kept       bool
}

func (s *Store) newBatchDir() (*batchDir, error) {
	n := s.batchGen.Add(1)
	d := filepath.Join(s.dir, intentsDir)
	b := &batchDir{s: s, n: n, tmp: filepath.Join(d, tempPrefix+strconv.FormatUint(n, 10)), final: filepath.Join(d, strconv.FormatUint(n, 10))}
	if err := os.Mkdir(b.tmp, 0o700); err != nil {
		return nil, fmt.Errorf("batch directory: %w", err)
	}
	return b, nil
}

// keep hands the batch's directory over to the flusher (or to the next
// Open, after a failure).
func (b *batchDir) keep() {
	if b != nil {
		b.kept = true
	}
}

func (b *batchDir) remove() {
	if b != nil && !b.kept {
		os.RemoveAll(b.tmp)
		os.RemoveAll(b.final)
	}
}

// writeIntent writes the intent into the batch's directory and gives the
// directory its final name, durably in SyncFull and SyncStrict: with the
// bodies in it, the intent is all Open needs to finish the batch, and no
// part of the batch may be durable before it is. Outside the lock: the
// syncs see only the batch's own files and DIR/intents.
func (s *Store) writeIntent(b *batchDir, plan []intentOp) error {
	in := intent{Batch: b.n, Ops: plan, End: true}
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	p := filepath.Join(b.tmp, intentName)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("write intent: %w", err)
	}
	_, err = f.Write(append(data, '\n'))
	if err == nil && s.durable {
		err = s.fsync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && s.durable {
		err = s.fsyncPath(b.tmp)
	}
	if err == nil {
		err = os.Rename(b.tmp, b.final)
	}
	if err == nil && s.durable {
		err = s.fsyncPath(filepath.Dir(b.final))
	}
	if err != nil {
		return fmt.Errorf("write intent: %w", err)
	}
	return nil
}
