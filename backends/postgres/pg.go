package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The store talks to PostgreSQL through pgconn, pgx's wire-protocol
// layer, and this file: a pool of connections, each preparing a statement
// once, and the few types the store's statements take and return (bigint,
// smallint, bool, text, bytea and an array of bytea). pgx's own layers
// above pgconn (pgx.Conn, which links in pgx's whole type system, and
// pgxpool) added 2.8–3.0 MB to each release binary, a fifth of it, for
// types this store never uses, and took the ARM binaries over their
// 12 MB budget (docs/backends.md, "Budget on ARM boards").

// errNoRows is the error of rowScanner.Scan when the query returned no row.
var errNoRows = errors.New("no rows in result set")

// PostgreSQL type OIDs of the values this file reads and writes.
const (
	oidBool      = 16
	oidBytea     = 17
	oidName      = 19
	oidInt8      = 20
	oidInt2      = 21
	oidInt4      = 23
	oidText      = 25
	oidUnknown   = 705
	oidVarchar   = 1043
	oidByteaList = 1001
)

// rawBytes is a scan destination for text or bytea that is not copied:
// it is valid until the next row is read.
type rawBytes []byte

// binaryResults asks for every column in binary format.
var binaryResults = []int16{1}

// conn is one connection and the statements prepared on it.
type conn struct {
	pg    *pgconn.PgConn
	stmts map[string]*pgconn.StatementDescription
	// stale is set when the server says a prepared statement no longer
	// fits the tables (another daemon migrated them): the pool then
	// closes the connection instead of keeping it.
	stale     bool
	idleSince time.Time
}

func newConn(pg *pgconn.PgConn) *conn {
	return &conn{pg: pg, stmts: map[string]*pgconn.StatementDescription{}}
}

// dial opens a connection with cfg.
func dial(ctx context.Context, cfg *pgconn.Config) (*conn, error) {
	pg, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return newConn(pg), nil
}

// IsClosed reports whether the connection is closed or broken.
func (c *conn) IsClosed() bool { return c.pg.IsClosed() }

// Close closes the connection, waiting at most until ctx is done.
func (c *conn) Close(ctx context.Context) error { return c.pg.Close(ctx) }

// prepare returns the description of sql, preparing it the first time.
// The store's statements are constants, so the map stays small.
func (c *conn) prepare(ctx context.Context, sql string) (*pgconn.StatementDescription, error) {
	if sd, ok := c.stmts[sql]; ok {
		return sd, nil
	}
	sd, err := c.pg.Prepare(ctx, "yq"+strconv.Itoa(len(c.stmts)+1), sql, nil)
	if err != nil {
		return nil, c.noteError(err)
	}
	c.stmts[sql] = sd
	return sd, nil
}

// noteError marks the connection stale when err says its prepared
// statements no longer fit the tables, and returns err.
func (c *conn) noteError(err error) error {
	var pgErr *pgconn.PgError
	// feature_not_supported ("cached plan must not change result type"),
	// invalid_sql_statement_name.
	if errors.As(err, &pgErr) && (pgErr.Code == "0A000" || pgErr.Code == "26000") {
		c.stale = true
	}
	return err
}

// Exec runs sql. Without arguments it goes by the simple protocol, which
// takes several statements separated by semicolons (the schema); with
// arguments it is prepared.
func (c *conn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if len(args) == 0 {
		rs, err := c.pg.Exec(ctx, sql).ReadAll()
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		if len(rs) == 0 {
			return pgconn.CommandTag{}, nil
		}
		return rs[len(rs)-1].CommandTag, nil
	}
	r, err := c.Query(ctx, sql, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	for r.Next() {
	}
	r.Close()
	return r.tag, r.Err()
}

// Query runs sql, a prepared statement, with args.
func (c *conn) Query(ctx context.Context, sql string, args ...any) (*rows, error) {
	sd, err := c.prepare(ctx, sql)
	if err != nil {
		return nil, err
	}
	vals, formats, err := encodeArgs(sd, args)
	if err != nil {
		return nil, err
	}
	return &rows{c: c, rr: c.pg.ExecPrepared(ctx, sd.Name, vals, formats, binaryResults)}, nil
}

// QueryRow runs sql and scans its first row (errNoRows if none).
func (c *conn) QueryRow(ctx context.Context, sql string, args ...any) rowScanner {
	r, err := c.Query(ctx, sql, args...)
	return rowScanner{r, err}
}

// Ping checks that the server answers.
func (c *conn) Ping(ctx context.Context) error { return c.pg.Ping(ctx) }

// SendBatch sends the statements of b in one round trip, ending in one
// Sync: PostgreSQL runs them as one transaction unless they manage their
// own. The statements not yet prepared on c are prepared first.
func (c *conn) SendBatch(ctx context.Context, b *batch) *batchResults {
	pb := &pgconn.Batch{}
	for _, it := range b.items {
		sd, err := c.prepare(ctx, it.sql)
		if err != nil {
			return &batchResults{c: c, err: err}
		}
		vals, formats, err := encodeArgs(sd, it.args)
		if err != nil {
			return &batchResults{c: c, err: err}
		}
		pb.ExecPrepared(sd.Name, vals, formats, binaryResults)
	}
	return &batchResults{c: c, mrr: c.pg.ExecBatch(ctx, pb)}
}

// batch is a list of statements for SendBatch.
type batch struct {
	items []batchItem
}

type batchItem struct {
	sql  string
	args []any
}

// Queue adds a statement.
func (b *batch) Queue(sql string, args ...any) {
	b.items = append(b.items, batchItem{sql, args})
}

// Len is the number of statements.
func (b *batch) Len() int { return len(b.items) }

// batchResults reads the results of a batch, one statement after the
// other.
type batchResults struct {
	c       *conn
	mrr     *pgconn.MultiResultReader
	err     error  // the first error; before the batch was sent, its only one
	release func() // returns a pool's connection, at Close
}

// Exec reads the result of the next statement and discards its rows.
func (br *batchResults) Exec() (pgconn.CommandTag, error) {
	r, err := br.Query()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	for r.Next() {
	}
	r.Close()
	return r.tag, r.Err()
}

// Query returns the rows of the next statement; they must be read or
// closed before the next call.
func (br *batchResults) Query() (*rows, error) {
	if br.err != nil {
		return nil, br.err
	}
	if !br.mrr.NextResult() {
		err := br.mrr.Close()
		if err == nil {
			err = errors.New("batch: fewer results than statements")
		}
		br.err = br.c.noteError(err)
		return nil, br.err
	}
	return &rows{c: br.c, rr: br.mrr.ResultReader()}, nil
}

// Close reads what is left of the batch's results and returns the first
// error of the batch.
func (br *batchResults) Close() error {
	if br.mrr != nil {
		if err := br.mrr.Close(); err != nil && br.err == nil {
			br.err = br.c.noteError(err)
		}
		br.mrr = nil
	}
	if br.release != nil {
		br.release()
		br.release = nil
	}
	return br.err
}

// rows reads the rows of one statement.
type rows struct {
	c       *conn
	rr      *pgconn.ResultReader
	tag     pgconn.CommandTag
	err     error
	closed  bool
	release func() // returns a pool's connection, at Close
}

// Next moves to the next row; false at the end or on an error (see Err).
func (r *rows) Next() bool {
	if r.closed {
		return false
	}
	if r.rr.NextRow() {
		return true
	}
	r.Close()
	return false
}

// Scan reads the current row's columns into dest, one per column.
func (r *rows) Scan(dest ...any) error {
	vals := r.rr.Values()
	if len(dest) != len(vals) {
		return fmt.Errorf("scan: %d destinations for %d columns", len(dest), len(vals))
	}
	fields := r.rr.FieldDescriptions()
	for i := range dest {
		if err := decode(fields[i].DataTypeOID, vals[i], dest[i]); err != nil {
			return fmt.Errorf("scan column %s: %w", fields[i].Name, err)
		}
	}
	return nil
}

// Err is the error that ended the rows, if any.
func (r *rows) Err() error { return r.err }

// Close ends the rows (reading what is left) and, for a query of a pool,
// returns its connection.
func (r *rows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	tag, err := r.rr.Close()
	r.tag = tag
	if err != nil && r.err == nil {
		r.err = r.c.noteError(err)
	}
	if r.release != nil {
		r.release()
	}
}

// rowScanner scans the first row of a query.
type rowScanner struct {
	r   *rows
	err error
}

// Scan reads the first row into dest and closes the rows; errNoRows when
// there is none.
func (rs rowScanner) Scan(dest ...any) error {
	if rs.err != nil {
		return rs.err
	}
	r := rs.r
	defer r.Close()
	if !r.Next() {
		if err := r.Err(); err != nil {
			return err
		}
		return errNoRows
	}
	if err := r.Scan(dest...); err != nil {
		return err
	}
	r.Close()
	return r.Err()
}

// encodeArgs encodes args for the parameters of sd: integers, bools and
// strings as text (the server reads them as the type it inferred), byte
// slices raw in binary format for bytea, [][]byte as a binary bytea
// array; nil is NULL.
func encodeArgs(sd *pgconn.StatementDescription, args []any) ([][]byte, []int16, error) {
	if len(args) != len(sd.ParamOIDs) {
		return nil, nil, fmt.Errorf("statement takes %d arguments, given %d", len(sd.ParamOIDs), len(args))
	}
	vals := make([][]byte, len(args))
	formats := make([]int16, len(args))
	for i, a := range args {
		oid := sd.ParamOIDs[i]
		switch v := a.(type) {
		case nil:
		case int64:
			vals[i] = strconv.AppendInt(nil, v, 10)
		case int:
			vals[i] = strconv.AppendInt(nil, int64(v), 10)
		case int16:
			vals[i] = strconv.AppendInt(nil, int64(v), 10)
		case bool:
			vals[i] = []byte(strconv.FormatBool(v))
		case string:
			vals[i] = []byte(v)
			if oid == oidBytea {
				formats[i] = 1
			}
		case []byte:
			if v == nil {
				v = []byte{} // a nil slice is an empty value here, not NULL
			}
			vals[i] = v
			if oid == oidBytea {
				formats[i] = 1
			}
		case [][]byte:
			if oid != oidByteaList {
				return nil, nil, fmt.Errorf("argument $%d: a list of byte strings for a parameter of type %d", i+1, oid)
			}
			vals[i], formats[i] = encodeByteaArray(v), 1
		default:
			return nil, nil, fmt.Errorf("argument $%d: unsupported type %T", i+1, a)
		}
	}
	return vals, formats, nil
}

// encodeByteaArray is the binary form of a one-dimensional bytea array.
func encodeByteaArray(elems [][]byte) []byte {
	if len(elems) == 0 {
		// No dimensions, no nulls, element type.
		return binary.BigEndian.AppendUint32(make([]byte, 8, 12), oidBytea)
	}
	n := 20
	for _, e := range elems {
		n += 4 + len(e)
	}
	b := make([]byte, 0, n)
	b = binary.BigEndian.AppendUint32(b, 1) // dimensions
	b = binary.BigEndian.AppendUint32(b, 0) // no NULL
	b = binary.BigEndian.AppendUint32(b, oidBytea)
	b = binary.BigEndian.AppendUint32(b, uint32(len(elems)))
	b = binary.BigEndian.AppendUint32(b, 1) // lower bound
	for _, e := range elems {
		b = binary.BigEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	return b
}

// decode reads a column value of type oid, in binary format, into dest.
func decode(oid uint32, val []byte, dest any) error {
	if val == nil {
		switch d := dest.(type) {
		case *[]byte:
			*d = nil
		case *rawBytes:
			*d = nil
		case **string:
			*d = nil
		default:
			return fmt.Errorf("NULL into %T", dest)
		}
		return nil
	}
	switch d := dest.(type) {
	case *int64:
		n, err := decodeInt(oid, val)
		*d = n
		return err
	case *int:
		n, err := decodeInt(oid, val)
		*d = int(n)
		return err
	case *int16:
		n, err := decodeInt(oid, val)
		if err == nil && int64(int16(n)) != n {
			err = fmt.Errorf("%d out of range for int16", n)
		}
		*d = int16(n)
		return err
	case *bool:
		if oid != oidBool {
			return fmt.Errorf("type %d into bool", oid)
		}
		*d = len(val) == 1 && val[0] == 1
		return nil
	}
	switch oid {
	case oidText, oidVarchar, oidName, oidBytea, oidUnknown:
	default:
		return fmt.Errorf("type %d into %T", oid, dest)
	}
	b := val
	switch d := dest.(type) {
	case *string:
		*d = string(b)
	case **string:
		s := string(b)
		*d = &s
	case *[]byte:
		*d = append([]byte{}, b...)
	case *rawBytes:
		*d = b
	default:
		return fmt.Errorf("unsupported destination %T", dest)
	}
	return nil
}

// decodeInt reads a smallint, integer or bigint.
func decodeInt(oid uint32, val []byte) (int64, error) {
	switch {
	case oid == oidInt2 && len(val) == 2:
		return int64(int16(binary.BigEndian.Uint16(val))), nil
	case oid == oidInt4 && len(val) == 4:
		return int64(int32(binary.BigEndian.Uint32(val))), nil
	case oid == oidInt8 && len(val) == 8:
		return int64(binary.BigEndian.Uint64(val)), nil
	}
	return 0, fmt.Errorf("type %d (%d bytes) into an integer", oid, len(val))
}

// quoteIdent quotes an SQL identifier.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(strings.ReplaceAll(s, "\x00", ""), `"`, `""`) + `"`
}

// pool holds up to max connections to one database, made as needed and
// kept while idle. A connection idle for over a second is pinged before
// it is used again, so that one the server dropped meanwhile (a restart)
// is replaced instead of failing the call; one idle for half an hour is
// closed at the next release or acquire.
type pool struct {
	cfg *pgconn.Config
	sem chan struct{} // a token per connection in use

	mu     sync.Mutex
	idle   []*conn
	closed bool
}

// A connection idle for over pingAfter is pinged before it is used again;
// one idle for over maxIdle is closed instead, or when another is
// released (a variable for the tests).
const pingAfter = time.Second

var maxIdle = 30 * time.Minute

func newPool(cfg *pgconn.Config, max int) *pool {
	return &pool{cfg: cfg, sem: make(chan struct{}, max)}
}

// poolConn is a connection taken from a pool; Release gives it back.
type poolConn struct {
	*conn
	p *pool
}

// Release returns the connection to its pool. One in a transaction, busy,
// closed or stale is closed instead (closing rolls a transaction back).
func (pc *poolConn) Release() { pc.p.put(pc.conn) }

// Acquire takes a connection, waiting while max are in use.
func (p *pool) Acquire(ctx context.Context) (*poolConn, error) {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			<-p.sem
			return nil, errClosed
		}
		var c *conn
		if n := len(p.idle); n > 0 {
			c, p.idle = p.idle[n-1], p.idle[:n-1]
		}
		p.mu.Unlock()
		if c == nil {
			break
		}
		if idle := time.Since(c.idleSince); idle > maxIdle {
			closeConn(c)
			continue
		} else if idle > pingAfter {
			if err := c.pg.Ping(ctx); err != nil {
				closeConn(c)
				if ctx.Err() != nil {
					<-p.sem
					return nil, ctx.Err()
				}
				continue
			}
		}
		return &poolConn{c, p}, nil
	}
	c, err := dial(ctx, p.cfg)
	if err != nil {
		<-p.sem
		return nil, err
	}
	return &poolConn{c, p}, nil
}

func (p *pool) put(c *conn) {
	defer func() { <-p.sem }()
	if c.pg.IsClosed() || c.pg.IsBusy() || c.pg.TxStatus() != 'I' || c.stale {
		closeConn(c)
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		closeConn(c)
		return
	}
	now := time.Now()
	c.idleSince = now
	p.idle = append(p.idle, c)
	// The idle list is in the order of release, so the connections idle
	// for too long are at its start.
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].idleSince) > maxIdle {
		n++
	}
	expired := slices.Clone(p.idle[:n])
	p.idle = slices.Delete(p.idle, 0, n)
	p.mu.Unlock()
	for _, e := range expired {
		closeConn(e)
	}
}

// Close closes the idle connections; those in use are closed as they are
// released.
func (p *pool) Close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		closeConn(c)
	}
}

// Exec runs sql on a connection of the pool.
func (p *pool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := p.Acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer c.Release()
	return c.Exec(ctx, sql, args...)
}

// Query runs sql on a connection of the pool, which the rows hold until
// they are closed.
func (p *pool) Query(ctx context.Context, sql string, args ...any) (*rows, error) {
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	r, err := c.Query(ctx, sql, args...)
	if err != nil {
		c.Release()
		return nil, err
	}
	r.release = c.Release
	return r, nil
}

// QueryRow runs sql on a connection of the pool and scans its first row.
func (p *pool) QueryRow(ctx context.Context, sql string, args ...any) rowScanner {
	r, err := p.Query(ctx, sql, args...)
	return rowScanner{r, err}
}

// SendBatch sends b on a connection of the pool, which the results hold
// until they are closed.
func (p *pool) SendBatch(ctx context.Context, b *batch) *batchResults {
	c, err := p.Acquire(ctx)
	if err != nil {
		return &batchResults{err: err}
	}
	br := c.SendBatch(ctx, b)
	br.release = c.Release
	return br
}

// beginFunc runs fn in a transaction on a connection of p, committing if
// fn returns nil and rolling back otherwise.
func beginFunc(ctx context.Context, p *pool, fn func(tx *conn) error) error {
	c, err := p.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release() // a connection left in a transaction is closed
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		return err
	}
	if err := fn(c.conn); err != nil {
		rollback(c.conn)
		return err
	}
	_, err = c.Exec(ctx, "COMMIT")
	return err
}
