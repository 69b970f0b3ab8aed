package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"yirangmq/backends"
	"yirangmq/queuecore"
	"yirangmq/testenv"
	"yirangmq/testenv/pgtest"
)

func testQueue(name string) queuecore.QueueInfo {
	return queuecore.QueueInfo{Name: name, Policy: []byte(`{}`), UID: 1, GID: 2, Mode: 0o755, CreatedAt: time.Unix(1, 5)}
}

func readyMsg(id uint64, q, name string) queuecore.Message {
	return queuecore.Message{ID: id, Queue: q, Name: name, State: queuecore.StateReady, Seq: id, StateAt: time.Unix(0, int64(id))}
}

// TestPayload: hints round-trip whatever bytes the names hold, and a batch
// too long for one notification, or with a change that does not say
// where, becomes a resync.
func TestPayload(t *testing.T) {
	s := &Store{origin: "abc"}
	changes := []queuecore.Change{
		{Queue: "q", Name: "plain", To: queuecore.StateReady},
		{Queue: "q.2", Name: "sp ace \"quote\" \\ \n\t\xff\xfe ünï", From: queuecore.StateLeased, To: queuecore.StateDead},
		{Queue: "q", From: queuecore.StateArchived},
	}
	p := s.payload(changes)
	for i := range len(p) {
		if p[i] >= 0x80 {
			t.Fatalf("payload %q holds a non-ASCII byte", p)
		}
	}
	origin, got, err := parsePayload(p)
	if err != nil || origin != "abc" || !slices.Equal(got, changes) {
		t.Errorf("parsePayload(%q) = %q, %v, %v; want abc, %v", p, origin, got, err, changes)
	}

	resync := []queuecore.Change{{}}
	var long []queuecore.Change
	for i := range 200 {
		long = append(long, queuecore.Change{Queue: "queue", Name: fmt.Sprintf("%060d", i), To: queuecore.StateReady})
	}
	for name, cs := range map[string][]queuecore.Change{
		"too long":   long,
		"no queue":   {{Queue: "q", Name: "a"}, {Name: "b"}},
		"empty name": {{Queue: "", Name: ""}},
	} {
		p := s.payload(cs)
		if len(p) > maxPayload {
			t.Errorf("%s: payload of %d bytes", name, len(p))
		}
		if _, got, err := parsePayload(p); err != nil || !slices.Equal(got, resync) {
			t.Errorf("%s: parsePayload = %v, %v; want a resync", name, got, err)
		}
	}
	for _, bad := range []string{"", "yq2 abc\n", "yq1\n", "yq1 abc\n1 2 \"q\"", "yq1 abc\n1 x \"q\" \"n\"", "yq1 abc\n1 2 q n",
		"yq1 abc\n1 2 \"\" \"n\"", "yq1 abc\n1 2 \"q\" \"n"} {
		if _, _, err := parsePayload(bad); err == nil {
			t.Errorf("parsePayload(%q) succeeded", bad)
		}
	}
}

// TestNames: message names and strings with any bytes (invalid UTF-8,
// NUL), which a text column would refuse, round-trip.
func TestNames(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	s := open(t, srv.CreateDB(t, "names"), backends.Options{})
	if err := s.PutQueue(ctx, testQueue("q")); err != nil {
		t.Fatal(err)
	}
	m := readyMsg(1, "q", "bad \xff\xfe utf-8 \n")
	m.ReasonMessage, m.Consumer, m.DedupKey, m.MessageID = "nul \x00 byte", "\xc3", "\x00", "é"
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: m, Body: []byte("\x00\xff")}}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	got, err := s.Lookup(ctx, "q", m.Name, false)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if got.Name != m.Name || got.ReasonMessage != m.ReasonMessage || got.Consumer != m.Consumer ||
		got.DedupKey != m.DedupKey || got.MessageID != m.MessageID {
		t.Errorf("Lookup = %+v, want %+v", got, m)
	}
	if _, err := s.Lookup(ctx, "q", "bad \xff\xfe utf-8 ", false); !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("Lookup of a prefix of the name = %v, want ErrNotFound", err)
	}
	// The store answers bad input with errors, not panics.
	if err := s.List(ctx, "q", 0, func(queuecore.Message) bool { return true }); err == nil {
		t.Error("List of state 0 succeeded")
	}
	if err := s.Apply(ctx, []queuecore.Op{{Kind: 9, Msg: m}}); err == nil {
		t.Error("Apply of an op of kind 9 succeeded")
	}
	if _, err := s.LeaseNext(ctx, "q", nil, func(m queuecore.Message) queuecore.Message { m.ID++; return m }); err == nil {
		t.Error("LeaseNext whose change changes the ID succeeded")
	}
	if _, err := s.Lookup(ctx, "q", m.Name, false); err != nil {
		t.Errorf("the message is gone after a refused LeaseNext: %v", err)
	}
	if err := s.DeleteQueue(ctx, "nonexistent"); !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("DeleteQueue of an unknown queue = %v, want ErrNotFound", err)
	}
}

// TestOpenForms: a key=value DSN and a loopback TCP URL open the store; a
// bad URL and an unreachable server fail at once with what failed.
func TestOpenForms(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	srv.CreateDB(t, "forms")
	dsn := fmt.Sprintf("host=%s port=%d user=%s dbname=forms sslmode=disable", srv.Dir(), srv.Port(), pgtest.User)
	s1 := open(t, dsn, backends.Options{})
	s2 := open(t, srv.TCPURL("forms"), backends.Options{Sync: queuecore.SyncOff})
	if err := s1.PutQueue(ctx, testQueue("q")); err != nil {
		t.Fatal(err)
	}
	if qs, err := s2.Queues(ctx); err != nil || len(qs) != 1 || qs[0].Name != "q" {
		t.Errorf("Queues over TCP = %v, %v", qs, err)
	}
	for _, c := range []struct {
		s    *Store
		want string
	}{{s1, "on"}, {s2, "off"}} {
		if got := txSetting(t, c.s, "synchronous_commit"); got != c.want {
			t.Errorf("synchronous_commit in a transaction of the store = %q, want %q", got, c.want)
		}
	}

	for _, url := range []string{"postgres://%zz", "host=" + t.TempDir() + " port=1 user=x dbname=y connect_timeout=1",
		"postgres://u:secret@127.0.0.1:1/db?connect_timeout=1"} {
		start := time.Now()
		s, err := Open(ctx, url, backends.Options{})
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", url)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("Open error shows the password: %v", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("Open(%q) took %v to fail", url, d)
		}
		t.Logf("Open(%q): %v", url, err)
	}
}

// TestOpenConcurrently: daemons starting at once on a new database all
// open it (the schema lock).
func TestOpenConcurrently(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.CreateDB(t, "together")
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			s, err := Open(context.Background(), url, backends.Options{})
			if err != nil {
				t.Errorf("Open: %v", err)
				return
			}
			s.Close()
		})
	}
	wg.Wait()
}

// TestUnreachable stops the server under two open stores: every method
// fails, promptly, with an error that is not a Store sentinel; duty is
// dropped; the logs do not flood. After a restart the stores work again,
// the listeners deliver a resync, hints flow and one store takes the duty.
func TestUnreachable(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	url := srv.CreateDB(t, "unreachable")
	var logs logRecorder
	s1 := open(t, url, backends.Options{Logger: slog.New(&logs)})
	s2 := open(t, url, backends.Options{})
	var heard changeLog
	s1.Subscribe(heard.add)
	if err := s2.PutQueue(ctx, testQueue("q")); err != nil {
		t.Fatal(err)
	}
	if err := s2.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: readyMsg(1, "q", "m1")}}); err != nil {
		t.Fatal(err)
	}
	heard.waitFor(t, queuecore.Change{Queue: "q", Name: "m1", To: queuecore.StateReady})
	testenv.MustRetryUntil(t, 10*time.Second, "one store takes the duty", func() bool { return s1.Duty() != s2.Duty() })

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(s *Store) error{
		"Queues":      func(s *Store) error { _, err := s.Queues(ctx); return err },
		"PutQueue":    func(s *Store) error { return s.PutQueue(ctx, testQueue("r")) },
		"DeleteQueue": func(s *Store) error { return s.DeleteQueue(ctx, "q") },
		"Apply": func(s *Store) error {
			return s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: readyMsg(2, "q", "m2")}})
		},
		"Lookup": func(s *Store) error { _, err := s.Lookup(ctx, "q", "m1", false); return err },
		"Body":   func(s *Store) error { _, err := s.Body(ctx, 1); return err },
		"List": func(s *Store) error {
			return s.List(ctx, "q", queuecore.StateReady, func(queuecore.Message) bool { return true })
		},
		"Due":        func(s *Store) error { _, err := s.Due(ctx, time.Now(), 10); return err },
		"NextDue":    func(s *Store) error { _, _, err := s.NextDue(ctx); return err },
		"Counts":     func(s *Store) error { _, err := s.Counts(ctx); return err },
		"MaxID":      func(s *Store) error { _, err := s.MaxID(ctx); return err },
		"ReserveIDs": func(s *Store) error { _, err := s.ReserveIDs(ctx, 10); return err },
		"LeaseNext": func(s *Store) error {
			_, err := s.LeaseNext(ctx, "q", nil, func(m queuecore.Message) queuecore.Message { return m })
			return err
		},
	}
	names := slices.Sorted(maps.Keys(calls))
	for _, name := range names {
		for i, s := range []*Store{s1, s2} {
			start := time.Now()
			err := calls[name](s)
			d := time.Since(start)
			switch {
			case err == nil:
				t.Errorf("%s on store %d succeeded with the server stopped", name, i+1)
			case errors.Is(err, queuecore.ErrNotFound) || errors.Is(err, queuecore.ErrExists) || errors.Is(err, queuecore.ErrEmpty):
				t.Errorf("%s on store %d: %v; want an error that is no Store sentinel", name, i+1, err)
			case d > 10*time.Second:
				t.Errorf("%s on store %d took %v to fail", name, i+1, d)
			}
			if i == 0 {
				t.Logf("%s: %v (after %v)", name, err, d.Round(time.Millisecond))
			}
		}
	}
	testenv.MustRetryUntil(t, 5*time.Second, "both stores drop the duty", func() bool { return !s1.Duty() && !s2.Duty() })
	time.Sleep(3 * time.Second) // the listener and duty goroutines retry meanwhile
	for _, what := range []string{"change listener", "duty: cannot"} {
		if n := logs.count(what); n > 2 {
			t.Errorf("%d log lines about %q in a few seconds of outage:\n%s", n, what, strings.Join(logs.get(), "\n"))
		}
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	heard.waitFor(t, queuecore.Change{}) // the resync
	t.Logf("resync delivered %v after the restart", time.Since(start).Round(time.Millisecond))
	for _, name := range names {
		if name == "DeleteQueue" || name == "LeaseNext" {
			continue // below
		}
		for i, s := range []*Store{s1, s2} {
			if err := calls[name](s); err != nil && !(name == "Apply" && i == 1 && errors.Is(err, queuecore.ErrExists)) {
				t.Errorf("%s on store %d after the restart: %v", name, i+1, err)
			}
		}
	}
	if _, err := s1.LeaseNext(ctx, "q", nil, func(m queuecore.Message) queuecore.Message {
		m.State = queuecore.StateLeased
		return m
	}); err != nil {
		t.Errorf("LeaseNext after the restart: %v", err)
	}
	if err := s2.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: readyMsg(3, "q", "m3")}}); err != nil {
		t.Fatal(err)
	}
	heard.waitFor(t, queuecore.Change{Queue: "q", Name: "m3", To: queuecore.StateReady})
	testenv.MustRetryUntil(t, 10*time.Second, "one store takes the duty again", func() bool { return s1.Duty() != s2.Duty() })
	t.Logf("logs of store 1:\n%s", strings.Join(logs.get(), "\n"))
}

// changeLog records the changes a store hears.
type changeLog struct {
	mu sync.Mutex
	cs []queuecore.Change
}

func (l *changeLog) add(c queuecore.Change) {
	l.mu.Lock()
	l.cs = append(l.cs, c)
	l.mu.Unlock()
}

func (l *changeLog) get() []queuecore.Change {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.cs)
}

// waitFor waits until l has heard c.
func (l *changeLog) waitFor(t *testing.T, c queuecore.Change) {
	t.Helper()
	testenv.MustRetryUntil(t, 15*time.Second, fmt.Sprintf("hear %+v", c), func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return slices.Contains(l.cs, c)
	})
}

// TestCloseLeaksNothing: Close stops every goroutine the store started,
// also with calls in flight, and the methods of a closed store fail.
func TestCloseLeaksNothing(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	url := srv.CreateDB(t, "leaks")
	before := runtime.NumGoroutine()
	s, err := Open(ctx, url, backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Subscribe(func(queuecore.Change) {})
	if err := s.PutQueue(ctx, testQueue("q")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				id := uint64(g*100 + i + 1)
				// Errors are expected once Close has begun.
				_ = s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: readyMsg(id, "q", fmt.Sprint(id))}})
			}
		})
	}
	time.Sleep(20 * time.Millisecond) // let Close land among the commits
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Queues(ctx); err == nil {
		t.Error("Queues on a closed store succeeded")
	}
	if s.Duty() {
		t.Error("a closed store reports the duty")
	}
	testenv.MustRetryUntil(t, 5*time.Second, "goroutines back to their number before Open", func() bool {
		return runtime.NumGoroutine() <= before
	})
}
