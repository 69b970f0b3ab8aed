package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"

	"github.com/mattn/go-sqlite3"
)

// With Tuning's sqlReads, the reads go through database/sql: its pool of
// read-only connections (at most maxReaders, kept while idle) and its
// prepared statements, which it prepares again on each connection it
// runs them on, instead of the store's own pool of readers (reader.go)
// and reads on the writer's idle connection (readPoint).

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

// openSQLReads opens database/sql's pool of readers and prepares the read
// statements on it.
func (s *Store) openSQLReads() error {
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
	s.db, s.dbReads = db, st
	return nil
}

// dbReader is a reader on database/sql's pool, with slices of its own.
func (s *Store) dbReader() *reader {
	r := newScratch(s.dbReads)
	r.pragma = func(q string) (int64, error) {
		var n int64
		err := s.db.QueryRow(q).Scan(&n)
		return n, err
	}
	return r
}

// closeSQLReads closes the statements and the pool.
func (s *Store) closeSQLReads() error {
	if s.db == nil {
		return nil
	}
	s.dbReads.close()
	err := s.db.Close()
	s.db, s.dbReads = nil, nil
	return err
}

// shrinkSQLReads closes database/sql's idle connections, and so frees
// their page caches; the pool opens new ones as reads need them.
func (s *Store) shrinkSQLReads() {
	s.db.SetMaxIdleConns(0)
	s.db.SetMaxIdleConns(maxReaders)
}

// dbStmt is a statement prepared on database/sql's pool.
type dbStmt struct{ st *sql.Stmt }

func (d dbStmt) query(args []driver.NamedValue) (driver.Rows, error) {
	vals := make([]any, len(args))
	for i := range args {
		vals[i] = args[i].Value
	}
	rows, err := d.st.Query(vals...)
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

// dbRows reads *sql.Rows as driver.Rows, for the store's scanning code.
type dbRows struct {
	rows *sql.Rows
	cols []string
	ptrs []any // &vals[i]: database/sql stores a column's value as it is into an *any
	vals []any
}

func (r *dbRows) Columns() []string { return r.cols }
func (r *dbRows) Close() error      { return r.rows.Close() }

// Next reads the next row into dest (the first len(dest) columns), as
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
