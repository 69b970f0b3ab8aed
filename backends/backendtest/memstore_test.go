package backendtest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// memStore is the reference store the suite is tested against: maps in
// memory, and an append-only log of every change (one JSON line per
// PutQueue, DeleteQueue or batch) replayed at open, so that reopen and
// kill -9 work. A torn last line is a change that never happened.
type memStore struct {
	mu     sync.Mutex
	lock   *backends.Lock
	log    *os.File
	sync   queuecore.SyncMode
	closed bool

	queues map[string]queuecore.QueueInfo
	msgs   map[uint64]*memMsg
	names  map[memName]uint64
	maxID  uint64
}

var _ queuecore.Store = (*memStore)(nil)

type memMsg struct {
	m    queuecore.Message
	body []byte
}

type memName struct {
	queue, name string
	archived    bool
}

func nameOf(m queuecore.Message) memName { return memName{m.Queue, m.Name, m.State == archived} }

// memRecord is one line of the log.
type memRecord struct {
	Put         *queuecore.QueueInfo `json:",omitempty"`
	DeleteQueue string               `json:",omitempty"`
	Ops         []queuecore.Op       `json:",omitempty"`
}

const memLogName = "log.jsonl"

// memOptions are faults for tests of the suite itself.
type memOptions struct {
	// dropTail drops the last dropTail records of the log at open: a store
	// that acknowledged commits it had not made durable.
	dropTail int
}

func openMem(_ context.Context, dir string, sync queuecore.SyncMode, opt memOptions) (*memStore, error) {
	lock, err := backends.LockStore(dir, "memstore")
	if err != nil {
		return nil, err
	}
	s := &memStore{
		lock: lock, sync: sync,
		queues: map[string]queuecore.QueueInfo{},
		msgs:   map[uint64]*memMsg{},
		names:  map[memName]uint64{},
	}
	path := filepath.Join(dir, memLogName)
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		lock.Unlock()
		return nil, fmt.Errorf("read log: %w", err)
	}
	// Whole lines only: a line cut by a crash was never committed.
	var records [][]byte
	good := 0
	for rest := data; ; {
		line, after, ok := bytes.Cut(rest, []byte("\n"))
		if !ok {
			break
		}
		records = append(records, line)
		good += len(line) + 1
		rest = after
	}
	if opt.dropTail > 0 {
		n := max(len(records)-opt.dropTail, 0)
		for _, r := range records[n:] {
			good -= len(r) + 1
		}
		records = records[:n]
	}
	for i, line := range records {
		var rec memRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			lock.Unlock()
			return nil, fmt.Errorf("log record %d: %w", i, err)
		}
		if err := s.replay(rec); err != nil {
			lock.Unlock()
			return nil, fmt.Errorf("log record %d: %w", i, err)
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		lock.Unlock()
		return nil, fmt.Errorf("open log: %w", err)
	}
	if err := f.Truncate(int64(good)); err != nil {
		f.Close()
		lock.Unlock()
		return nil, fmt.Errorf("truncate log: %w", err)
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		lock.Unlock()
		return nil, err
	}
	s.log = f
	return s, nil
}

func (s *memStore) replay(rec memRecord) error {
	switch {
	case rec.Put != nil:
		s.queues[rec.Put.Name] = *rec.Put
	case rec.DeleteQueue != "":
		s.dropQueue(rec.DeleteQueue)
	default:
		return s.applyOps(rec.Ops)
	}
	return nil
}

// write appends a record to the log, as durably as the sync mode says.
func (s *memStore) write(rec memRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := s.log.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write log: %w", err)
	}
	if s.sync == queuecore.SyncFull {
		if err := s.log.Sync(); err != nil {
			return fmt.Errorf("sync log: %w", err)
		}
	}
	return nil
}

var errMemClosed = errors.New("memstore closed")

func (s *memStore) Queues(context.Context) ([]queuecore.QueueInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errMemClosed
	}
	var out []queuecore.QueueInfo
	for _, q := range s.queues {
		q.Policy = bytes.Clone(q.Policy)
		out = append(out, q)
	}
	slices.SortFunc(out, func(a, b queuecore.QueueInfo) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

func (s *memStore) PutQueue(_ context.Context, q queuecore.QueueInfo) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errMemClosed
	}
	q.Policy = bytes.Clone(q.Policy)
	if err := s.write(memRecord{Put: &q}); err != nil {
		return err
	}
	s.queues[q.Name] = q
	return nil
}

func (s *memStore) DeleteQueue(_ context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errMemClosed
	}
	if _, ok := s.queues[name]; !ok {
		return fmt.Errorf("queue %q: %w", name, queuecore.ErrNotFound)
	}
	if err := s.write(memRecord{DeleteQueue: name}); err != nil {
		return err
	}
	s.dropQueue(name)
	return nil
}

func (s *memStore) dropQueue(name string) {
	delete(s.queues, name)
	for id, mm := range s.msgs {
		if mm.m.Queue == name {
			delete(s.msgs, id)
			delete(s.names, nameOf(mm.m))
		}
	}
}

func (s *memStore) Apply(_ context.Context, ops []queuecore.Op) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errMemClosed
	}
	undo, err := s.applyOpsUndo(ops)
	if err != nil {
		return err
	}
	if err := s.write(memRecord{Ops: ops}); err != nil {
		undo()
		return err
	}
	return nil
}

func (s *memStore) applyOps(ops []queuecore.Op) error {
	_, err := s.applyOpsUndo(ops)
	return err
}

// applyOpsUndo applies ops in order; on error it undoes those applied and
// returns the error, else it returns a function that undoes them all.
func (s *memStore) applyOpsUndo(ops []queuecore.Op) (func(), error) {
	var undos []func()
	undo := func() {
		for i := len(undos) - 1; i >= 0; i-- {
			undos[i]()
		}
	}
	prevMax := s.maxID
	undos = append(undos, func() { s.maxID = prevMax })
	for _, op := range ops {
		u, err := s.applyOne(op)
		if err != nil {
			undo()
			return nil, err
		}
		undos = append(undos, u)
	}
	return undo, nil
}

func (s *memStore) applyOne(op queuecore.Op) (func(), error) {
	m := op.Msg
	old, exists := s.msgs[m.ID]
	switch op.Kind {
	case queuecore.OpInsert, queuecore.OpUpdate:
		if op.Kind == queuecore.OpInsert && exists {
			return nil, fmt.Errorf("insert message %d: %w", m.ID, queuecore.ErrExists)
		}
		if op.Kind == queuecore.OpUpdate && !exists {
			return nil, fmt.Errorf("update message %d: %w", m.ID, queuecore.ErrNotFound)
		}
		if _, ok := s.queues[m.Queue]; !ok {
			return nil, fmt.Errorf("queue %q: %w", m.Queue, queuecore.ErrNotFound)
		}
		if other, ok := s.names[nameOf(m)]; ok && other != m.ID {
			return nil, fmt.Errorf("name %q in %s: %w", m.Name, m.Queue, queuecore.ErrExists)
		}
		nm := &memMsg{m: m, body: bytes.Clone(op.Body)}
		if exists {
			nm.body = old.body
			delete(s.names, nameOf(old.m))
		}
		s.msgs[m.ID] = nm
		s.names[nameOf(m)] = m.ID
		s.maxID = max(s.maxID, m.ID, m.Seq)
		return func() {
			delete(s.names, nameOf(m))
			if exists {
				s.msgs[m.ID] = old
				s.names[nameOf(old.m)] = m.ID
			} else {
				delete(s.msgs, m.ID)
			}
		}, nil
	case queuecore.OpDelete:
		if !exists {
			return nil, fmt.Errorf("delete message %d: %w", m.ID, queuecore.ErrNotFound)
		}
		delete(s.msgs, m.ID)
		delete(s.names, nameOf(old.m))
		return func() {
			s.msgs[m.ID] = old
			s.names[nameOf(old.m)] = m.ID
		}, nil
	}
	return nil, fmt.Errorf("op kind %d", op.Kind)
}

func (s *memStore) Lookup(_ context.Context, queue, name string, arch bool) (queuecore.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return queuecore.Message{}, errMemClosed
	}
	id, ok := s.names[memName{queue, name, arch}]
	if !ok {
		return queuecore.Message{}, fmt.Errorf("message %q in %s: %w", name, queue, queuecore.ErrNotFound)
	}
	return s.msgs[id].m, nil
}

func (s *memStore) Body(_ context.Context, id uint64) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errMemClosed
	}
	mm, ok := s.msgs[id]
	if !ok {
		return nil, fmt.Errorf("message %d: %w", id, queuecore.ErrNotFound)
	}
	return bytes.Clone(mm.body), nil
}

func (s *memStore) List(_ context.Context, queue string, st queuecore.State, fn func(queuecore.Message) bool) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errMemClosed
	}
	var ms []queuecore.Message
	for _, mm := range s.msgs {
		if mm.m.Queue == queue && mm.m.State == st {
			ms = append(ms, mm.m)
		}
	}
	s.mu.Unlock()
	sortMessages(ms)
	for _, m := range ms {
		if !fn(m) {
			break
		}
	}
	return nil
}

func (s *memStore) timed() []queuecore.Message {
	var ms []queuecore.Message
	for _, mm := range s.msgs {
		if mm.m.State == leased || mm.m.State == delayed {
			ms = append(ms, mm.m)
		}
	}
	slices.SortFunc(ms, func(a, b queuecore.Message) int {
		return cmp.Or(a.Deadline.Compare(b.Deadline), cmp.Compare(a.ID, b.ID))
	})
	return ms
}

func (s *memStore) Due(_ context.Context, t time.Time, limit int) ([]queuecore.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errMemClosed
	}
	var out []queuecore.Message
	for _, m := range s.timed() {
		if m.Deadline.After(t) || len(out) == limit {
			break
		}
		out = append(out, m)
	}
	return out, nil
}

func (s *memStore) NextDue(context.Context) (time.Time, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return time.Time{}, false, errMemClosed
	}
	ms := s.timed()
	if len(ms) == 0 {
		return time.Time{}, false, nil
	}
	return ms[0].Deadline, true, nil
}

func (s *memStore) Counts(context.Context) (map[string]map[queuecore.State]queuecore.Count, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errMemClosed
	}
	out := map[string]map[queuecore.State]queuecore.Count{}
	for _, mm := range s.msgs {
		if out[mm.m.Queue] == nil {
			out[mm.m.Queue] = map[queuecore.State]queuecore.Count{}
		}
		c := out[mm.m.Queue][mm.m.State]
		out[mm.m.Queue][mm.m.State] = queuecore.Count{N: c.N + 1, Bytes: c.Bytes + int64(len(mm.body))}
	}
	return out, nil
}

func (s *memStore) MaxID(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errMemClosed
	}
	return s.maxID, nil
}

func (s *memStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.log.Close()
	if uerr := s.lock.Unlock(); err == nil {
		err = uerr
	}
	return err
}
