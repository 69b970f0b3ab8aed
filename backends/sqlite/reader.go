package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"github.com/mattn/go-sqlite3"

	"yirangmq/queuecore"
)

// The reads go through database/sql: its pool of read-only connections
// (at most maxReaders, kept while idle, opened by readConnector with the
// readers' settings) and its prepared statements, which it prepares again
// on each connection it runs them on. In WAL mode a reader is never
// blocked by the writer: a Lookup for one queue does not wait for
// another queue's fsync. Each statement runs in autocommit mode, so a
// read sees every transaction committed before it starts.
//
// A pool of the store's own, which also ran the short reads on the
// writer's connection while it was idle (its page cache is warm), was
// measured against this one (make bench, median of 5 interleaved runs)
// and moved no goals row by 10% consistently, so the library's pool
// stays.

// reader holds the argument and destination slices of one read, and the
// statements it runs.
type reader struct {
	*readStmts
	args []driver.NamedValue
	dest []driver.Value
}

// newScratch is a reader of st (nil for a reader of statements given
// one by one) with argument and destination slices of its own.
func newScratch(st *readStmts) *reader {
	return &reader{readStmts: st, args: newArgs(4), dest: make([]driver.Value, nMsgCols)}
}

// readStmts are the read statements, prepared on database/sql's pool.
type readStmts struct {
	queues, body, size, due, nextDue, counts, maxID readStmt
	lookup                                          [2]readStmt // by archived
	list                                            [len(queuecore.States) + 1]readStmt
}

// readStmt is a prepared query: one of database/sql's (dbStmt), or one
// of the writer's connection (connStmt).
type readStmt interface {
	query(args []driver.NamedValue) (driver.Rows, error)
	close() error
}

// readConnector opens the read-only connections of database/sql's pool,
// with the readers' settings (openConn).
type readConnector struct {
	path string
	opts connOptions
}

func (c readConnector) Connect(context.Context) (driver.Conn, error) {
	return openConn(c.path, c.opts)
}

func (c readConnector) Driver() driver.Driver { return &sqlite3.SQLiteDriver{} }

// openReads opens database/sql's pool of readers, prepares the read
// statements on it, and checks that the store can be read.
func (s *Store) openReads() error {
	db := sql.OpenDB(readConnector{path: s.path, opts: s.connOpts(false)})
	db.SetMaxOpenConns(maxReaders)
	db.SetMaxIdleConns(maxReaders)
	st, err := prepareReads(func(q string) (readStmt, error) {
		ps, err := db.Prepare(q)
		if err != nil {
			return nil, err
		}
		return dbStmt{ps}, nil
	})
	if err != nil {
		db.Close()
		return err
	}
	s.db, s.reads = db, st
	return nil
}

// prepareReads prepares every read statement with prepare.
func prepareReads(prepare func(string) (readStmt, error)) (*readStmts, error) {
	rs := &readStmts{}
	type stmt struct {
		p   *readStmt
		sql string
	}
	stmts := []stmt{
		{&rs.queues, sqlQueues},
		{&rs.lookup[0], sqlLookup(0)},
		{&rs.lookup[1], sqlLookup(1)},
		{&rs.body, sqlBody},
		{&rs.size, sqlSize},
		{&rs.due, sqlDue},
		{&rs.nextDue, sqlNextDue},
		{&rs.counts, sqlCounts},
		{&rs.maxID, sqlMaxID},
	}
	for _, st := range queuecore.States {
		stmts = append(stmts, stmt{&rs.list[st], sqlList(st)})
	}
	for _, st := range stmts {
		ps, err := prepare(st.sql)
		if err != nil {
			rs.close()
			return nil, fmt.Errorf("prepare %q: %w", st.sql, err)
		}
		*st.p = ps
	}
	return rs, nil
}

// close finalizes the statements.
func (rs *readStmts) close() {
	stmts := []readStmt{rs.queues, rs.body, rs.size, rs.due, rs.nextDue, rs.counts, rs.maxID}
	stmts = append(stmts, rs.lookup[:]...)
	stmts = append(stmts, rs.list[:]...)
	for _, st := range stmts {
		if st != nil {
			st.close()
		}
	}
}

// closeReads closes the statements and the pool.
func (s *Store) closeReads() error {
	if s.db == nil {
		return nil
	}
	s.reads.close()
	err := s.db.Close()
	s.db, s.reads = nil, nil
	return err
}

// pragma runs a PRAGMA that returns one integer on a reader.
func (s *Store) pragma(q string) (int64, error) {
	var n int64
	err := s.db.QueryRow(q).Scan(&n)
	return n, err
}

// read runs f with a reader, unless the store is closed.
func (s *Store) read(f func(r *reader) error) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return errClosed
	}
	return f(newScratch(s.reads))
}

// rows runs a query with the first nargs arguments.
func (r *reader) rows(st readStmt, nargs int) (driver.Rows, error) {
	return st.query(r.args[:nargs])
}

// one runs a query and reads its first row into dest. found is false when
// there is no row.
func (r *reader) one(st readStmt, nargs int, dest []driver.Value) (found bool, err error) {
	rows, err := r.rows(st, nargs)
	if err != nil {
		return false, err
	}
	err = rows.Next(dest)
	// Close resets the statement, which ends its read transaction: a
	// statement left stepping would pin an old snapshot of the WAL.
	cerr := rows.Close()
	if errors.Is(err, io.EOF) {
		return false, cerr
	}
	if err != nil {
		return false, err
	}
	return true, cerr
}

// dbStmt is a statement prepared on database/sql's pool.
type dbStmt struct{ st *sql.Stmt }

// query runs the statement. The context is Background: database/sql
// would watch a cancellable one with a goroutine per query, and the
// Store contract lets no short read fail because a FUSE request was
// interrupted.
func (d dbStmt) query(args []driver.NamedValue) (driver.Rows, error) {
	vals := make([]any, len(args))
	for i := range args {
		vals[i] = args[i].Value
	}
	rows, err := d.st.QueryContext(context.Background(), vals...)
	if err != nil {
		return nil, err
	}
	cols, err := rows.Columns()
	if err != nil {
		rows.Close()
		return nil, err
	}
	r := &dbRows{rows: rows, cols: cols, ptrs: make([]any, len(cols)), vals: make([]any, len(cols))}
	for i := range r.ptrs {
		r.ptrs[i] = &r.vals[i]
	}
	return r, nil
}

func (d dbStmt) close() error { return d.st.Close() }

// dbRows reads *sql.Rows as driver.Rows, for the store's scanning code
// (codec.go), which the writer's own statements share.
type dbRows struct {
	rows *sql.Rows
	cols []string
	ptrs []any // &vals[i]: database/sql stores a column's value as it is into an *any
	vals []any
}

func (r *dbRows) Columns() []string { return r.cols }
func (r *dbRows) Close() error      { return r.rows.Close() }

// Next reads the next row into dest, which has a value per column, as
// driver.Rows does: io.EOF after the last.
func (r *dbRows) Next(dest []driver.Value) error {
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return io.EOF
	}
	if len(dest) != len(r.cols) {
		return fmt.Errorf("scan %d columns into %d values", len(r.cols), len(dest))
	}
	if err := r.rows.Scan(r.ptrs...); err != nil {
		return err
	}
	for i, v := range r.vals {
		dest[i] = v
	}
	return nil
}

// connStmt is a statement prepared on the writer's connection.
type connStmt struct{ st *sqlite3.SQLiteStmt }

// query runs the statement, with a Background context as dbStmt's.
func (c connStmt) query(args []driver.NamedValue) (driver.Rows, error) {
	return c.st.QueryContext(context.Background(), args)
}

func (c connStmt) close() error { return c.st.Close() }
