package pgtest

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"yirangmq/testenv"
)

func query(t *testing.T, url string) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.Background())
	var n int
	err = c.QueryRow(ctx, "SELECT 41 + 1").Scan(&n)
	return n, err
}

// TestServer: a server answers on its socket and on TCP, makes databases,
// survives Stop and Start, Kill and Start, and is gone after Close.
func TestServer(t *testing.T) {
	s := Start(t)
	url := s.CreateDB(t, "one")
	for _, u := range []string{url, s.TCPURL("one")} {
		if n, err := query(t, u); err != nil || n != 42 {
			t.Fatalf("query %s = %d, %v", u, n, err)
		}
	}
	if u, err := s.EnsureDB(context.Background(), "one"); err != nil || u != url {
		t.Errorf("EnsureDB of an existing database = %q, %v", u, err)
	}
	s.Restart(t)
	if _, err := query(t, url); err != nil {
		t.Fatalf("after Restart: %v", err)
	}
	s.Kill()
	if _, err := query(t, url); err == nil {
		t.Fatal("the server answers after Kill")
	}
	if err := s.Start(); err != nil {
		t.Fatalf("Start after Kill: %v", err)
	}
	if _, err := query(t, url); err != nil {
		t.Fatalf("after Kill and Start: %v", err)
	}
	pid := s.cmd.Process.Pid
	s.Close()
	if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("processes of the server are left after Close: %v", err)
	}
	if _, err := os.Stat(s.Dir()); !os.IsNotExist(err) {
		t.Errorf("the server's directory is left after Close: %v", err)
	}
}

// TestAttach: a server exported to the environment is attached to, and
// never stopped, by Start.
func TestAttach(t *testing.T) {
	s := Start(t)
	s.Export(t)
	a := Start(t)
	if a.URL("x") != s.URL("x") {
		t.Errorf("attached URL %s, want %s", a.URL("x"), s.URL("x"))
	}
	a.Close()
	if err := a.Stop(); err == nil {
		t.Error("Stop of an attached server succeeded")
	}
	if _, err := query(t, s.URL("postgres")); err != nil {
		t.Errorf("the server is gone after the attached one was closed: %v", err)
	}
}

// TestListenAddresses: a server started with more listen addresses
// answers on them, to the clients of its trusted networks only; one that
// cannot listen on an address fails to start.
func TestListenAddresses(t *testing.T) {
	// 127.0.0.0/8 is the loopback interface's: 127.0.0.2 needs no setup,
	// and a client bound to 127.0.0.3 connects from there.
	s := StartWith(t, Options{ListenAddresses: []string{"127.0.0.2"}, TrustNets: []string{"127.0.0.3/32"}})
	url := s.CreateDB(t, "one")
	from := func(local string) (int, error) {
		cfg, err := pgx.ParseConfig(s.TCPURLAt("127.0.0.2", "one"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.DialFunc = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}).DialContext
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return 0, err
		}
		defer c.Close(context.Background())
		var n int
		err = c.QueryRow(ctx, "SELECT 41 + 1").Scan(&n)
		return n, err
	}
	if n, err := from("127.0.0.3"); err != nil || n != 42 {
		t.Errorf("from a trusted network to the extra address: %d, %v", n, err)
	}
	if _, err := from("127.0.0.4"); err == nil || !strings.Contains(err.Error(), "pg_hba.conf") {
		t.Errorf("from an untrusted network: %v, want a pg_hba.conf refusal", err)
	}
	for _, u := range []string{url, s.TCPURL("one")} {
		if n, err := query(t, u); err != nil || n != 42 {
			t.Errorf("query %s = %d, %v", u, n, err)
		}
	}
	s.Restart(t)
	if n, err := from("127.0.0.3"); err != nil || n != 42 {
		t.Errorf("after Restart: %d, %v", n, err)
	}

	// 192.0.2.1 (TEST-NET-1) is no address of this host.
	if s, err := NewWith(Options{ListenAddresses: []string{"192.0.2.1"}}); err == nil {
		s.Close()
		t.Error("a server started without its listen address")
	} else if !strings.Contains(err.Error(), "could not bind") {
		t.Errorf("start without the listen address: %v, want could not bind", err)
	}
	if _, err := NewWith(Options{TrustNets: []string{"10.0.0.1"}}); err == nil {
		t.Error("a trusted network that is no CIDR was taken")
	}
}

// TestBouncer: a PgBouncer in session mode keeps a client's server
// session and resets it when the client leaves (its advisory locks go);
// one in transaction mode does not (a session advisory lock stays on the
// server session it landed on, whatever becomes of the client: why the
// duty needs a session); both come back after Stop and Start.
func TestBouncer(t *testing.T) {
	s := Start(t)
	s.CreateDB(t, "bounced")
	ctx := context.Background()
	tx := StartBouncer(t, s, Transaction)
	sess := StartBouncer(t, s, Session)
	direct, err := pgx.Connect(ctx, s.URL("bounced"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	free := func(key int) bool {
		var got bool
		if err := direct.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got {
			if _, err := direct.Exec(ctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
				t.Fatal(err)
			}
		}
		return got
	}
	for key, b := range map[int]*Bouncer{1: sess, 2: tx} {
		c, err := pgx.Connect(ctx, b.URL("bounced")+"&default_query_exec_mode=cache_describe")
		if err != nil {
			t.Fatal(err)
		}
		var pids [2]int
		for i := range pids {
			if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pids[i]); err != nil {
				t.Fatal(err)
			}
		}
		if pids[0] != pids[1] {
			t.Errorf("%s mode: one idle client's two queries ran on server sessions %v", b.Mode(), pids)
		}
		var got bool
		if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil || !got {
			t.Fatalf("%s mode: lock: %v, %v", b.Mode(), got, err)
		}
		c.Close(ctx)
		released := testenv.RetryUntil(3*time.Second, func() bool { return free(key) })
		if want := b.Mode() == Session; released != want {
			t.Errorf("%s mode: the advisory lock of a client that left released: %v, want %v", b.Mode(), released, want)
		}
	}
	for _, b := range []*Bouncer{tx, sess} {
		if err := b.Stop(); err != nil {
			t.Fatal(err)
		}
		if n, err := query(t, b.URL("bounced")+"&default_query_exec_mode=simple_protocol&connect_timeout=2"); err == nil {
			t.Errorf("%s bouncer answers (%d) after Stop", b.Mode(), n)
		}
		if err := b.Start(); err != nil {
			t.Fatal(err)
		}
		if _, err := query(t, b.URL("bounced")+"&default_query_exec_mode=simple_protocol"); err != nil {
			t.Errorf("%s bouncer after Start: %v", b.Mode(), err)
		}
	}
}
