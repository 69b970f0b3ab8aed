package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"time"

	"yirangmq/queuecore"
)

// Apply commits ops atomically, sharing the commit with concurrent calls.
// It does not keep ops (nor their bodies) after it returns.
func (s *Store) Apply(_ context.Context, ops []queuecore.Op) error {
	if len(ops) == 0 {
		return nil
	}
	return s.apply(ops)
}

// PutQueue creates a queue or replaces its policy and permissions (its
// creation time stays).
func (s *Store) PutQueue(_ context.Context, q queuecore.QueueInfo) error {
	return s.write(&batch{fn: putQueueFn(q)})
}

// DeleteQueue removes a queue and its messages in one transaction.
func (s *Store) DeleteQueue(_ context.Context, name string) error {
	b := &batch{fn: deleteQueueFn(name)}
	if err := s.write(b); err != nil {
		return err
	}
	s.dropFiles(b)
	return nil
}

// Queues lists every queue by name (byte order).
func (s *Store) Queues(context.Context) ([]queuecore.QueueInfo, error) {
	var qs []queuecore.QueueInfo
	err := s.read(func(r *reader) error {
		rows, err := r.rows(r.queues, 0)
		if err != nil {
			return err
		}
		defer rows.Close()
		dest := r.dest[:6]
		return eachRow(rows, dest, func() (bool, error) {
			var c scanner
			q := queuecore.QueueInfo{
				Name:      c.str(dest[0]),
				Policy:    c.bytes(dest[1]),
				UID:       uint32(c.int(dest[2])),
				GID:       uint32(c.int(dest[3])),
				Mode:      uint32(c.int(dest[4])),
				CreatedAt: fromNanos(c.int(dest[5])),
			}
			if c.err != nil {
				return false, fmt.Errorf("queue %q: %w", q.Name, c.err)
			}
			qs = append(qs, q)
			return true, nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	return qs, nil
}

// Lookup finds a queue's live (or archived) message by name.
func (s *Store) Lookup(_ context.Context, queue, name string, archived bool) (queuecore.Message, error) {
	var m queuecore.Message
	err := s.read(func(r *reader) error {
		r.args[0].Value = queue
		r.args[1].Value = name
		st := r.lookup[0]
		if archived {
			st = r.lookup[1]
		}
		found, err := r.one(st, 2, r.dest)
		if err != nil {
			return err
		}
		if !found {
			return queuecore.ErrNotFound
		}
		m, err = scanMessage(r.dest)
		return err
	})
	if err == queuecore.ErrNotFound {
		return queuecore.Message{}, err // the common miss of a negative LOOKUP: no formatting
	}
	if err != nil {
		where := "live"
		if archived {
			where = "archived"
		}
		return queuecore.Message{}, fmt.Errorf("look up %s message %q in queue %q: %w", where, name, queue, err)
	}
	return m, nil
}

// Body returns the body of message id.
func (s *Store) Body(_ context.Context, id uint64) ([]byte, error) {
	var body []byte
	var inFile bool
	var size int64
	err := s.read(func(r *reader) error {
		r.args[0].Value = int64(id)
		dest := r.dest[:2]
		found, err := r.one(r.body, 1, dest)
		if err != nil {
			return err
		}
		if !found {
			return queuecore.ErrNotFound
		}
		var c scanner
		if dest[0] == nil {
			if dest[1] == nil {
				return errors.New("body is missing from the store")
			}
			inFile, size = true, c.int(dest[1]) // read below
			return c.err
		}
		body = c.bytes(dest[0])
		return c.err
	})
	if err == nil && inFile {
		body, err = s.readFile(id, size)
	}
	if err != nil {
		return nil, fmt.Errorf("body of message %d: %w", id, err)
	}
	return body, nil
}

// List streams a queue's messages in one state by (SortKey, Seq) from the
// messages_order index, one row at a time, in one read transaction: fn
// must not call the store.
func (s *Store) List(_ context.Context, queue string, state queuecore.State, fn func(queuecore.Message) bool) error {
	if !state.Valid() {
		return fmt.Errorf("list %s/%d: invalid state", queue, state)
	}
	err := s.read(func(r *reader) error {
		r.args[0].Value = queue
		rows, err := r.rows(r.list[state], 1)
		if err != nil {
			return err
		}
		defer rows.Close()
		return eachMessage(rows, r.dest, fn)
	})
	if err != nil {
		return fmt.Errorf("list %s/%s: %w", queue, state, err)
	}
	return nil
}

// eachRow reads rows into dest and calls fn for each, until the rows end,
// fn returns false, or an error.
func eachRow(rows driver.Rows, dest []driver.Value, fn func() (bool, error)) error {
	for {
		if err := rows.Next(dest); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		more, err := fn()
		if err != nil || !more {
			return err
		}
	}
}

// eachMessage calls fn with each row until fn returns false.
func eachMessage(rows driver.Rows, dest []driver.Value, fn func(queuecore.Message) bool) error {
	return eachRow(rows, dest, func() (bool, error) {
		m, err := scanMessage(dest)
		if err != nil {
			return false, err
		}
		return fn(m), nil
	})
}

// Due returns up to limit leased or delayed messages due at t, earliest
// first, from the messages_due index.
func (s *Store) Due(_ context.Context, t time.Time, limit int) ([]queuecore.Message, error) {
	if limit <= 0 {
		return nil, nil
	}
	var ms []queuecore.Message
	err := s.read(func(r *reader) error {
		r.args[0].Value = t.UnixNano()
		rows, err := r.rows(r.due, 1)
		if err != nil {
			return err
		}
		defer rows.Close()
		return eachMessage(rows, r.dest, func(m queuecore.Message) bool {
			ms = append(ms, m)
			return len(ms) < limit
		})
	})
	if err != nil {
		return nil, fmt.Errorf("due messages: %w", err)
	}
	return ms, nil
}

// NextDue is the earliest deadline of a leased or delayed message.
func (s *Store) NextDue(context.Context) (time.Time, bool, error) {
	var t time.Time
	var ok bool
	err := s.read(func(r *reader) error {
		dest := r.dest[:1]
		found, err := r.one(r.nextDue, 0, dest)
		if err != nil || !found {
			return err
		}
		var c scanner
		t, ok = fromNanos(c.int(dest[0])), true
		return c.err
	})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("next deadline: %w", err)
	}
	return t, ok, nil
}

// Counts counts messages and bytes per queue and state (a full scan: the
// core calls it once at start). Queues without messages are absent.
func (s *Store) Counts(context.Context) (map[string]map[queuecore.State]queuecore.Count, error) {
	out := map[string]map[queuecore.State]queuecore.Count{}
	err := s.read(func(r *reader) error {
		rows, err := r.rows(r.counts, 0)
		if err != nil {
			return err
		}
		defer rows.Close()
		dest := r.dest[:4]
		return eachRow(rows, dest, func() (bool, error) {
			var c scanner
			q, st := c.str(dest[0]), queuecore.State(c.int(dest[1]))
			n, bytes := c.int(dest[2]), c.int(dest[3])
			if c.err != nil {
				return false, fmt.Errorf("count of %s/%s: %w", q, st, c.err)
			}
			if out[q] == nil {
				out[q] = map[queuecore.State]queuecore.Count{}
			}
			out[q][st] = queuecore.Count{N: n, Bytes: bytes}
			return true, nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("count messages: %w", err)
	}
	return out, nil
}

// MaxID is the largest ID or Seq ever given: the largest in the table or
// the high-water mark the triggers keep for messages that are gone.
func (s *Store) MaxID(context.Context) (uint64, error) {
	var n int64
	err := s.read(func(r *reader) error {
		dest := r.dest[:1]
		found, err := r.one(r.maxID, 0, dest)
		if err != nil {
			return err
		}
		var c scanner
		if found {
			n = c.int(dest[0])
		}
		return c.err
	})
	if err != nil {
		return 0, fmt.Errorf("max id: %w", err)
	}
	return uint64(n), nil
}
