// Package sqlite is the SQLite store of yirangmq: a queuecore.Store kept in
// one database file, STORE/yirangmq.db, in WAL mode, beside the store's
// advisory lock file (backends.LockStore), with big bodies in STORE/bodies/.
//
// # Schema (schema.go)
//
// A table of queues and a table of messages, one row per message, with
// three indexes on messages: names (unique among a queue's live messages
// and, apart, among its archived ones), List order ((SortKey, Seq) within
// a queue and state), and deadlines of leased and delayed messages only.
// A body of up to 1 KiB is the last column of its row; a larger one is kept
// in a table of its own, so that the updates of a lease, a nack or an ack
// do not write it again; one of 256 KiB or more (Tuning.FileBodies) is in
// a file of its own, STORE/bodies/ID, which readers through the mount read
// in place (files.go). The schema is versioned with PRAGMA user_version.
//
// No message is cached in Go memory: the store's memory is SQLite's page
// caches, bounded per connection, whatever the number of messages. List
// streams rows from its index; Lookup, Body, Due and NextDue are index
// searches, O(log n).
//
// # Writes (writer.go)
//
// One connection writes, with prepared statements, used by one goroutine
// at a time. Concurrent Apply calls share one transaction (group commit,
// Store.write): in SyncFull, one fsync of the WAL for all of them. Each
// batch of a shared transaction runs inside its own SAVEPOINT, so that a
// batch that breaks a constraint is rolled back alone and fails alone. A
// batch of one statement, the common uncontended case, runs without BEGIN
// or COMMIT: SQLite makes the statement its own transaction.
//
// # Reads (reader.go)
//
// Through database/sql: its pool of read-only connections and its
// prepared statements. In WAL mode a reader is never blocked by the
// writer: a Lookup for one queue does not wait for another queue's fsync.
// Every read is one statement, hence one read transaction, which starts
// after every Apply that has returned.
//
// # System calls (vfs.go)
//
// On Linux, a commit costs more in system calls than in SQLite. The store
// opens its database through a thin VFS of its own that writes the frames
// of a transaction to the WAL in one call instead of two per page, and
// holds a SHARED lock on the database file for its life, which spares
// every transaction two fcntl calls.
//
// # Contexts
//
// The context of a call is not used to cancel it: writes are short and must
// not fail after (or while) being committed because a FUSE request was
// interrupted, and reads are as short (List stops when its callback says
// so, and its callback must not call the store).
package sqlite
