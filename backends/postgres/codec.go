package postgres

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// Times are stored as backends.Nanos keeps them.

func nanos(t time.Time) int64 { return backends.Nanos(t) }

func fromNanos(n int64) time.Time { return backends.FromNanos(n) }

// msgCols are the columns scanMessage reads, in order.
const msgCols = `id, queue, name, state, seq, priority, size, message_id,
	published_at, first_at, state_at, deadline, attempts, redrives, reason,
	reason_message, failed_at, consumer, dedup_key, uid, gid, rev`

// The message statements. IDs, Seqs and revisions are uint64 kept in
// bigint: they round-trip, and order right below 2^63.
const (
	sqlInsert = `INSERT INTO yirangmq_messages (id, queue, name, state, sort_key, seq,
	priority, size, message_id, published_at, first_at, state_at, deadline,
	attempts, redrives, reason, reason_message, failed_at, consumer, dedup_key,
	uid, gid, rev, body) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
	$12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24)`
	// sqlUpdate returns no row when it applies. $23 is the revision to
	// check (NULL: none), $24 the one to store.
	sqlUpdate = `WITH u AS (UPDATE yirangmq_messages SET queue = $2, name = $3,
	state = $4, sort_key = $5, seq = $6, priority = $7, size = $8,
	message_id = $9, published_at = $10, first_at = $11, state_at = $12,
	deadline = $13, attempts = $14, redrives = $15, reason = $16,
	reason_message = $17, failed_at = $18, consumer = $19, dedup_key = $20,
	uid = $21, gid = $22, rev = $24
	WHERE id = $1 AND ($23::bigint IS NULL OR rev = $23) RETURNING 1)
	SELECT yirangmq_missing($1) WHERE NOT EXISTS (SELECT FROM u)`
	sqlDelete = `WITH d AS (DELETE FROM yirangmq_messages
	WHERE id = $1 AND ($2::bigint IS NULL OR rev = $2) RETURNING 1)
	SELECT yirangmq_missing($1) WHERE NOT EXISTS (SELECT FROM d)`
	sqlNotify = `SELECT pg_notify($1, $2)`
)

// msgArgs are the arguments $1 to $22 of sqlInsert and sqlUpdate.
func msgArgs(m *queuecore.Message, extra int) []any {
	args := make([]any, 22, 22+extra)
	args[0] = int64(m.ID)
	args[1] = m.Queue
	args[2] = []byte(m.Name)
	args[3] = int16(m.State)
	args[4] = m.SortKey()
	args[5] = int64(m.Seq)
	args[6] = int64(m.Priority)
	args[7] = m.Size
	args[8] = []byte(m.MessageID)
	args[9] = nanos(m.PublishedAt)
	args[10] = nanos(m.FirstAt)
	args[11] = nanos(m.StateAt)
	args[12] = nanos(m.Deadline)
	args[13] = int64(m.Attempts)
	args[14] = int64(m.Redrives)
	args[15] = []byte(m.Reason)
	args[16] = []byte(m.ReasonMessage)
	args[17] = nanos(m.FailedAt)
	args[18] = []byte(m.Consumer)
	args[19] = []byte(m.DedupKey)
	args[20] = int64(m.UID)
	args[21] = int64(m.GID)
	return args
}

// msgRow holds the scan destinations of msgCols. The bytea columns are
// scanned without a copy (valid until the next row) and copied once, into
// the strings of the message.
type msgRow struct {
	id, seq, priority, size                                int64
	published, first, stateAt, deadline, failed            int64
	attempts, redrives, uid, gid, rev                      int64
	state                                                  int16
	queue                                                  string
	name, messageID, reason, reasonMsg, consumer, dedupKey pgtype.DriverBytes
	dest                                                   []any
}

func newMsgRow() *msgRow {
	r := &msgRow{}
	r.dest = []any{&r.id, &r.queue, &r.name, &r.state, &r.seq, &r.priority, &r.size, &r.messageID,
		&r.published, &r.first, &r.stateAt, &r.deadline, &r.attempts, &r.redrives, &r.reason,
		&r.reasonMsg, &r.failed, &r.consumer, &r.dedupKey, &r.uid, &r.gid, &r.rev}
	return r
}

// scan reads the current row of rows (a query of msgCols).
func (r *msgRow) scan(rows pgx.Rows) (queuecore.Message, error) {
	if err := rows.Scan(r.dest...); err != nil {
		return queuecore.Message{}, fmt.Errorf("read message: %w", err)
	}
	return queuecore.Message{
		ID:            uint64(r.id),
		Queue:         r.queue,
		Name:          string(r.name),
		State:         queuecore.State(r.state),
		Seq:           uint64(r.seq),
		Priority:      int(r.priority),
		Size:          r.size,
		MessageID:     string(r.messageID),
		PublishedAt:   fromNanos(r.published),
		FirstAt:       fromNanos(r.first),
		StateAt:       fromNanos(r.stateAt),
		Deadline:      fromNanos(r.deadline),
		Attempts:      int(r.attempts),
		Redrives:      int(r.redrives),
		Reason:        string(r.reason),
		ReasonMessage: string(r.reasonMsg),
		FailedAt:      fromNanos(r.failed),
		Consumer:      string(r.consumer),
		DedupKey:      string(r.dedupKey),
		UID:           uint32(r.uid),
		GID:           uint32(r.gid),
		Rev:           uint64(r.rev),
	}, nil
}

// collect reads every row of rows (a query of msgCols) and closes them.
func collect(rows pgx.Rows) ([]queuecore.Message, error) {
	defer rows.Close()
	var ms []queuecore.Message
	r := newMsgRow()
	for rows.Next() {
		m, err := r.scan(rows)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, rows.Err()
}
