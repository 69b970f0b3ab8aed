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

// reader is one read-only connection with its prepared statements. A reader
// is used by one goroutine at a time: taken from Store.idle, given back
// after the read. Each statement runs in autocommit mode, so a read sees
// every transaction committed before it starts, and a reader never waits
// for the writer (WAL: readers read the last commit while a new one is
// written and synced).
type reader struct {
	conn *sqlite3.SQLiteConn

	queues, body, size, due, nextDue, counts, maxID *sqlite3.SQLiteStmt
	lookup                                          [2]*sqlite3.SQLiteStmt // by archived
	// list and listAfter by state: the whole list, and its rest after a
	// given (sk, seq, id).
	list, listAfter [len(queuecore.States) + 1]*sqlite3.SQLiteStmt

	args []driver.NamedValue
	dest []driver.Value
}

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
	r := &reader{conn: c, args: newArgs(4), dest: make([]driver.Value, nMsgCols)}
	type stmt struct {
		p   **sqlite3.SQLiteStmt
		sql string
	}
	stmts := []stmt{
		{&r.queues, sqlQueues},
		{&r.lookup[0], sqlLookup(0)},
		{&r.lookup[1], sqlLookup(1)},
		{&r.body, sqlBody},
		{&r.size, sqlSize},
		{&r.due, sqlDue},
		{&r.nextDue, sqlNextDue},
		{&r.counts, sqlCounts},
		{&r.maxID, sqlMaxID},
	}
	for _, st := range queuecore.States {
		stmts = append(stmts, stmt{&r.list[st], sqlList(st)}, stmt{&r.listAfter[st], sqlListAfter(st)})
	}
	for _, st := range stmts {
		ds, err := c.Prepare(st.sql)
		if err != nil {
			r.closeStmts()
			return nil, fmt.Errorf("prepare %q: %w", st.sql, err)
		}
		*st.p = ds.(*sqlite3.SQLiteStmt)
	}
	return r, nil
}

func (r *reader) close() error {
	r.closeStmts()
	return r.conn.Close()
}

func (r *reader) closeStmts() {
	stmts := []*sqlite3.SQLiteStmt{r.queues, r.body, r.size, r.due, r.nextDue, r.counts, r.maxID}
	stmts = append(stmts, r.lookup[:]...)
	stmts = append(stmts, r.list[:]...)
	stmts = append(stmts, r.listAfter[:]...)
	for _, st := range stmts {
		if st != nil {
			st.Close()
		}
	}
}

// rows runs a query. The context is Background: go-sqlite3 would watch a
// cancellable one with a callback per query, and the Store contract lets
// no short read fail because a FUSE request was interrupted.
func (r *reader) rows(st *sqlite3.SQLiteStmt, nargs int) (driver.Rows, error) {
	return st.QueryContext(context.Background(), r.args[:nargs])
}

// one runs a query and reads its first row into dest. found is false when
// there is no row.
func (r *reader) one(st *sqlite3.SQLiteStmt, nargs int, dest []driver.Value) (found bool, err error) {
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
	r, err := s.getReader()
	if err != nil {
		return err
	}
	err = f(r)
	s.idle <- r // never blocks: at most cap(idle) readers exist
	return err
}
