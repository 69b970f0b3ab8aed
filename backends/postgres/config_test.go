package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"yirangmq/backends"
	"yirangmq/queuecore"
	"yirangmq/testenv"
	"yirangmq/testenv/pgtest"
)

// txSetting is the value of setting name inside a transaction opened as
// the store opens its write transactions (txSettings).
func txSetting(t *testing.T, s *Store, name string) string {
	t.Helper()
	ctx := context.Background()
	var v string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.txSettings); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	})
	if err != nil {
		t.Fatalf("read %s in a transaction: %v", name, err)
	}
	return v
}

// TestPoolSettings: pgxpool's and pgx's settings in the store string take
// effect as pgx documents them, none is sent to the server, and a bad
// one is refused at Open with its name and without the password.
func TestPoolSettings(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	u := srv.CreateDB(t, "settings")
	s := open(t, u+"&pool_max_conns=3&pool_min_conns=1&pool_max_conn_lifetime=7m&pool_max_conn_lifetime_jitter=9s"+
		"&pool_max_conn_idle_time=2m&pool_health_check_period=11s&default_query_exec_mode=cache_describe"+
		"&description_cache_capacity=77&statement_cache_capacity=55", backends.Options{})
	cfg := s.pool.Config()
	cc := cfg.ConnConfig
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"pool_max_conns", cfg.MaxConns, int32(3)},
		{"pool_min_conns", cfg.MinConns, int32(1)},
		{"pool_max_conn_lifetime", cfg.MaxConnLifetime, 7 * time.Minute},
		{"pool_max_conn_lifetime_jitter", cfg.MaxConnLifetimeJitter, 9 * time.Second},
		{"pool_max_conn_idle_time", cfg.MaxConnIdleTime, 2 * time.Minute},
		{"pool_health_check_period", cfg.HealthCheckPeriod, 11 * time.Second},
		{"default_query_exec_mode", cc.DefaultQueryExecMode, pgx.QueryExecModeCacheDescribe},
		{"description_cache_capacity", cc.DescriptionCacheCapacity, 77},
		{"statement_cache_capacity", cc.StatementCacheCapacity, 55},
	} {
		if c.got != c.want {
			t.Errorf("%s: the pool has %v, want %v", c.name, c.got, c.want)
		}
	}
	for k := range cc.RuntimeParams {
		if k != "application_name" {
			t.Errorf("startup parameter %s is sent to the server", k)
		}
	}
	if err := s.PutQueue(ctx, testQueue("q")); err != nil {
		t.Fatalf("PutQueue with those settings: %v", err)
	}
	// pool_max_conns bounds the connections: a fourth waits.
	var held []interface{ Release() }
	for range 3 {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if _, err := s.pool.Acquire(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a fourth connection with pool_max_conns=3: %v, want a wait until the deadline", err)
	}
	cancel()
	for _, c := range held {
		c.Release()
	}

	// The store's own default pool size, unless the string sets one.
	if d := open(t, u, backends.Options{}); d.pool.Config().MaxConns != defaultMaxConns {
		t.Errorf("pool_max_conns unset: %d connections, want %d", d.pool.Config().MaxConns, defaultMaxConns)
	}
	withPW := strings.Replace(srv.TCPURL("settings"), "postgres@", "postgres:SECRETPW@", 1)
	for _, bad := range []string{"pool_max_conns=0", "pool_max_conns=x", "pool_max_conn_lifetime=soon",
		"default_query_exec_mode=fast", "statement_cache_capacity=-x"} {
		key, _, _ := strings.Cut(bad, "=")
		s, err := Open(ctx, withPW+"&"+bad, backends.Options{})
		if err == nil {
			s.Close()
			t.Errorf("%s: Open succeeded", bad)
			continue
		}
		if !strings.Contains(err.Error(), key) || strings.Contains(err.Error(), "SECRETPW") {
			t.Errorf("%s: %v; want an error that names %s and hides the password", bad, err, key)
		}
	}
}

// TestQueryExecModes: the store works in every default_query_exec_mode
// of pgx (PgBouncer in transaction mode needs one that prepares no named
// statement): every statement it sends, with names and skip lists of any
// bytes, in each mode.
func TestQueryExecModes(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			s := open(t, srv.CreateDB(t, "mode_"+mode)+"&default_query_exec_mode="+mode, backends.Options{})
			if err := s.CreateQueue(ctx, testQueue("q")); err != nil {
				t.Fatal(err)
			}
			if err := s.UpdateQueue(ctx, testQueue("q")); err != nil {
				t.Fatal(err)
			}
			first, err := s.ReserveIDs(ctx, 3)
			if err != nil {
				t.Fatal(err)
			}
			names := []string{"a \xff\x00'\"\\{},", "b", "c"}
			var ops []queuecore.Op
			for i, n := range names {
				m := readyMsg(first+uint64(i), "q", n)
				m.Reason, m.Deadline = "r\x00", time.Unix(0, 1)
				ops = append(ops, queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: []byte(fmt.Sprint("\x00body", i))})
			}
			if err := s.Apply(ctx, ops); err != nil {
				t.Fatal(err)
			}
			got, err := s.Lookup(ctx, "q", names[0], false)
			if err != nil || got.Name != names[0] || got.Reason != "r\x00" || got.Rev != 0 {
				t.Fatalf("Lookup = %+v, %v", got, err)
			}
			if b, err := s.Body(ctx, got.ID); err != nil || string(b) != "\x00body0" {
				t.Errorf("Body = %q, %v", b, err)
			}
			leased, err := s.LeaseNext(ctx, "q", names[:1], func(m queuecore.Message) queuecore.Message {
				m.State, m.Deadline = queuecore.StateLeased, time.Unix(0, 2)
				return m
			})
			if err != nil || leased.Name != "b" || leased.Rev != 1 {
				t.Fatalf("LeaseNext skipping %q = %+v, %v; want b at revision 1", names[0], leased, err)
			}
			var listed []string
			if err := s.List(ctx, "q", queuecore.StateReady, func(m queuecore.Message) bool {
				listed = append(listed, m.Name)
				return true
			}); err != nil || len(listed) != 2 || listed[0] != names[0] {
				t.Errorf("List = %q, %v", listed, err)
			}
			if due, err := s.Due(ctx, time.Unix(0, 5), 10); err != nil || len(due) != 1 || due[0].Name != "b" {
				t.Errorf("Due = %v, %v", due, err)
			}
			if at, ok, err := s.NextDue(ctx); err != nil || !ok || !at.Equal(time.Unix(0, 2)) {
				t.Errorf("NextDue = %v, %v, %v", at, ok, err)
			}
			if n, err := s.Counts(ctx); err != nil || n["q"][queuecore.StateReady].N != 2 {
				t.Errorf("Counts = %v, %v", n, err)
			}
			if id, err := s.MaxID(ctx); err != nil || id < first+2 {
				t.Errorf("MaxID = %d, %v", id, err)
			}
			stale := got
			got.State = queuecore.StateDead
			if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: got, From: queuecore.StateReady}}); err != nil {
				t.Fatal(err)
			}
			if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpDelete, Msg: stale}}); !errors.Is(err, queuecore.ErrConflict) {
				t.Errorf("delete at a stale revision = %v, want ErrConflict", err)
			}
			if err := s.DeleteEmptyQueue(ctx, "q"); !errors.Is(err, queuecore.ErrNotEmpty) {
				t.Errorf("DeleteEmptyQueue of a full queue = %v, want ErrNotEmpty", err)
			}
			if err := s.DeleteQueue(ctx, "q"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSessionURL: the listener and the duty connect where session_url
// says, the pool where the store string does; session_url never reaches
// the server, and a bad one fails Open without showing its password.
func TestSessionURL(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	srv.CreateDB(t, "session")
	sess := srv.URL("session") + "&application_name=yq-session"
	s := open(t, srv.TCPURL("session")+"&application_name=yq-pool&"+sessionKey+"="+url.QueryEscape(sess), backends.Options{})
	if err := s.PutQueue(ctx, testQueue("q")); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.pool.Config().ConnConfig.RuntimeParams[sessionKey]; ok {
		t.Errorf("%s is sent to the server", sessionKey)
	}
	mon, err := pgx.Connect(ctx, srv.URL("session"))
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close(ctx)
	var listens, unixSessions, tcpPool int
	var qerr error
	ok := func() bool {
		qerr = mon.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE application_name = 'yq-session' AND query LIKE 'LISTEN%'),
			count(*) FILTER (WHERE application_name = 'yq-session' AND client_addr IS NULL),
			count(*) FILTER (WHERE application_name = 'yq-pool' AND client_addr IS NOT NULL)
			FROM pg_stat_activity WHERE datname = 'session'`).Scan(&listens, &unixSessions, &tcpPool)
		return qerr == nil && listens == 1 && unixSessions == 2 && tcpPool >= 1
	}
	if !testenv.RetryUntil(10*time.Second, ok) {
		t.Errorf("sessions: %d listening, %d over the socket of session_url (want 1 and 2: listener, duty), %d of the pool over TCP; %v",
			listens, unixSessions, tcpPool, qerr)
	}

	for _, bad := range []string{
		"postgres://u:SECRETPW@127.0.0.1:1/x?connect_timeout=1",
		"postgres://u:SECRETPW@127.0.0.1:1/x?pool_max_conns=x",
		"postgres://u:SECRETPW@/x?" + sessionKey + "=x",
	} {
		s, err := Open(ctx, srv.TCPURL("session")+"&password=OTHERPW&"+sessionKey+"="+url.QueryEscape(bad), backends.Options{})
		if err == nil {
			s.Close()
			t.Errorf("%s=%s: Open succeeded", sessionKey, bad)
			continue
		}
		if strings.Contains(err.Error(), "SECRETPW") || strings.Contains(err.Error(), "OTHERPW") {
			t.Errorf("%s=%s: %v shows a password", sessionKey, bad, err)
		}
		t.Logf("%s=%s: %v", sessionKey, Redact(bad), err)
	}
}

// TestNoSessionSettings: what the store sets for its transactions stays
// in them (a pooler in transaction mode hands the server session to other
// clients next): a connection of the pool, outside a transaction, has the
// server's defaults after the store wrote through it.
func TestNoSessionSettings(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	s := open(t, srv.CreateDB(t, "nosession")+"&pool_max_conns=1", backends.Options{Sync: queuecore.SyncOff})
	if err := s.PutQueue(ctx, testQueue("q")); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: readyMsg(1, "q", "m")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LeaseNext(ctx, "q", nil, func(m queuecore.Message) queuecore.Message { return m }); err != nil {
		t.Fatal(err)
	}
	for setting, want := range map[string]string{"synchronous_commit": "on", "idle_in_transaction_session_timeout": "0"} {
		var got string
		if err := s.pool.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got); err != nil || got != want {
			t.Errorf("%s on the pool's connection after the store's writes = %q, %v; want the server's %q", setting, got, err, want)
		}
		if in := txSetting(t, s, setting); in == want {
			t.Errorf("%s in the store's transactions = %q, the server's default", setting, in)
		}
	}
}
