package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"github.com/mattn/go-sqlite3"

	"yirangmq/queuecore"
)

// reader runs the store's reads: the read statements and the argument
// and destination slices they use, on one read-only connection of the
// store's pool of readers (below), on the writer's connection
// (readPoint), or on database/sql's pool (sqlreads.go). A reader is used
// by one goroutine at a time. Each statement runs in autocommit mode, so
// a read sees every transaction committed before it starts, and a reader
// never waits for the writer (WAL: readers read the last commit while a
// new one is written and synced).
type reader struct {
	*readStmts
	// conn is the reader's own connection (nil on database/sql's pool,
	// whose pragma runs the PRAGMAs instead).
	conn   *sqlite3.SQLiteConn
	pragma func(query string) (int64, error)

	args []driver.NamedValue
	dest []driver.Value
}

// readStmts are the read statements, prepared on one connection or on
// database/sql's pool.
type readStmts struct {
	queues, body, size, due, nextDue, counts, maxID readStmt
	lookup                                          [2]readStmt // by archived
	// list and listAfter by state: the whole list, and its rest after a
	// given (sk, seq, id).
	list, listAfter [len(queuecore.States) + 1]readStmt
}

// readStmt is a prepared query.
type readStmt interface {
	query(args []driver.NamedValue) (driver.Rows, error)
	close() error
}

// connStmt is a statement prepared on a connection of the store's own.
type connStmt struct{ st *sqlite3.SQLiteStmt }

// query runs the statement. The context is Background: go-sqlite3 would
// watch a cancellable one with a callback per query, and the Store
// contract lets no short read fail because a FUSE request was
// interrupted.
func (c connStmt) query(args []driver.NamedValue) (driver.Rows, error) {
	return c.st.QueryContext(context.Background(), args)
}

func (c connStmt) close() error { return c.st.Close() }

func openReader(path string, opts connOptions) (*reader, error) {
	c, err := openConn(path, opts)
	if err != nil {
		return nil, err
	}
	r, err := newReader(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	return r, nil
}

// newReader prepares the read statements on c.
func newReader(c *sqlite3.SQLiteConn) (*reader, error) {
	st, err := prepareReads(func(q string) (readStmt, error) {
		ds, err := c.Prepare(q)
		if err != nil {
			return nil, err
		}
		return connStmt{ds.(*sqlite3.SQLiteStmt)}, nil
	})
	if err != nil {
		return nil, err
	}
	r := newScratch(st)
	r.conn = c
	r.pragma = func(q string) (int64, error) { return queryInt(c, q) }
	return r, nil
}

// newScratch is a reader of st with argument and destination slices of
// its own.
func newScratch(st *readStmts) *reader {
	return &reader{readStmts: st, args: newArgs(4), dest: make([]driver.Value, nMsgCols)}
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
		stmts = append(stmts, stmt{&rs.list[st], sqlList(st)}, stmt{&rs.listAfter[st], sqlListAfter(st)})
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

func (r *reader) close() error {
	r.readStmts.close()
	return r.conn.Close()
}

// close finalizes the statements.
func (rs *readStmts) close() {
	stmts := []readStmt{rs.queues, rs.body, rs.size, rs.due, rs.nextDue, rs.counts, rs.maxID}
	stmts = append(stmts, rs.lookup[:]...)
	stmts = append(stmts, rs.list[:]...)
	stmts = append(stmts, rs.listAfter[:]...)
	for _, st := range stmts {
		if st != nil {
			st.close()
		}
	}
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

// getReader takes an idle reader, opens a new one while there are fewer
// than maxReaders, or waits for one to be given back. The caller holds
// closeMu.RLock.
func (s *Store) getReader() (*reader, error) {
	select {
	case r := <-s.idle:
		return r, nil
	default:
	}
	s.readersMu.Lock()
	if s.readers < cap(s.idle) {
		s.readers++
		s.readersMu.Unlock()
		r, err := openReader(s.path, s.connOpts(false))
		if err != nil {
			s.readersMu.Lock()
			s.readers--
			s.readersMu.Unlock()
			return nil, fmt.Errorf("open reader: %w", err)
		}
		return r, nil
	}
	s.readersMu.Unlock()
	return <-s.idle, nil
}

// readPoint runs a short read, one that cannot block, on the writer's
// connection when no commit is in flight or queued, and on a reader
// otherwise. The writer's page cache is warm (SQLite keeps a connection's
// cache across its own commits, and drops a reader's at every commit of
// another connection), which spares the read the pages it would fetch
// again. A commit that arrives meanwhile waits for the read, a few
// microseconds; a read never waits for a commit.
//
// f learns whether it runs on the writer's connection (onWriter), for List,
// which reads only a first chunk there.
func (s *Store) readPoint(f func(r *reader, onWriter bool) error) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return errClosed
	}
	if s.db != nil {
		return f(s.dbReader(), false)
	}
	s.groupMu.Lock()
	if !s.committing && len(s.pending) == 0 {
		s.committing = true
		s.groupMu.Unlock()
		defer s.giveWriter()
		return f(s.w.reads, true)
	}
	s.groupMu.Unlock()
	r, err := s.getReader()
	if err != nil {
		return err
	}
	err = f(r, false)
	s.idle <- r
	return err
}

// read runs f with a reader, unless the store is closed.
func (s *Store) read(f func(r *reader) error) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return errClosed
	}
	if s.db != nil {
		return f(s.dbReader())
	}
	r, err := s.getReader()
	if err != nil {
		return err
	}
	err = f(r)
	s.idle <- r // never blocks: at most cap(idle) readers exist
	return err
}
