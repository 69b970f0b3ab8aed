package postgres

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"yirangmq/backends"
	"yirangmq/testenv/pgtest"
)

// TestTypes: every type the store's statements pass and read goes to the
// server and back unchanged, NULL and empty apart.
func TestTypes(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	s := open(t, srv.CreateDB(t, "types"), backends.Options{})
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	for _, c := range []struct {
		i8   int64
		i2   int16
		b    bool
		text string
		raw  []byte
		list [][]byte
	}{
		{math.MinInt64, math.MinInt16, false, "", []byte{}, nil},
		{math.MaxInt64, math.MaxInt16, true, "é\tq'\"\\", all, [][]byte{all, {}, []byte("m1")}},
		{0, -1, true, "x", nil, [][]byte{[]byte("a\\\"{},b")}},
	} {
		var (
			i8, n         int64
			i2            int16
			b, in, isNull bool
			text          string
			raw           []byte
			null          []byte
			nullStr       *string
		)
		err := s.pool.QueryRow(ctx, `SELECT $1::bigint, $2::smallint, $3::bool, $4::text, $5::bytea,
			$5::bytea IS NULL, NULL::bytea, NULL::text, cardinality($6::bytea[]), $5::bytea = ANY($6::bytea[])`,
			c.i8, c.i2, c.b, c.text, c.raw, c.list).Scan(&i8, &i2, &b, &text, &raw, &isNull, &null, &nullStr, &n, &in)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if i8 != c.i8 || i2 != c.i2 || b != c.b || text != c.text {
			t.Errorf("got %d %d %v %q, sent %d %d %v %q", i8, i2, b, text, c.i8, c.i2, c.b, c.text)
		}
		if isNull || raw == nil || !bytes.Equal(raw, c.raw) {
			t.Errorf("bytea %x came back as %x (NULL %v)", c.raw, raw, isNull)
		}
		if null != nil || nullStr != nil {
			t.Errorf("NULL came back as %x, %v", null, nullStr)
		}
		wantIn := false
		for _, e := range c.list {
			wantIn = wantIn || bytes.Equal(e, c.raw)
		}
		if n != int64(len(c.list)) || in != wantIn {
			t.Errorf("list of %d: cardinality %d, contains %x: %v, want %v", len(c.list), n, c.raw, in, wantIn)
		}
	}
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT 1 WHERE false`).Scan(&n); !errors.Is(err, errNoRows) {
		t.Errorf("no row: %v, want errNoRows", err)
	}
	if err := s.pool.QueryRow(ctx, `SELECT NULL::bigint`).Scan(&n); err == nil {
		t.Error("NULL into an int64: no error")
	}
	if err := s.pool.QueryRow(ctx, `SELECT $1::bigint`, 1.5).Scan(&n); err == nil || !strings.Contains(err.Error(), "unsupported type float64") {
		t.Errorf("an argument of no supported type: %v", err)
	}
	if err := s.pool.QueryRow(ctx, `SELECT 40000::int`).Scan(new(int16)); err == nil {
		t.Error("40000 into an int16: no error")
	}
}

// TestPoolSettings: pool_max_conns bounds the connections of the pool
// and is not sent to the server, nor are pgxpool's other settings, which
// are ignored with a warning; a pool_max_conns that is no positive number
// is refused at Open.
func TestPoolSettings(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	url := srv.CreateDB(t, "pool")
	var logs logRecorder
	s := open(t, url+"&pool_max_conns=2&pool_max_conn_lifetime=1h", backends.Options{Logger: slog.New(&logs)})
	if logs.count("pool_max_conn_lifetime") != 1 {
		t.Errorf("no warning about the ignored setting:\n%s", strings.Join(logs.get(), "\n"))
	}
	a, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if _, err := s.pool.Acquire(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a third connection with pool_max_conns=2: %v, want a wait until the deadline", err)
	}
	cancel()
	a.Release()
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if c.conn != a.conn {
		t.Error("the released connection was not reused")
	}
	// A connection left in a transaction is closed, not reused.
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	c.Release()
	if !c.IsClosed() {
		t.Error("a connection released in a transaction is still open")
	}
	b.Release()

	for _, bad := range []string{"0", "-1", "x"} {
		if s, err := Open(ctx, url+"&pool_max_conns="+bad, backends.Options{}); err == nil {
			s.Close()
			t.Errorf("pool_max_conns=%s: Open succeeded", bad)
		} else if !strings.Contains(err.Error(), "pool_max_conns") {
			t.Errorf("pool_max_conns=%s: %v, which does not name the setting", bad, err)
		}
	}
}

// TestPoolClosesIdle: a connection idle for over maxIdle is closed when
// another is released, and the one released is kept.
func TestPoolClosesIdle(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	s := open(t, srv.CreateDB(t, "idle"), backends.Options{})
	old := maxIdle
	maxIdle = 50 * time.Millisecond
	t.Cleanup(func() { maxIdle = old })
	a, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.Release()
	time.Sleep(100 * time.Millisecond)
	b.Release()
	if !a.IsClosed() {
		t.Error("a connection idle for twice maxIdle is still open after another's release")
	}
	if b.IsClosed() {
		t.Error("the connection just released was closed")
	}
	s.pool.mu.Lock()
	n := len(s.pool.idle)
	s.pool.mu.Unlock()
	if n != 1 {
		t.Errorf("%d idle connections, want 1", n)
	}
}
