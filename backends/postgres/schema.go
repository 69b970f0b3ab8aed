package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
)

// schemaVersion is yirangmq_meta.version of a database this package writes.
// A larger one was written by a newer yirangmq: refuse it rather than guess.
const schemaVersion = 1

// Advisory lock keys (pg_advisory_lock takes a bigint): "yqschema" and
// "yq-duty" in ASCII. Advisory locks are per database: the duty key of a
// store in another schema than public is mixed with the schema's name
// (storeNames).
const (
	schemaLockKey int64 = 0x7971736368656d61
	dutyLockKey   int64 = 0x79712d6475747900
)

// publicChannel is the LISTEN/NOTIFY channel of change hints of a store in
// schema public; NOTIFY channels too are per database.
const publicChannel = "yirangmq"

// storeNames returns the notification channel and the duty lock key of the
// store whose tables are in schema: several stores can share a database,
// one per schema, each with its own hints and duty.
func storeNames(schema string) (channel string, dutyKey int64) {
	if schema == "public" {
		return publicChannel, dutyLockKey
	}
	h := fnv.New64a()
	h.Write([]byte(schema))
	sum := h.Sum64()
	return fmt.Sprintf("%s_%016x", publicChannel, sum), dutyLockKey ^ int64(sum)
}

// schema creates the tables in a new database. Notes on the choices:
//
//   - Message names and the other strings that come from users (message
//     ID, reason, consumer, dedup key) are bytea: a message name is a
//     POSIX file name, any bytes but '/' and NUL, and a text column
//     rejects invalid UTF-8 (and NUL, which a reason may hold). Queue
//     names are ASCII by rule (queuecore.CheckQueueName) and text.
//   - Times are bigint Unix nanoseconds, 0 for the zero time: exact, and
//     the same numbers as Message.SortKey.
//   - sort_key is Message.SortKey(), so that List reads the index in
//     order: (queue, state, sort_key, seq, id), the ID last for a total
//     order.
//   - Two partial unique indexes make a name unique among a queue's live
//     messages and, apart, among its archived ones; Lookup uses the same
//     predicates.
//   - yirangmq_messages_due holds only leased and delayed messages (the
//     few with a deadline): Due and NextDue are a range scan of it.
//   - rev is the revision that SharedStore checks on update and delete.
//   - yirangmq_meta.next_id is the next ID ReserveIDs hands out. MaxID
//     must not go back when the message holding the largest ID is
//     deleted: the trigger raises next_id past it, to the end of a block
//     of 1024 so that it writes the row once per 1024 IDs at most (in a
//     shared store, where IDs come from ReserveIDs, next_id is already
//     past them and the trigger writes nothing). Seqs are kept the same
//     way only in plain mode (the Store contract of the conformance
//     suite, which sets yirangmq.keep_seq in its transactions): a shared
//     store's Seqs are times in nanoseconds, which would push next_id, and
//     so the IDs and the inode numbers made of them, along with the clock,
//     and write the row at every delete.
//   - yirangmq_missing raises the error of an update or delete that found
//     no row: YQ409 if the message exists (another revision), YQ404 if not.
//     It runs only when the row is missing, so that the common case costs
//     nothing, and it aborts the batch, which runs as one implicit
//     transaction.
const schema = `
CREATE TABLE IF NOT EXISTS yirangmq_meta (
	one     boolean PRIMARY KEY DEFAULT true CHECK (one),
	version integer NOT NULL,
	next_id bigint NOT NULL
);
INSERT INTO yirangmq_meta (one, version, next_id) VALUES (true, 1, 1) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS yirangmq_queues (
	name       text COLLATE "C" PRIMARY KEY,
	policy     bytea NOT NULL,
	uid        bigint NOT NULL,
	gid        bigint NOT NULL,
	mode       bigint NOT NULL,
	created_at bigint NOT NULL
);

CREATE TABLE IF NOT EXISTS yirangmq_messages (
	id             bigint PRIMARY KEY,
	queue          text COLLATE "C" NOT NULL REFERENCES yirangmq_queues (name) ON DELETE CASCADE,
	name           bytea NOT NULL,
	state          smallint NOT NULL,
	sort_key       bigint NOT NULL,
	seq            bigint NOT NULL,
	priority       bigint NOT NULL,
	size           bigint NOT NULL,
	message_id     bytea NOT NULL,
	published_at   bigint NOT NULL,
	first_at       bigint NOT NULL,
	state_at       bigint NOT NULL,
	deadline       bigint NOT NULL,
	attempts       bigint NOT NULL,
	redrives       bigint NOT NULL,
	reason         bytea NOT NULL,
	reason_message bytea NOT NULL,
	failed_at      bigint NOT NULL,
	consumer       bytea NOT NULL,
	dedup_key      bytea NOT NULL,
	uid            bigint NOT NULL,
	gid            bigint NOT NULL,
	rev            bigint NOT NULL,
	body           bytea NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS yirangmq_messages_live_name ON yirangmq_messages (queue, name) WHERE state <> 5;
CREATE UNIQUE INDEX IF NOT EXISTS yirangmq_messages_archived_name ON yirangmq_messages (queue, name) WHERE state = 5;
CREATE INDEX IF NOT EXISTS yirangmq_messages_order ON yirangmq_messages (queue, state, sort_key, seq, id);
CREATE INDEX IF NOT EXISTS yirangmq_messages_due ON yirangmq_messages (deadline, id) WHERE state IN (2, 3);

CREATE OR REPLACE FUNCTION yirangmq_keep_max() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	v bigint := CASE WHEN current_setting('yirangmq.keep_seq', true) = 'on'
		THEN greatest(OLD.id, OLD.seq) ELSE OLD.id END;
BEGIN
	IF v >= (SELECT next_id FROM yirangmq_meta) THEN
		UPDATE yirangmq_meta SET next_id = greatest(next_id, least(v | 1023, 9223372036854775806) + 1);
	END IF;
	RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS yirangmq_messages_delete ON yirangmq_messages;
CREATE TRIGGER yirangmq_messages_delete AFTER DELETE ON yirangmq_messages
	FOR EACH ROW EXECUTE FUNCTION yirangmq_keep_max();
DROP TRIGGER IF EXISTS yirangmq_messages_seq ON yirangmq_messages;
CREATE TRIGGER yirangmq_messages_seq AFTER UPDATE OF seq ON yirangmq_messages
	FOR EACH ROW WHEN (OLD.seq > NEW.seq) EXECUTE FUNCTION yirangmq_keep_max();

CREATE OR REPLACE FUNCTION yirangmq_missing(msg bigint) RETURNS smallint LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM yirangmq_messages WHERE id = msg) THEN
		RAISE EXCEPTION 'message % was changed by another daemon', msg USING ERRCODE = 'YQ409';
	END IF;
	RAISE EXCEPTION 'no message %', msg USING ERRCODE = 'YQ404';
END $$;
`

// The SQLSTATEs that yirangmq_missing raises, and those of PostgreSQL that
// Apply maps to queuecore's errors or retries.
const (
	codeConflict       = "YQ409"
	codeMissing        = "YQ404"
	codeUnique         = "23505"
	codeForeignKey     = "23503"
	codeDeadlock       = "40P01"
	codeSerialization  = "40001"
	codeUndefinedTable = "42P01"
)

// migrate creates the tables unless they are there, under a
// transaction-level advisory lock: two daemons starting at once on a new
// database must not both run CREATE (CREATE ... IF NOT EXISTS still races
// in the catalogs). The tables go to the first schema of the search_path
// that exists (current_schema()), which it returns.
func migrate(ctx context.Context, c *pgx.Conn) (schemaName string, err error) {
	var cur *string
	if err := c.QueryRow(ctx, "SELECT current_schema()").Scan(&cur); err != nil {
		return "", err
	}
	if cur == nil {
		return "", errors.New("no schema of the search_path exists to create the tables in")
	}
	return *cur, migrateTables(ctx, c)
}

func migrateTables(ctx context.Context, c *pgx.Conn) error {
	tx, err := c.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", schemaLockKey); err != nil {
		return fmt.Errorf("take the schema lock: %w", err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_tables
		WHERE schemaname = current_schema() AND tablename = 'yirangmq_meta')`).Scan(&exists); err != nil {
		return err
	}
	if exists {
		var v int
		if err := tx.QueryRow(ctx, "SELECT version FROM yirangmq_meta").Scan(&v); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return errors.New("yirangmq_meta is empty: the schema was damaged by hand")
			}
			return fmt.Errorf("read schema version: %w", err)
		}
		switch {
		case v == schemaVersion:
			return tx.Commit(ctx)
		case v > schemaVersion:
			return fmt.Errorf("schema version %d is newer than this yirangmq supports (%d)", v, schemaVersion)
		}
		return fmt.Errorf("unknown schema version %d", v)
	}
	if _, err := tx.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	return tx.Commit(ctx)
}
