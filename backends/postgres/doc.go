// Package postgres is the PostgreSQL store of yirangmq: a
// queuecore.SharedStore that several daemons, on one host or several, use
// at once. Open takes a libpq-style URL or key=value DSN
// (postgres://user@host/db?sslmode=..., host=/run/postgresql dbname=mq)
// with pgx's and pgxpool's settings, which work as pgx documents them
// (pool_max_conns, 16 here unless set; pool_max_conn_lifetime,
// pool_health_check_period, default_query_exec_mode, ...), and one of its
// own, session_url (below). The store talks to the server through
// pgxpool: the pool, its health checks and connection lifetimes, and the
// statement cache are pgx's.
//
// # Poolers (PgBouncer)
//
// The pool's work is transactions, each started by the statement of
// txSettings, which sets synchronous_commit and the idle-in-transaction
// timeout for that transaction alone: nothing is a startup parameter or a
// session setting, so the store runs through a pooler in transaction mode
// (PgBouncer's pool_mode=transaction) with a default_query_exec_mode that
// prepares no named statement (cache_describe; PgBouncer 1.21 and later
// with max_prepared_statements also takes pgx's default). Two things need
// a session of their own, which such a pooler does not give: the
// listener's LISTEN and the duty's session advisory lock. They connect
// where session_url says (a connection string of its own, in either form,
// percent-encoded in a URL), by default the store string itself: the
// server, or a database of the pooler in session mode.
//
// # Schema (schema.go)
//
// Open creates the tables if they are missing, under a transaction-level
// advisory lock so that daemons starting together on a new database do
// not race, in the first existing schema of the search_path (several
// stores can share a database, one per schema: options=-csearch_path=NAME
// in the URL). The tables are prefixed yirangmq_:
//
//   - yirangmq_queues: name, policy, uid, gid, mode, created_at.
//   - yirangmq_messages: one row per message, with its body (bytea, which
//     PostgreSQL moves out of line, TOAST, when large: an update that does
//     not change it does not copy it). Times are bigint Unix nanoseconds,
//     0 for the zero time, exact to the nanosecond. sort_key is
//     Message.SortKey(). Message names and the other strings users give
//     are bytea: a name is any bytes but '/' and NUL, which a text column
//     would refuse. rev is the revision SharedStore checks. Indexes: names
//     unique among a queue's live messages and, apart, its archived ones
//     (two partial unique indexes); List order (queue, state, sort_key,
//     seq, id); the deadlines of leased and delayed messages only.
//   - yirangmq_meta: the schema version and next_id, the next ID that
//     ReserveIDs hands out; a trigger raises it past the ID or Seq of a
//     deleted message, so that MaxID never goes back.
//
// # Writes (write.go)
//
// An Apply is one transaction and one round trip: its statements and the
// notification are sent as one pgx batch, which PostgreSQL runs as one
// implicit transaction, rolled back whole at the first error. An update or
// delete that finds no row at its revision fails the batch with
// ErrConflict (the message exists at another revision) or ErrNotFound; a
// unique violation is ErrExists, a missing queue ErrNotFound. Concurrency
// is PostgreSQL's: each Apply has a connection of the pool, and the server
// shares WAL flushes among concurrent commits. A batch that the server
// aborts for a deadlock, or that failed before reaching it, runs again.
// LeaseNext is two round trips: BEGIN with SELECT ... FOR UPDATE SKIP
// LOCKED, then the update, the notification and COMMIT.
//
// # Sync modes
//
// SyncStrict, SyncFull and SyncNormal run their transactions with
// synchronous_commit=on (Op.NoSync changes nothing here): a commit is on
// the server's stable storage (and its synchronous standbys', if any)
// before Apply returns. SyncOff runs with synchronous_commit=off: the
// server acknowledges before its WAL flush, so a crash of the server (not
// of yirangmq) may lose the last commits, never half of one.
//
// # Change hints (notify.go)
//
// Every committed Apply, LeaseNext, PutQueue and DeleteQueue sends one
// NOTIFY on channel yirangmq (per schema, see storeNames) in its own
// transaction, so that a hint is heard if and only if its change
// committed. The payload names the sending Store (a random origin, so that
// a store ignores its own) and each change: queue, name, from state and
// to state, or the queue alone for a queue change. A batch whose hints do
// not fit in 8000 bytes, or a delete that names only an ID, sends
// "anything may have changed" instead. A goroutine of each Store holds a
// connection of its own that LISTENs and calls the Subscribe callbacks;
// when that connection fails it reconnects with backoff (up to 5s between
// tries, one log line per outage and one a minute while it lasts) and then
// delivers Change{} (a resync), since what was committed meanwhile was not
// heard. It also pings an idle connection every 30s, so that a connection
// cut without a word is noticed.
//
// # Duty (duty.go)
//
// The timed work goes to the Store that holds a session advisory lock on
// a connection of its own (session_url). Every second, a Store that does not hold it
// tries pg_try_advisory_lock; the holder runs SELECT 1, and when that
// fails it drops the connection and Duty turns false at once. The server
// releases the lock when the holder's session ends, however it ends: a
// session of a crashed or cut-off host ends after 10 s without a query
// (idle_session_timeout, PostgreSQL 14 and later; the holder queries every
// second) or when TCP keepalive probes, set to 5 s idle, 2 s apart, 3
// missed, find the peer gone; another Store takes it within a second
// after. A holder cut off without a word stops within its check interval
// plus its check timeout (4 s), before the server lets the lock go (10 s
// at the earliest), so two Stores do not both do the timed work; should
// they ever (a server that refuses the settings above, and a holder whose
// checks still pass), it stays safe to do twice: every change is checked
// by revision. Through a pooler in session mode the same holds: PgBouncer
// resets the server session (server_reset_query, DISCARD ALL, which drops
// advisory locks) when the holder's client connection ends, and the
// server ends a server session that the holder stopped using.
//
// # When the database is unreachable
//
// Every method returns an error that wraps the cause, promptly: connecting
// gives up after 5s and a call after 10s (Counts and MaxID, which scan,
// after 2 minutes). Writes do not watch the caller's context beyond that
// bound: a FUSE request interrupted by a signal must not fail a commit
// after, or while, it is made. A write whose connection fails during its
// COMMIT may or may not have committed; the error says it failed, and a
// retry of one that had committed fails (ErrConflict for an update,
// ErrExists for an insert) rather than apply twice. The pool reconnects by
// itself at the next call; the listener and duty goroutines reconnect in
// the background.
package postgres
