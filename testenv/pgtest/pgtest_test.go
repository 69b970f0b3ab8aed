package pgtest

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
