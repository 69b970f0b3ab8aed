package sqlite

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"github.com/mattn/go-sqlite3"

	"yirangmq/queuecore"
)

// schemaVersion is PRAGMA user_version of a store this package writes. A
// store with a larger version was written by a newer yirangmq: refuse it
// rather than guess.
//
// Version 2 added the files table (bodies kept in files, files.go). A
// version 1 store is upgraded in place when it is opened; an older
// yirangmq then refuses it, as it could not read those bodies.
const schemaVersion = 2

// schema creates a new store. Notes on the choices:
//
//   - messages.id is the rowid (INTEGER PRIMARY KEY), so a lookup by ID is
//     one B-tree search and the table needs no separate key index.
//   - A body of up to inlineBody bytes is the last column of its message's
//     row: one B-tree insert per publish, and SQLite reads a record's
//     columns in order, so metadata reads stop before the body. A larger
//     body goes to the bodies table (and messages.body is NULL): SQLite
//     rewrites a whole record, overflow pages included, whenever an update
//     changes its size, so a 256 KiB body kept in the row would be
//     written again at every lease, nack and ack. The trigger
//     messages_body_delete deletes it with its message (and so with its
//     queue). A body of fileBodies bytes or more is in a file of its own
//     instead (files.go): messages.body is NULL, bodies has no row, and
//     files has the message's ID.
//   - messages_name makes a name unique among a queue's live messages
//     (state=5 is 0) and separately among its archived ones (state=5 is 1);
//     Lookup uses it with the same expression.
//   - messages_order is the List order: (SortKey, Seq) within a queue and
//     state, read in index order without a sort.
//   - messages_due holds leased and delayed messages only (the few that
//     have a deadline), so Due and NextDue cost O(log n) whatever the size
//     of the inbox.
//   - meta.hwm remembers the largest ID or Seq of a message that is gone:
//     MaxID must never go back, and a deleted message takes its ID out of
//     the table. The triggers raise it in the transaction that deletes a
//     message holding a value above it (or lowers such a Seq), and raise
//     it to the end of a block of 1024, so that it costs a page write once
//     per 1024 IDs, not at every ack of the newest message. MaxID may thus
//     exceed the largest ID ever given by up to 1023: the core only needs
//     it not to be smaller.
const schema = `
CREATE TABLE queues (
	name       TEXT PRIMARY KEY,
	policy     BLOB NOT NULL,
	uid        INTEGER NOT NULL,
	gid        INTEGER NOT NULL,
	mode       INTEGER NOT NULL,
	created_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE messages (
	id             INTEGER PRIMARY KEY,
	queue          TEXT NOT NULL REFERENCES queues (name) ON DELETE CASCADE,
	name           TEXT NOT NULL,
	state          INTEGER NOT NULL,
	sk             INTEGER NOT NULL,
	seq            INTEGER NOT NULL,
	priority       INTEGER NOT NULL,
	size           INTEGER NOT NULL,
	message_id     TEXT NOT NULL,
	published_at   INTEGER NOT NULL,
	first_at       INTEGER NOT NULL,
	state_at       INTEGER NOT NULL,
	deadline       INTEGER NOT NULL,
	attempts       INTEGER NOT NULL,
	redrives       INTEGER NOT NULL,
	reason         TEXT NOT NULL,
	reason_message TEXT NOT NULL,
	failed_at      INTEGER NOT NULL,
	consumer       TEXT NOT NULL,
	dedup_key      TEXT NOT NULL,
	uid            INTEGER NOT NULL,
	gid            INTEGER NOT NULL,
	body           BLOB -- NULL: in bodies
);

CREATE TABLE bodies (
	id   INTEGER PRIMARY KEY,
	body BLOB NOT NULL
);

CREATE TRIGGER messages_body_delete AFTER DELETE ON messages
WHEN old.body IS NULL
BEGIN
	DELETE FROM bodies WHERE id = old.id;
END;
` + schemaFiles + `
CREATE UNIQUE INDEX messages_name ON messages (queue, state = 5, name);
CREATE INDEX messages_order ON messages (queue, state, sk, seq);
CREATE INDEX messages_due ON messages (sk) WHERE state IN (2, 3);

CREATE TABLE meta (
	one INTEGER PRIMARY KEY CHECK (one = 1),
	hwm INTEGER NOT NULL
);
INSERT INTO meta (one, hwm) VALUES (1, 0);

CREATE TRIGGER messages_hwm_delete AFTER DELETE ON messages
WHEN max(old.id, old.seq) > (SELECT hwm FROM meta WHERE one = 1)
BEGIN
	UPDATE meta SET hwm = max(old.id, old.seq) | 1023 WHERE one = 1;
END;

CREATE TRIGGER messages_hwm_update AFTER UPDATE OF seq ON messages
WHEN old.seq > new.seq AND old.seq > (SELECT hwm FROM meta WHERE one = 1)
BEGIN
	UPDATE meta SET hwm = old.seq | 1023 WHERE one = 1;
END;
`

// schemaFiles is what version 2 added to version 1: the IDs of the
// messages whose body is in a file (files.go) and the files' sizes,
// forgotten with their message.
const schemaFiles = `
CREATE TABLE files (
	id   INTEGER PRIMARY KEY,
	size INTEGER NOT NULL -- of the file, checked at every open
);

CREATE TRIGGER messages_file_delete AFTER DELETE ON messages
WHEN old.body IS NULL
BEGIN
	DELETE FROM files WHERE id = old.id;
END;
`

// inlineBody is the largest body kept in its message's row. Rows of up to
// some 1.3 KiB stay below SQLite's overflow threshold (some 2 KiB with the
// store's 2 KiB pages, defaultPageSize); small messages, the common case,
// still share a page for List.
const inlineBody = 1024

// msgCols are the metadata columns in the order scanMessage reads them and
// the insert and update statements bind them (?1 to ?22; the body is ?23).
const msgCols = `id, queue, name, state, sk, seq, priority, size, message_id,
	published_at, first_at, state_at, deadline, attempts, redrives, reason,
	reason_message, failed_at, consumer, dedup_key, uid, gid`

const nMsgCols = 22

// The statements of the writer connection.
const (
	sqlInsert = `INSERT INTO messages (` + msgCols + `, body) VALUES
	(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
	 ?17, ?18, ?19, ?20, ?21, ?22, ?23)`
	sqlUpdate = `UPDATE messages SET queue = ?2, name = ?3, state = ?4, sk = ?5,
	seq = ?6, priority = ?7, size = ?8, message_id = ?9, published_at = ?10,
	first_at = ?11, state_at = ?12, deadline = ?13, attempts = ?14,
	redrives = ?15, reason = ?16, reason_message = ?17, failed_at = ?18,
	consumer = ?19, dedup_key = ?20, uid = ?21, gid = ?22 WHERE id = ?1`
	sqlInsertBody = `INSERT INTO bodies (id, body) VALUES (?1, ?2)`
	sqlInsertFile = `INSERT INTO files (id, size) VALUES (?1, ?2)`
	sqlFileOf     = `SELECT id FROM files WHERE id = ?1`
	sqlQueueFiles = `SELECT f.id FROM files f JOIN messages m ON m.id = f.id WHERE m.queue = ?1`
	sqlDelete     = `DELETE FROM messages WHERE id = ?1`
	sqlPutQueue   = `INSERT INTO queues (name, policy, uid, gid, mode, created_at)
	VALUES (?1, ?2, ?3, ?4, ?5, ?6)
	ON CONFLICT (name) DO UPDATE SET policy = excluded.policy,
	uid = excluded.uid, gid = excluded.gid, mode = excluded.mode`
	sqlDeleteQueue = `DELETE FROM queues WHERE name = ?1`
)

// The read statements, prepared on database/sql's pool of readers.
const (
	sqlQueues = `SELECT name, policy, uid, gid, mode, created_at FROM queues ORDER BY name`
	// The subquery runs only for a body kept apart (coalesce stops at the
	// first non-NULL argument).
	// NULL with no row in bodies: the body is in a file (files.go).
	sqlBody = `SELECT coalesce(m.body, (SELECT b.body FROM bodies b WHERE b.id = m.id)),
	CASE WHEN m.body IS NULL THEN (SELECT f.size FROM files f WHERE f.id = m.id) END
	FROM messages m WHERE m.id = ?1`
	sqlSize = `SELECT size FROM files WHERE id = ?1`
	// No LIMIT ?: SQLite plans with the bound value of a LIMIT, so it
	// would prepare the statement again at every call. Due stops reading
	// at its limit instead.
	sqlDue = `SELECT ` + msgCols + ` FROM messages
	WHERE state IN (2, 3) AND sk <= ?1 ORDER BY sk`
	sqlNextDue = `SELECT deadline FROM messages WHERE state IN (2, 3) ORDER BY sk LIMIT 1`
	sqlCounts  = `SELECT queue, state, count(*), sum(size) FROM messages GROUP BY queue, state`
	// max(seq) has no index of its own (it would cost a write per publish):
	// it scans messages_order, which is narrow. MaxID is read once at start.
	sqlMaxID = `SELECT max(
	(SELECT hwm FROM meta WHERE one = 1),
	coalesce((SELECT max(id) FROM messages), 0),
	coalesce((SELECT max(seq) FROM messages), 0))`
)

// sqlLookup finds a live message (archived 0) or an archived one (1) by
// name. (state = 5) is the expression of messages_name, so a lookup is one
// index search and one row fetch.
//
// The state is a literal, here and in sqlList: one statement per state
// keeps every plan fixed (a parameter that the planner looks at makes
// SQLite prepare the statement again at every bind).
func sqlLookup(archived int) string {
	return fmt.Sprintf(`SELECT %s FROM messages WHERE queue = ?1 AND (state = 5) = %d AND name = ?2`, msgCols, archived)
}

// sqlList lists a queue's messages in one state in List order (with the
// ID last, which the index holds too, for a total order). CAST: with a
// bare "queue = ?1" and an ORDER BY, SQLite's planner looks at the bound
// value (its type decides whether the index order can serve the ORDER BY)
// and so prepares the statement again at every call; a typed expression
// keeps the plan, which is the same index search.
func sqlList(state queuecore.State) string {
	return fmt.Sprintf(`SELECT %s FROM messages WHERE queue = CAST(?1 AS TEXT) AND state = %d
	ORDER BY sk, seq, id`, msgCols, state)
}

// migrate creates the schema in a new store and checks the version of an
// existing one. c is the writer connection.
func migrate(c *sqlite3.SQLiteConn) error {
	v, err := queryInt(c, "PRAGMA user_version")
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	switch {
	case v == schemaVersion:
		return nil
	case v == 1:
		script := "BEGIN IMMEDIATE;" + schemaFiles + fmt.Sprintf("PRAGMA user_version = %d; COMMIT;", schemaVersion)
		if _, err := c.Exec(script, nil); err != nil {
			_, _ = c.Exec("ROLLBACK", nil)
			return fmt.Errorf("upgrade schema from version 1: %w", err)
		}
		return nil
	case v > schemaVersion:
		return fmt.Errorf("store schema version %d is newer than this yirangmq supports (%d)", v, schemaVersion)
	case v != 0:
		return fmt.Errorf("unknown store schema version %d", v)
	}
	// One transaction: a crash during creation leaves an empty file that
	// the next open creates again.
	script := "BEGIN IMMEDIATE;" + schema + fmt.Sprintf("PRAGMA user_version = %d; COMMIT;", schemaVersion)
	if _, err := c.Exec(script, nil); err != nil {
		_, _ = c.Exec("ROLLBACK", nil)
		return fmt.Errorf("create schema: %w", err)
	}
	return nil
}

// queryInt runs a query that returns one integer.
func queryInt(c *sqlite3.SQLiteConn, query string) (int64, error) {
	v, err := queryValue(c, query)
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("%s: got %T, want an integer", query, v)
	}
	return n, nil
}

// queryValue runs a query that returns one value (a PRAGMA, mostly).
func queryValue(c *sqlite3.SQLiteConn, query string) (driver.Value, error) {
	rows, err := c.Query(query, nil)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	dest := make([]driver.Value, 1)
	if err := rows.Next(dest); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: no result", query)
		}
		return nil, err
	}
	return dest[0], nil
}
