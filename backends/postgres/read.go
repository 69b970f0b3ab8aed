package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"yirangmq/queuecore"
)

// The read statements.
const (
	sqlQueues     = `SELECT name, policy, uid, gid, mode, created_at FROM yirangmq_queues ORDER BY name`
	sqlLookupLive = `SELECT ` + msgCols + ` FROM yirangmq_messages WHERE queue = $1 AND name = $2 AND state <> 5`
	sqlLookupArch = `SELECT ` + msgCols + ` FROM yirangmq_messages WHERE queue = $1 AND name = $2 AND state = 5`
	sqlBody       = `SELECT body FROM yirangmq_messages WHERE id = $1`
	// sqlList reads the first chunk of a List, sqlListAfter the next
	// ones, after the message at ($3, $4, $5) = (sort_key, seq, id): one
	// range of the order index each (two statements, so that each keeps
	// one plan that uses the index for its range).
	sqlList = `SELECT ` + msgCols + ` FROM yirangmq_messages WHERE queue = $1 AND state = $2
	ORDER BY sort_key, seq, id LIMIT $3`
	sqlListAfter = `SELECT ` + msgCols + ` FROM yirangmq_messages WHERE queue = $1 AND state = $2
	AND (sort_key, seq, id) > ($3, $4, $5) ORDER BY sort_key, seq, id LIMIT $6`
	sqlDue = `SELECT ` + msgCols + ` FROM yirangmq_messages WHERE state IN (2, 3) AND deadline <= $1
	ORDER BY deadline, id LIMIT $2`
	sqlNextDue = `SELECT deadline FROM yirangmq_messages WHERE state IN (2, 3) ORDER BY deadline LIMIT 1`
	sqlCounts  = `SELECT queue, state, count(*), coalesce(sum(size), 0)::bigint FROM yirangmq_messages GROUP BY queue, state`
	// next_id - 1 covers every ID reserved and every ID or Seq of a
	// deleted message (the trigger); the others are in the table.
	sqlMaxID = `SELECT greatest((SELECT next_id - 1 FROM yirangmq_meta),
	(SELECT coalesce(max(id), 0) FROM yirangmq_messages),
	(SELECT coalesce(max(seq), 0) FROM yirangmq_messages))`
)

// Queues lists every queue by name (byte order).
func (s *Store) Queues(ctx context.Context) ([]queuecore.QueueInfo, error) {
	done, err := s.enter()
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	defer done()
	ctx, cancel := readCtx(ctx, callTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, sqlQueues)
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	defer rows.Close()
	var qs []queuecore.QueueInfo
	for rows.Next() {
		var (
			q                      queuecore.QueueInfo
			uid, gid, mode, nanosT int64
		)
		if err := rows.Scan(&q.Name, &q.Policy, &uid, &gid, &mode, &nanosT); err != nil {
			return nil, fmt.Errorf("list queues: read queue %q: %w", q.Name, err)
		}
		if q.Policy == nil {
			q.Policy = []byte{}
		}
		q.UID, q.GID, q.Mode, q.CreatedAt = uint32(uid), uint32(gid), uint32(mode), fromNanos(nanosT)
		qs = append(qs, q)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	return qs, nil
}

// Lookup finds a queue's live (or archived) message by name.
func (s *Store) Lookup(ctx context.Context, queue, name string, archived bool) (queuecore.Message, error) {
	m, err := s.lookup(ctx, queue, name, archived)
	s.noteOutage(err)
	if err != nil {
		where := "live"
		if archived {
			where = "archived"
		}
		return queuecore.Message{}, fmt.Errorf("look up %s message %q in queue %q: %w", where, name, queue, err)
	}
	return m, nil
}

func (s *Store) lookup(ctx context.Context, queue, name string, archived bool) (queuecore.Message, error) {
	done, err := s.enter()
	if err != nil {
		return queuecore.Message{}, err
	}
	defer done()
	ctx, cancel := readCtx(ctx, callTimeout)
	defer cancel()
	q := sqlLookupLive
	if archived {
		q = sqlLookupArch
	}
	rows, err := s.pool.Query(ctx, q, queue, []byte(name))
	if err != nil {
		return queuecore.Message{}, err
	}
	ms, err := collect(rows)
	if err != nil {
		return queuecore.Message{}, err
	}
	if len(ms) == 0 {
		return queuecore.Message{}, queuecore.ErrNotFound
	}
	return ms[0], nil
}

// Body returns the body of message id.
func (s *Store) Body(ctx context.Context, id uint64) ([]byte, error) {
	done, err := s.enter()
	if err != nil {
		return nil, fmt.Errorf("body of message %d: %w", id, err)
	}
	defer done()
	ctx, cancel := readCtx(ctx, callTimeout)
	defer cancel()
	var b []byte
	err = s.pool.QueryRow(ctx, sqlBody, int64(id)).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		err = queuecore.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("body of message %d: %w", id, err)
	}
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

// List chunk sizes: the core's lease mostly wants the first ready message,
// a listing of a directory all of them.
const (
	listFirstChunk = 32
	listChunk      = 512
)

// List calls fn with a queue's messages in one state by (SortKey, Seq),
// then ID. It reads them in chunks, each one query on the order index
// (keyset pagination), and calls fn between queries, holding no
// connection: a List that fn stops early reads little, and a long one
// does not hold a connection while fn works. Across chunks the list is not
// one snapshot: a message that a commit moved in between can be missed or
// given twice, as in a readdir of a directory that changes. The order
// holds throughout.
func (s *Store) List(ctx context.Context, queue string, state queuecore.State, fn func(queuecore.Message) bool) error {
	if !state.Valid() {
		return fmt.Errorf("list %s/%d: invalid state", queue, state)
	}
	var last *queuecore.Message
	limit := listFirstChunk
	for {
		ms, err := s.listChunk(ctx, queue, state, last, limit)
		s.noteOutage(err)
		if err != nil {
			return fmt.Errorf("list %s/%s: %w", queue, state, err)
		}
		for i := range ms {
			if !fn(ms[i]) {
				return nil
			}
		}
		if len(ms) < limit {
			return nil
		}
		last, limit = &ms[len(ms)-1], listChunk
	}
}

func (s *Store) listChunk(ctx context.Context, queue string, state queuecore.State, after *queuecore.Message, limit int) ([]queuecore.Message, error) {
	done, err := s.enter()
	if err != nil {
		return nil, err
	}
	defer done()
	ctx, cancel := readCtx(ctx, callTimeout)
	defer cancel()
	var rows pgx.Rows
	if after == nil {
		rows, err = s.pool.Query(ctx, sqlList, queue, int16(state), limit)
	} else {
		rows, err = s.pool.Query(ctx, sqlListAfter, queue, int16(state), after.SortKey(), int64(after.Seq), int64(after.ID), limit)
	}
	if err != nil {
		return nil, err
	}
	return collect(rows)
}

// Due returns up to limit leased or delayed messages due at t, earliest
// first (then by ID).
func (s *Store) Due(ctx context.Context, t time.Time, limit int) ([]queuecore.Message, error) {
	if limit <= 0 {
		return nil, nil
	}
	done, err := s.enter()
	if err != nil {
		return nil, fmt.Errorf("due messages: %w", err)
	}
	defer done()
	ctx, cancel := readCtx(ctx, callTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, sqlDue, nanos(t), limit)
	if err != nil {
		return nil, fmt.Errorf("due messages: %w", err)
	}
	ms, err := collect(rows)
	if err != nil {
		return nil, fmt.Errorf("due messages: %w", err)
	}
	return ms, nil
}

// NextDue is the earliest deadline of a leased or delayed message.
func (s *Store) NextDue(ctx context.Context) (time.Time, bool, error) {
	done, err := s.enter()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("next deadline: %w", err)
	}
	defer done()
	ctx, cancel := readCtx(ctx, callTimeout)
	defer cancel()
	var n int64
	err = s.pool.QueryRow(ctx, sqlNextDue).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("next deadline: %w", err)
	}
	return fromNanos(n), true, nil
}

// Counts counts messages and bytes per queue and state (a full scan: the
// core calls it once at start). Queues without messages are absent.
func (s *Store) Counts(ctx context.Context) (map[string]map[queuecore.State]queuecore.Count, error) {
	done, err := s.enter()
	if err != nil {
		return nil, fmt.Errorf("count messages: %w", err)
	}
	defer done()
	ctx, cancel := readCtx(ctx, scanTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, sqlCounts)
	if err != nil {
		return nil, fmt.Errorf("count messages: %w", err)
	}
	defer rows.Close()
	out := map[string]map[queuecore.State]queuecore.Count{}
	for rows.Next() {
		var (
			q     string
			st    int16
			n, sz int64
		)
		if err := rows.Scan(&q, &st, &n, &sz); err != nil {
			return nil, fmt.Errorf("count messages: %w", err)
		}
		if out[q] == nil {
			out[q] = map[queuecore.State]queuecore.Count{}
		}
		out[q][queuecore.State(st)] = queuecore.Count{N: n, Bytes: sz}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count messages: %w", err)
	}
	return out, nil
}

// MaxID is the largest ID or Seq ever given or reserved. max(seq) has no
// index of its own (it would cost a write per publish): the core reads
// MaxID once at start, and a shared core takes its IDs from ReserveIDs.
func (s *Store) MaxID(ctx context.Context) (uint64, error) {
	done, err := s.enter()
	if err != nil {
		return 0, fmt.Errorf("max id: %w", err)
	}
	defer done()
	ctx, cancel := readCtx(ctx, scanTimeout)
	defer cancel()
	var n int64
	if err := s.pool.QueryRow(ctx, sqlMaxID).Scan(&n); err != nil {
		return 0, fmt.Errorf("max id: %w", err)
	}
	return uint64(n), nil
}
