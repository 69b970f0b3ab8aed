package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"yirangmq/backends"
	"yirangmq/queuecore"
	"yirangmq/testenv"
)

// Tests of what is particular to the SQLite store; the behaviour every
// store shares is checked by backendtest (conformance_test.go).

func openTest(t testing.TB, dir string, sync queuecore.SyncMode) *Store {
	t.Helper()
	return openTuned(t, dir, sync, config{})
}

func openTuned(t testing.TB, dir string, sync queuecore.SyncMode, tun config) *Store {
	t.Helper()
	s, err := open(context.Background(), dir, backends.Options{Sync: sync, Holder: "test " + t.Name()}, tun)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func newTestStore(t testing.TB, sync queuecore.SyncMode, queues ...string) *Store {
	t.Helper()
	return newTunedStore(t, sync, config{}, queues...)
}

func newTunedStore(t testing.TB, sync queuecore.SyncMode, tun config, queues ...string) *Store {
	t.Helper()
	s := openTuned(t, t.TempDir(), sync, tun)
	for _, q := range queues {
		if err := s.PutQueue(context.Background(), queuecore.QueueInfo{Name: q, Policy: []byte("{}"), Mode: 0o700}); err != nil {
			t.Fatalf("PutQueue(%q): %v", q, err)
		}
	}
	return s
}

// message is a ready message named name with ID id.
func message(id uint64, queue, name string) queuecore.Message {
	now := time.Unix(1_768_000_000, int64(id))
	return queuecore.Message{
		ID: id, Queue: queue, Name: name, State: queuecore.StateReady, Seq: id,
		MessageID: "mid-" + name, PublishedAt: now, FirstAt: now, StateAt: now,
	}
}

func insert(id uint64, queue, name string) []queuecore.Op {
	return []queuecore.Op{{Kind: queuecore.OpInsert, Msg: message(id, queue, name), Body: []byte("body " + name)}}
}

// onWriter runs f with the writer, as a leader would.
func onWriter(s *Store, f func(w *writer)) {
	w := s.takeWriter()
	defer s.giveWriter()
	f(w)
}

// countCommits counts the transactions the writer commits from now on.
func countCommits(s *Store) *atomic.Int64 {
	var n atomic.Int64
	onWriter(s, func(w *writer) {
		w.conn.RegisterCommitHook(func() int { n.Add(1); return 0 })
	})
	return &n
}

// waitPending waits until n batches are queued for the group commit.
func waitPending(t *testing.T, s *Store, n int) {
	t.Helper()
	got := 0
	if !testenv.RetryUntil(10*time.Second, func() bool {
		s.groupMu.Lock()
		got = len(s.pending)
		s.groupMu.Unlock()
		return got >= n
	}) {
		t.Fatalf("%d batches queued after 10s, want %d", got, n)
	}
}

func TestPragmas(t *testing.T) {
	for _, c := range []struct {
		mode queuecore.SyncMode
		want int64 // PRAGMA synchronous: 0 OFF, 1 NORMAL, 2 FULL (SyncFull syncs the WAL itself: lazysync.go)
	}{{queuecore.SyncStrict, 2}, {queuecore.SyncFull, 1}, {queuecore.SyncNormal, 1}, {queuecore.SyncOff, 0}} {
		t.Run(c.mode.String(), func(t *testing.T) {
			s := newTestStore(t, c.mode)
			onWriter(s, func(w *writer) {
				for _, p := range []struct {
					pragma string
					want   any
				}{
					{"journal_mode", "wal"},
					{"synchronous", c.want},
					{"foreign_keys", int64(1)},
					{"busy_timeout", busyTimeout.Milliseconds()},
					{"cache_size", int64(-writerCacheKiB)},
					{"temp_store", int64(2)},
					{"wal_autocheckpoint", int64(walAutocheckpoint)},
					{"user_version", int64(schemaVersion)},
				} {
					got, err := queryValue(w.conn, "PRAGMA "+p.pragma)
					if err != nil || got != p.want {
						t.Errorf("writer: PRAGMA %s = %v (%T), %v; want %v", p.pragma, got, got, err, p.want)
					}
				}
			})
			for _, p := range []struct {
				pragma string
				want   any
			}{
				{"journal_mode", "wal"},
				{"synchronous", c.want},
				{"query_only", int64(1)},
				{"cache_size", int64(-readerCacheKiB)},
			} {
				var got any
				if err := s.db.QueryRow("PRAGMA " + p.pragma).Scan(&got); err != nil || got != p.want {
					t.Errorf("reader: PRAGMA %s = %v (%T), %v; want %v", p.pragma, got, got, err, p.want)
				}
			}
		})
	}
}

var tableScan = regexp.MustCompile(`SCAN messages($|;)`)

// TestQueryPlans: every read the core makes per operation is an index
// search, never a scan or a sort, so that it stays O(log n) in a queue of
// a million messages.
func TestQueryPlans(t *testing.T) {
	s := newTestStore(t, queuecore.SyncNormal)
	for _, c := range []struct {
		sql, index string
		args       []driver.Value
	}{
		{sqlLookup(0), "messages_name", []driver.Value{"q", "m"}},
		{sqlLookup(1), "messages_name", []driver.Value{"q", "m"}},
		{sqlList(queuecore.StateReady), "messages_order", []driver.Value{"q"}},
		{sqlList(queuecore.StateLeased), "messages_order", []driver.Value{"q"}},
		{sqlList(queuecore.StateDelayed), "messages_order", []driver.Value{"q"}},
		{sqlList(queuecore.StateDead), "messages_order", []driver.Value{"q"}},
		{sqlList(queuecore.StateArchived), "messages_order", []driver.Value{"q"}},
		{sqlDue, "messages_due", []driver.Value{int64(1), int64(10)}},
		{sqlNextDue, "messages_due", nil},
		{sqlBody, "INTEGER PRIMARY KEY", []driver.Value{int64(1)}},
		// Counts walks messages_order (grouped in its order, no sort held
		// in memory, which temp_store=MEMORY would put on the heap).
		{sqlCounts, "messages_order", nil},
	} {
		var plan []string
		args := make([]any, len(c.args))
		for i, a := range c.args {
			args[i] = a
		}
		err := func() error {
			rows, err := s.db.Query("EXPLAIN QUERY PLAN "+c.sql, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id, parent, notUsed int64
				var detail string
				if err := rows.Scan(&id, &parent, &notUsed, &detail); err != nil {
					return err
				}
				plan = append(plan, detail)
			}
			return rows.Err()
		}()
		if err != nil {
			t.Fatalf("explain %q: %v", c.sql, err)
		}
		joined := strings.Join(plan, "; ")
		t.Logf("%s: %s", c.index, joined)
		// A SCAN of messages_due is its walk in order, stopped by LIMIT.
		if !strings.Contains(joined, c.index) || strings.Contains(joined, "TEMP B-TREE") || tableScan.MatchString(joined) {
			t.Errorf("plan of %q = %q, want a search of %s without a sort", c.sql, joined, c.index)
		}
	}
}

// TestGroupCommit: batches queued while a commit is in flight go together
// in the next transaction.
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, queuecore.SyncFull, "q")
	commits := countCommits(s)

	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	s.takeWriter() // as if a commit were in flight
	for i := range n {
		wg.Go(func() {
			id := uint64(i + 1)
			errs[i] = s.Apply(ctx, insert(id, "q", fmt.Sprintf("m%d", id)))
		})
	}
	waitPending(t, s, n)
	s.giveWriter()
	wg.Wait()

	for i, err := range errs {
		if err != nil {
			t.Errorf("Apply %d: %v", i, err)
		}
	}
	if got := commits.Load(); got != 1 {
		t.Errorf("%d batches queued together took %d commits, want 1", n, got)
	}
	for i := range n {
		if _, err := s.Lookup(ctx, "q", fmt.Sprintf("m%d", i+1), false); err != nil {
			t.Errorf("Lookup m%d: %v", i+1, err)
		}
	}
}

// TestGroupCommitFailure: a batch that fails inside a group is rolled back
// alone (to its savepoint); the others commit, in the same transaction.
func TestGroupCommitFailure(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, queuecore.SyncFull, "q")
	if err := s.Apply(ctx, insert(1, "q", "taken")); err != nil {
		t.Fatal(err)
	}
	commits := countCommits(s)

	type call struct {
		ops  []queuecore.Op
		want error
	}
	twoOps := func(first, second []queuecore.Op) []queuecore.Op { return append(first, second...) }
	calls := []call{
		{insert(10, "q", "a"), nil},
		// The first op of this batch succeeds, then its second fails: the
		// savepoint must take the first back too.
		{twoOps(insert(11, "q", "b"), insert(12, "q", "taken")), queuecore.ErrExists},
		{insert(13, "q", "c"), nil},
		{insert(14, "nope", "d"), queuecore.ErrNotFound},
		{[]queuecore.Op{{Kind: queuecore.OpDelete, Msg: queuecore.Message{ID: 99}}}, queuecore.ErrNotFound},
		{twoOps(insert(15, "q", "e"), insert(16, "q", "f")), nil},
		// Batches of one statement have no savepoint: SQLite undoes the
		// failing statement alone, and the group goes on.
		{insert(17, "q", "taken"), queuecore.ErrExists},
		{[]queuecore.Op{{Kind: queuecore.OpUpdate, Msg: message(10, "q", "taken")}}, queuecore.ErrExists},
		{[]queuecore.Op{{Kind: queuecore.OpUpdate, Msg: message(13, "q", "c2")}}, nil},
		{[]queuecore.Op{{Kind: queuecore.OpUpdate, Msg: message(98, "q", "g")}}, queuecore.ErrNotFound},
	}
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	s.takeWriter()
	for i, c := range calls {
		wg.Go(func() { errs[i] = s.Apply(ctx, c.ops) })
		waitPending(t, s, i+1) // queue them in order
	}
	s.giveWriter()
	wg.Wait()

	for i, c := range calls {
		if c.want == nil && errs[i] != nil || c.want != nil && !errors.Is(errs[i], c.want) {
			t.Errorf("batch %d: Apply = %v, want %v", i, errs[i], c.want)
		}
	}
	if got := commits.Load(); got != 1 {
		t.Errorf("group took %d commits, want 1", got)
	}
	for name, want := range map[string]bool{"a": true, "b": false, "c": false, "c2": true, "d": false, "e": true, "f": true, "g": false, "taken": true} {
		m, err := s.Lookup(ctx, "q", name, false)
		switch {
		case want && err != nil:
			t.Errorf("Lookup(%s): %v", name, err)
		case !want && !errors.Is(err, queuecore.ErrNotFound):
			t.Errorf("Lookup(%s) = message %d, %v; want ErrNotFound", name, m.ID, err)
		}
	}
	if _, err := s.Body(ctx, 11); !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("Body(11) of the failed batch: %v, want ErrNotFound", err)
	}
	if m, err := s.Lookup(ctx, "q", "taken", false); err != nil || m.ID != 1 {
		t.Errorf("Lookup(taken) = message %d, %v; want message 1", m.ID, err)
	}
	// The writer is out of any transaction and takes the next batch.
	if err := s.Apply(ctx, insert(20, "q", "after")); err != nil {
		t.Errorf("Apply after the group: %v", err)
	}
}

// TestGroupCommitConcurrent: with 8 goroutines applying in SyncFull, the
// store commits fewer transactions than batches.
func TestGroupCommitConcurrent(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, queuecore.SyncFull, "q")
	commits := countCommits(s)
	const workers, each = 8, 40
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				id := uint64(w*each + i + 1)
				if err := s.Apply(ctx, insert(id, "q", strconv.FormatUint(id, 10))); err != nil {
					t.Errorf("Apply %d: %v", id, err)
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	got := commits.Load()
	t.Logf("%d batches in %d commits", workers*each, got)
	if got >= workers*each {
		t.Errorf("%d concurrent batches took %d commits: no group commit", workers*each, got)
	}
	c, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := c["q"][queuecore.StateReady].N; n != workers*each-failed.Load() {
		t.Errorf("ready = %d, want %d", n, workers*each)
	}
}

// TestReadDuringCommit: a reader does not wait for a transaction in
// progress, and does not see it until it commits.
func TestReadDuringCommit(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, queuecore.SyncFull, "q", "other")
	if err := s.Apply(ctx, insert(1, "other", "x")); err != nil {
		t.Fatal(err)
	}
	onWriter(s, func(w *writer) {
		if _, err := w.exec(w.begin, nil); err != nil {
			t.Fatal(err)
		}
		if err := w.apply(&insert(2, "q", "uncommitted")[0], false); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := s.Lookup(ctx, "other", "x", false)
			if err == nil {
				_, err = s.Lookup(ctx, "q", "uncommitted", false)
				if !errors.Is(err, queuecore.ErrNotFound) {
					err = fmt.Errorf("uncommitted message visible: %v", err)
				} else {
					err = nil
				}
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("a read waited for the writer's open transaction")
		}
		if _, err := w.exec(w.commit, nil); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := s.Lookup(ctx, "q", "uncommitted", false); err != nil {
		t.Errorf("after commit: %v", err)
	}
}

// TestLocked: a second Open of a store in use fails at once, naming the
// holder; a failed Open releases the lock it took.
func TestLocked(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, dir, backends.Options{Holder: "mount /mnt/mq"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, dir, backends.Options{})
	if !errors.Is(err, queuecore.ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	for _, want := range []string{strconv.Itoa(os.Getpid()), "mount /mnt/mq"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("second Open error %q does not say %q", err, want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.Apply(ctx, insert(1, "q", "late")); !errors.Is(err, queuecore.ErrClosed) {
		t.Errorf("Apply after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Lookup(ctx, "q", "late", false); !errors.Is(err, queuecore.ErrClosed) {
		t.Errorf("Lookup after Close = %v, want ErrClosed", err)
	}

	// A store SQLite cannot open: Open fails and leaves the lock free.
	bad := t.TempDir()
	if err := os.Mkdir(filepath.Join(bad, FileName), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, bad, backends.Options{}); err == nil {
		t.Fatal("Open of a store whose database is a directory succeeded")
	}
	l, err := backends.LockStore(bad, "after")
	if err != nil {
		t.Fatalf("lock after a failed Open: %v", err)
	}
	l.Unlock()
}

// TestNewerSchema: a store written by a newer version is refused.
func TestNewerSchema(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncNormal)
	onWriter(s, func(w *writer) {
		if _, err := w.conn.Exec("PRAGMA user_version = 99", nil); err != nil {
			t.Fatal(err)
		}
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), dir, backends.Options{})
	if err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("Open of a newer store = %v, want a schema version error", err)
	}
}

// TestCloseWaits: Close waits for an Apply in flight, checkpoints the WAL
// into the database file and leaves a store that reopens with the batch.
func TestCloseWaits(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, dir, backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	s.takeWriter() // hold the Apply below in the queue
	applied := make(chan error, 1)
	go func() { applied <- s.Apply(ctx, insert(1, "q", "m")) }()
	waitPending(t, s, 1)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the Apply in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	s.giveWriter()
	if err := <-applied; err != nil {
		t.Errorf("Apply in flight during Close: %v", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, FileName+"-wal")); err == nil && fi.Size() > 0 {
		t.Errorf("WAL holds %d bytes after Close, want it checkpointed", fi.Size())
	}
	s = openTest(t, dir, queuecore.SyncFull)
	if _, err := s.Lookup(ctx, "q", "m", false); err != nil {
		t.Errorf("after reopen: %v", err)
	}
}

// TestMaxIDAfterDelete: the triggers keep the high-water mark of deleted
// messages, also when Seq is the larger, and across DeleteQueue; they raise
// it to the end of a block of 1024 IDs, so that acks of the newest message
// do not write it every time.
func TestMaxIDAfterDelete(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, queuecore.SyncNormal, "q")
	hwm := func() int64 {
		var v int64
		onWriter(s, func(w *writer) {
			var err error
			if v, err = queryInt(w.conn, "SELECT hwm FROM meta"); err != nil {
				t.Fatal(err)
			}
		})
		return v
	}
	wantMaxID := func(want uint64) {
		t.Helper()
		if n, err := s.MaxID(ctx); err != nil || n != want {
			t.Errorf("MaxID = %d, %v; want %d", n, err, want)
		}
	}
	m := message(3, "q", "m")
	m.Seq = 40
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: m}}); err != nil {
		t.Fatal(err)
	}
	wantMaxID(40)
	m.Seq = 7 // an update that lowers Seq: 40 is gone from the table
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: m}}); err != nil {
		t.Fatal(err)
	}
	if got := hwm(); got != 1023 {
		t.Errorf("hwm after lowering Seq 40 = %d, want 1023", got)
	}
	wantMaxID(1023)
	if err := s.Apply(ctx, insert(2000, "q", "n")); err != nil {
		t.Fatal(err)
	}
	wantMaxID(2000)
	if err := s.Apply(ctx, insert(1500, "q", "o")); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpDelete, Msg: queuecore.Message{ID: 1500}}}); err != nil {
		t.Fatal(err)
	}
	if got := hwm(); got != 2047 {
		t.Errorf("hwm after deleting 1500 = %d, want 2047", got)
	}
	if err := s.DeleteQueue(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if got := hwm(); got != 2047 {
		t.Errorf("hwm after DeleteQueue = %d, want 2047", got)
	}
	wantMaxID(2047)
}

// TestListOrderAndStop: List gives a queue's messages in delivery order
// (priority, then FIFO) and stops where fn says.
func TestListOrderAndStop(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, queuecore.SyncNormal, "q")
	const n = 40
	var ops []queuecore.Op
	for i := range n {
		m := message(uint64(i+1), "q", fmt.Sprintf("m%03d", i))
		m.Priority = i % 3 // ready order: priority 2 first, then 1, then 0, FIFO within
		ops = append(ops, queuecore.Op{Kind: queuecore.OpInsert, Msg: m})
	}
	if err := s.Apply(ctx, ops); err != nil {
		t.Fatal(err)
	}
	var want []uint64
	for p := 2; p >= 0; p-- {
		for i := range n {
			if i%3 == p {
				want = append(want, uint64(i+1))
			}
		}
	}
	var got []uint64
	err := s.List(ctx, "q", queuecore.StateReady, func(m queuecore.Message) bool {
		got = append(got, m.ID)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("List = %v\nwant   %v", got, want)
	}
	for _, stop := range []int{1, 2, 17} {
		calls := 0
		if err := s.List(ctx, "q", queuecore.StateReady, func(queuecore.Message) bool { calls++; return calls < stop }); err != nil {
			t.Fatal(err)
		}
		if calls != stop {
			t.Errorf("List stopped at message %d, want %d", calls, stop)
		}
	}
	if st := s.db.Stats(); st.InUse != 0 {
		t.Errorf("%d readers still in use after the Lists", st.InUse)
	}
}

// TestReadAllocs: a read allocates the row it returns and little else.
// It guards the prepared statements: a statement that SQLite prepares
// again at every execution (see sqlList) shows here as some 50 more
// allocations, for the column metadata go-sqlite3 then reads again.
func TestReadAllocs(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t, queuecore.SyncNormal, "q")
	m := message(1, "q", "m")
	m.State, m.Deadline = queuecore.StateLeased, time.Unix(1_800_000_000, 0)
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: m, Body: []byte("body")}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		read func() error
	}{
		{"Lookup", func() error { _, err := s.Lookup(ctx, "q", "m", false); return err }},
		{"List", func() error {
			return s.List(ctx, "q", queuecore.StateLeased, func(queuecore.Message) bool { return false })
		}},
		{"Due", func() error { _, err := s.Due(ctx, time.Unix(1_900_000_000, 0), 1); return err }},
		{"NextDue", func() error { _, _, err := s.NextDue(ctx); return err }},
		{"Body", func() error { _, err := s.Body(ctx, 1); return err }},
	} {
		var err error
		n := testing.AllocsPerRun(100, func() {
			if e := c.read(); e != nil {
				err = e
			}
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("%s: %.0f allocations", c.name, n)
		if n > 30 {
			t.Errorf("%s makes %.0f allocations, want at most 30: is a statement prepared again at every call?", c.name, n)
		}
	}
}
