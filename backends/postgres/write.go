package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"yirangmq/queuecore"
)

// The write statements besides the message ones of codec.go. Each that
// changes something announces it in the same statement or batch, hence
// the same transaction: a hint is sent if and only if the change commits.
const (
	sqlPutQueue = `WITH q AS (INSERT INTO yirangmq_queues (name, policy, uid, gid, mode, created_at)
	VALUES ($1, $2, $3, $4, $5, $6)
	ON CONFLICT (name) DO UPDATE SET policy = excluded.policy, uid = excluded.uid,
	gid = excluded.gid, mode = excluded.mode RETURNING 1)
	SELECT pg_notify($7, $8) FROM q`
	// sqlCreateQueue and sqlUpdateQueue return one row when they wrote
	// the queue's row (and notify only then). created_at ($6) is kept by
	// an update.
	sqlCreateQueue = `WITH q AS (INSERT INTO yirangmq_queues (name, policy, uid, gid, mode, created_at)
	VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name) DO NOTHING RETURNING 1)
	SELECT pg_notify($7, $8) FROM q`
	sqlUpdateQueue = `WITH q AS (UPDATE yirangmq_queues SET policy = $2, uid = $3, gid = $4, mode = $5
	WHERE name = $1 AND $6::bigint IS NOT NULL RETURNING 1)
	SELECT pg_notify($7, $8) FROM q`
	// sqlDeleteQueue returns one row if the queue was there, none if not
	// (and then notifies nothing). The messages go with it (ON DELETE
	// CASCADE), in the same transaction.
	sqlDeleteQueue = `WITH d AS (DELETE FROM yirangmq_queues WHERE name = $1 RETURNING 1)
	SELECT pg_notify($2, $3) FROM d`
	// sqlReserve hands out the block [next_id, next_id+n) and never one
	// below an ID in the table (given to Apply by a caller that did not
	// reserve it).
	// keepSeq, added to txSettings, makes the delete trigger of each
	// transaction keep the largest Seq too, for MaxID (plain mode only;
	// see schema.go).
	keepSeq    = `, set_config('yirangmq.keep_seq', 'on', true)`
	sqlReserve = `UPDATE yirangmq_meta SET next_id = greatest(next_id,
	(SELECT coalesce(max(id), 0) + 1 FROM yirangmq_messages)) + $1 RETURNING next_id - $1`
	sqlLeaseSelect = `SELECT ` + msgCols + ` FROM yirangmq_messages
	WHERE queue = $1 AND state = 1 AND name <> ALL($2::bytea[])
	ORDER BY sort_key, seq, id LIMIT 1 FOR UPDATE SKIP LOCKED`
)

// maxAttempts is how many times a write runs when PostgreSQL aborts it for
// a deadlock or it failed before anything reached the server.
const maxAttempts = 3

// Apply commits ops atomically: the statements of all ops and the
// notification go to the server in one round trip (a pgx batch: one
// pipeline ending in one Sync, which PostgreSQL runs as one implicit
// transaction, rolled back whole at the first error). Updates and deletes
// check the revision (see SharedStore). It does not keep ops after it
// returns.
func (s *Store) Apply(ctx context.Context, ops []queuecore.Op) error {
	if len(ops) == 0 {
		return nil
	}
	// Check the ops once, then build the batch anew for every try: pgx
	// keeps what it prepared on the batch's statements, which another
	// connection of the pool does not have.
	for i := range ops {
		if k := ops[i].Kind; k != queuecore.OpInsert && k != queuecore.OpUpdate && k != queuecore.OpDelete {
			return fmt.Errorf("apply: op %d: unknown kind %d", i, k)
		}
	}

	done, err := s.enter()
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	defer done()
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	var failed int
	err = retry(func() error {
		failed, err = execBatch(ctx, s.pool, s.applyBatch(ops))
		return err
	})
	if err != nil && failed < 0 && !pgconn.SafeToRetry(err) && s.committed(ops) {
		// The connection broke after the batch reached the server, and
		// its first insert is there: the batch committed (it is one
		// transaction, and that ID was this daemon's alone).
		s.log.Warn("apply: the answer was lost but the batch committed", queuecore.LogErr, err)
		err = nil
	}
	s.noteOutage(err)
	if err == nil {
		return nil
	}
	err = s.diskFull(err)
	if failed >= 0 {
		failed-- // the batch's first statement is txSettings
	}
	if failed >= 0 && failed < len(ops) {
		return fmt.Errorf("apply: %s: %w", describeOp(&ops[failed]), opError(&ops[failed], err))
	}
	return fmt.Errorf("apply batch of %d ops: %w", len(ops), err)
}

// committed tells, after a batch whose outcome is unknown, whether it
// committed, when it can: only a batch that inserts a message can be told
// (the ID is reserved for it: if that row exists, the batch committed).
// Anything else, or no answer now, is "no".
func (s *Store) committed(ops []queuecore.Op) bool {
	i := slices.IndexFunc(ops, func(op queuecore.Op) bool { return op.Kind == queuecore.OpInsert })
	if i < 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var found bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM yirangmq_messages WHERE id = $1)`, int64(ops[i].Msg.ID)).Scan(&found)
	return err == nil && found
}

// applyBatch is the batch of an Apply: the transaction's settings, its
// statements, in order, then the notification.
func (s *Store) applyBatch(ops []queuecore.Op) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(s.txSettings)
	changes := make([]queuecore.Change, 0, len(ops))
	for i := range ops {
		op := &ops[i]
		m := &op.Msg
		switch op.Kind {
		case queuecore.OpInsert:
			body := op.Body
			if body == nil {
				body = []byte{} // nil would be NULL
			}
			b.Queue(sqlInsert, append(msgArgs(m, 2), int64(m.Rev), body)...)
			changes = append(changes, queuecore.Change{Queue: m.Queue, Name: m.Name, To: m.State})
		case queuecore.OpUpdate:
			check, rev := s.revisions(m.Rev)
			b.Queue(sqlUpdate, append(msgArgs(m, 2), check, rev)...)
			changes = append(changes, queuecore.Change{Queue: m.Queue, Name: m.Name, From: op.From, To: m.State})
		case queuecore.OpDelete:
			check, _ := s.revisions(m.Rev)
			b.Queue(sqlDelete, int64(m.ID), check)
			changes = append(changes, queuecore.Change{Queue: m.Queue, Name: m.Name, From: op.From})
		}
	}
	b.Queue(sqlNotify, s.channel, s.payload(changes))
	return b
}

// revisions returns the revision an update or delete of a message at rev
// checks (nil: none) and the one an update stores.
func (s *Store) revisions(rev uint64) (check any, next int64) {
	if s.plain {
		return nil, int64(rev)
	}
	return int64(rev), int64(rev + 1)
}

// batchRunner is a pool or a connection.
type batchRunner interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

var (
	_ batchRunner = (*pgxpool.Pool)(nil)
	_ batchRunner = (*pgxpool.Conn)(nil)
)

// execBatch runs b and returns the index of the statement that failed
// (-1 if none, or if the batch failed as a whole).
func execBatch(ctx context.Context, r batchRunner, b *pgx.Batch) (int, error) {
	br := r.SendBatch(ctx, b)
	for i := range b.Len() {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				i = -1 // not this statement's fault: the connection, the context
			}
			return i, err
		}
	}
	return -1, br.Close()
}

// retry runs fn again (up to maxAttempts in all) when it fails in a way
// that left nothing done: a deadlock or serialization failure that
// PostgreSQL rolled back, or a failure before anything was sent.
func retry(fn func() error) error {
	var err error
	for range maxAttempts {
		if err = fn(); err == nil || !retryable(err) {
			return err
		}
	}
	return err
}

func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == codeDeadlock || pgErr.Code == codeSerialization
	}
	return pgconn.SafeToRetry(err)
}

// opError maps the error of the statement of op to the sentinel of the
// Store contract, keeping the server's error when there is one to tell.
func opError(op *queuecore.Op, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case codeConflict:
		return fmt.Errorf("revision %d: %w", op.Msg.Rev, queuecore.ErrConflict)
	case codeMissing:
		return queuecore.ErrNotFound
	case codeForeignKey:
		return fmt.Errorf("queue %q: %w", op.Msg.Queue, queuecore.ErrNotFound)
	case codeUnique:
		switch pgErr.ConstraintName {
		case "yirangmq_messages_pkey":
			return fmt.Errorf("ID %d is taken: %w", op.Msg.ID, queuecore.ErrExists)
		case "yirangmq_messages_live_name":
			return fmt.Errorf("a live message of queue %q is named %q: %w", op.Msg.Queue, op.Msg.Name, queuecore.ErrExists)
		case "yirangmq_messages_archived_name":
			return fmt.Errorf("an archived message of queue %q is named %q: %w", op.Msg.Queue, op.Msg.Name, queuecore.ErrExists)
		}
		return fmt.Errorf("%w: %w", queuecore.ErrExists, err)
	}
	return err
}

// describeOp says what op does, for error messages.
func describeOp(op *queuecore.Op) string {
	m := &op.Msg
	switch op.Kind {
	case queuecore.OpInsert:
		return fmt.Sprintf("insert message %d (%s/%s/%q)", m.ID, m.Queue, m.State, m.Name)
	case queuecore.OpUpdate:
		return fmt.Sprintf("update message %d to %s/%s/%q", m.ID, m.Queue, m.State, m.Name)
	case queuecore.OpDelete:
		return fmt.Sprintf("delete message %d", m.ID)
	}
	return fmt.Sprintf("op kind %d", op.Kind)
}

// PutQueue creates a queue or replaces its policy and permissions (its
// creation time stays).
func (s *Store) PutQueue(ctx context.Context, q queuecore.QueueInfo) error {
	return s.queueExec(ctx, "put", q.Name, nil, sqlPutQueue, queueArgs(q)...)
}

// CreateQueue creates a queue that must not exist yet (ErrExists).
func (s *Store) CreateQueue(ctx context.Context, q queuecore.QueueInfo) error {
	return s.queueExec(ctx, "create", q.Name, queuecore.ErrExists, sqlCreateQueue, queueArgs(q)...)
}

// UpdateQueue replaces the policy and permissions of an existing queue
// (ErrNotFound when there is none).
func (s *Store) UpdateQueue(ctx context.Context, q queuecore.QueueInfo) error {
	return s.queueExec(ctx, "update", q.Name, queuecore.ErrNotFound, sqlUpdateQueue, queueArgs(q)...)
}

// DeleteQueue removes a queue and its messages in one transaction.
func (s *Store) DeleteQueue(ctx context.Context, name string) error {
	return s.queueExec(ctx, "delete", name, queuecore.ErrNotFound, sqlDeleteQueue, name)
}

// queueArgs are the arguments $1 to $6 of the queue statements.
func queueArgs(q queuecore.QueueInfo) []any {
	policy := q.Policy
	if policy == nil {
		policy = []byte{} // nil would be NULL
	}
	return []any{q.Name, policy, int64(q.UID), int64(q.GID), int64(q.Mode), nanos(q.CreatedAt)}
}

// queueExec runs sql, a statement on one queue's row that returns a row
// (and notifies the other daemons) only when it wrote, with args followed
// by the notification's channel and payload. none, when not nil, is the
// error when it wrote nothing.
func (s *Store) queueExec(ctx context.Context, what, name string, none error, sql string, args ...any) error {
	done, err := s.enter()
	if err != nil {
		return fmt.Errorf("%s queue %q: %w", what, name, err)
	}
	defer done()
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	args = append(args, s.channel, s.payload([]queuecore.Change{{Queue: name}}))
	var tag pgconn.CommandTag
	err = retry(func() (err error) {
		b := &pgx.Batch{}
		b.Queue(s.txSettings)
		b.Queue(sql, args...)
		br := s.pool.SendBatch(ctx, b)
		if _, err = br.Exec(); err == nil {
			tag, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	s.noteOutage(err)
	err = s.diskFull(err)
	if err == nil && none != nil && tag.RowsAffected() == 0 {
		err = none
	}
	if err != nil {
		return fmt.Errorf("%s queue %q: %w", what, name, err)
	}
	return nil
}

// DeleteEmptyQueue removes a queue that holds no message. The queue's row
// is locked first (FOR UPDATE, which waits for, and then blocks, the
// inserts of other daemons: their foreign key check takes a KEY SHARE
// lock on it), then the emptiness check runs on a snapshot taken after
// that lock: a publish committed before it is seen (ErrNotEmpty), one
// after it finds the queue gone (ErrNotFound).
func (s *Store) DeleteEmptyQueue(ctx context.Context, name string) error {
	done, err := s.enter()
	if err != nil {
		return fmt.Errorf("delete queue %q: %w", name, err)
	}
	defer done()
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	payload := s.payload([]queuecore.Change{{Queue: name}})
	err = retry(func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, s.txSettings); err != nil {
				return err
			}
			var one int
			if err := tx.QueryRow(ctx, `SELECT 1 FROM yirangmq_queues WHERE name = $1 FOR UPDATE`, name).Scan(&one); errors.Is(err, pgx.ErrNoRows) {
				return queuecore.ErrNotFound
			} else if err != nil {
				return err
			}
			var busy bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM yirangmq_messages WHERE queue = $1)`, name).Scan(&busy); err != nil {
				return err
			}
			if busy {
				return queuecore.ErrNotEmpty
			}
			_, err := tx.Exec(ctx, sqlDeleteQueue, name, s.channel, payload)
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("delete queue %q: %w", name, err)
	}
	return nil
}

// ReserveIDs returns the first of n consecutive IDs that no other Store on
// this database will hand out, and that are above every ID in the table.
// It is one UPDATE of one row: concurrent calls queue on its lock.
func (s *Store) ReserveIDs(ctx context.Context, n int) (uint64, error) {
	if n <= 0 {
		return 0, fmt.Errorf("reserve %d IDs: the count must be positive", n)
	}
	done, err := s.enter()
	if err != nil {
		return 0, fmt.Errorf("reserve %d IDs: %w", n, err)
	}
	defer done()
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	var first int64
	err = retry(func() error {
		b := &pgx.Batch{}
		b.Queue(s.txSettings)
		b.Queue(sqlReserve, int64(n))
		br := s.pool.SendBatch(ctx, b)
		_, err := br.Exec()
		if err == nil {
			err = br.QueryRow().Scan(&first)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("reserve %d IDs: %w", n, err)
	}
	return uint64(first), nil
}

// LeaseNext takes the first ready message of queue not named in skip and
// not locked by another transaction, and stores change(m) in its place,
// in one transaction of two round trips: BEGIN and the SELECT ... FOR
// UPDATE SKIP LOCKED, then the update, the notification and COMMIT.
// change runs while the row is locked, so it must be quick; it is called
// at most once.
func (s *Store) LeaseNext(ctx context.Context, queue string, skip []string, change func(queuecore.Message) queuecore.Message) (queuecore.Message, error) {
	done, err := s.enter()
	if err != nil {
		return queuecore.Message{}, fmt.Errorf("lease next of %s: %w", queue, err)
	}
	defer done()
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	names := make([][]byte, len(skip)) // never nil: a NULL array would match nothing
	for i, n := range skip {
		names[i] = []byte(n)
	}
	var (
		m       queuecore.Message
		changed bool // change was called: do not retry
	)
	err = retry(func() error {
		var err error
		m, changed, err = s.leaseOnce(ctx, queue, names, change)
		if changed && err != nil {
			// Not retryable past this point: change must not run twice.
			return &noRetry{err}
		}
		return err
	})
	var nr *noRetry
	if errors.As(err, &nr) {
		err = nr.err
	}
	s.noteOutage(err)
	if err != nil {
		err = s.diskFull(err)
		return queuecore.Message{}, fmt.Errorf("lease next of %s: %w", queue, err)
	}
	return m, nil
}

// noRetry stops retry.
type noRetry struct{ err error }

func (e *noRetry) Error() string { return e.err.Error() }

// leaseOnce is one try of LeaseNext. changed reports whether change was
// called.
func (s *Store) leaseOnce(ctx context.Context, queue string, skip [][]byte, change func(queuecore.Message) queuecore.Message) (_ queuecore.Message, changed bool, _ error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return queuecore.Message{}, false, err
	}
	// A connection left in a transaction (by an error, or by a panic in
	// change) is closed by the pool on release, which rolls it back.
	defer c.Release()

	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(s.txSettings)
	b.Queue(sqlLeaseSelect, queue, skip)
	br := c.SendBatch(ctx, b)
	var ms []queuecore.Message
	if _, err = br.Exec(); err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			ms, err = collect(rows)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		rollback(c)
		return queuecore.Message{}, false, err
	}
	if len(ms) == 0 {
		rollback(c)
		return queuecore.Message{}, false, queuecore.ErrEmpty
	}
	old := ms[0]
	m := change(old)
	if m.ID != old.ID {
		rollback(c)
		return queuecore.Message{}, true, fmt.Errorf("change turned message %d into message %d", old.ID, m.ID)
	}
	check, rev := s.revisions(m.Rev)
	changes := []queuecore.Change{{Queue: m.Queue, Name: m.Name, From: old.State, To: m.State}}
	if m.Queue != old.Queue || m.Name != old.Name {
		changes = []queuecore.Change{{Queue: old.Queue, Name: old.Name, From: old.State}, {Queue: m.Queue, Name: m.Name, To: m.State}}
	}
	b = &pgx.Batch{}
	b.Queue(sqlUpdate, append(msgArgs(&m, 2), check, rev)...)
	b.Queue(sqlNotify, s.channel, s.payload(changes))
	b.Queue("COMMIT")
	failed, err := execBatch(ctx, c, b)
	if err != nil {
		rollback(c)
		if failed == 0 {
			op := queuecore.Op{Kind: queuecore.OpUpdate, Msg: m, From: old.State}
			err = fmt.Errorf("%s: %w", describeOp(&op), opError(&op, err))
		}
		return queuecore.Message{}, true, err
	}
	m.Rev = uint64(rev)
	return m, true, nil
}

// rollback ends the transaction open on c, if any. A connection where it
// fails stays in its transaction, and pgxpool closes it when it is
// released, in the background (the server then rolls back).
func rollback(c *pgxpool.Conn) {
	if c.Conn().PgConn().TxStatus() == 'I' || c.Conn().IsClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = c.Exec(ctx, "ROLLBACK")
}
