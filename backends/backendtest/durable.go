package backendtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"yirangmq/queuecore"
)

var syncModes = []queuecore.SyncMode{queuecore.SyncFull, queuecore.SyncNormal, queuecore.SyncOff}

// testPersistence: what a store answers before Close it answers after a
// reopen, in every sync mode, after inserts, updates, deletes, a replaced
// queue and a deleted one; and again after a second round of changes, and
// when reopened in another mode.
func testPersistence(t *testing.T, open Opener) {
	for i, mode := range syncModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			s := openStore(t, open, dir, mode)
			putQueues(t, s, "a", "b", "c")
			mustApply(t, s, manyInserts(1, 60)...)
			mustApply(t, s,
				insertOp(msg(100, "a", "big", ready), randomBytes(100, 300<<10)),
				insertOp(msg(101, "a", "empty", dead), nil),
				ins(inQueue(fullMessage(), "b")),
				ins(msg(102, "c", "in-c", leased)), ins(msg(103, "c", "in-c", archived)))
			// Updates that move messages between states, queues and names.
			for id := uint64(1); id <= 60; id += 7 {
				m := withState(manyMessages(id, 1)[0], queuecore.States[id%3], at(time.Duration(id)*time.Hour))
				m.Queue, m.Name, m.Seq, m.Attempts = "c", fmt.Sprintf("moved%d", id), 1000+id, int(id)
				mustApply(t, s, upd(m))
			}
			mustApply(t, s, del(2), del(3), del(100))
			q := queueInfo("b")
			q.Policy, q.Mode = []byte(`{"paused":true}`), 0o700
			if err := s.PutQueue(ctx, q); err != nil {
				t.Fatalf("PutQueue(replace b): %v", err)
			}
			if err := s.DeleteQueue(ctx, "c"); err != nil {
				t.Fatalf("DeleteQueue(c): %v", err)
			}
			want := takeSnapshot(t, s)
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}

			s = openStore(t, open, dir, mode)
			wantSnapshot(t, "after reopen", want, takeSnapshot(t, s), true)
			wantNextDueMatches(t, s, want)

			// A second round on the reopened store.
			putQueues(t, s, "d")
			mustApply(t, s, del(4), upd(withState(withSize(msg(5, "b", "m5", dead)), archived, at(9*time.Hour))),
				ins(msg(200, "d", "m4", ready)), insertOp(msg(201, "d", "big", ready), randomBytes(201, 1<<20)))
			mustApply(t, s, del(201))
			mustApply(t, s, insertOp(msg(202, "d", "big", ready), randomBytes(202, 70000)))
			want = takeSnapshot(t, s)
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			s = openStore(t, open, dir, mode)
			wantSnapshot(t, "after the second reopen", want, takeSnapshot(t, s), true)
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}

			// The same directory opened with another sync mode.
			other := syncModes[(i+1)%len(syncModes)]
			s = openStore(t, open, dir, other)
			wantSnapshot(t, "reopened with sync "+other.String(), want, takeSnapshot(t, s), true)
		})
	}
}

func inQueue(m queuecore.Message, q string) queuecore.Message {
	m.Queue = q
	return m
}

// wantNextDueMatches checks NextDue against the earliest deadline of the
// leased and delayed messages of snap.
func wantNextDueMatches(t *testing.T, s queuecore.Store, snap *snapshot) {
	t.Helper()
	var want time.Time
	for _, m := range snap.messages() {
		if (m.State == leased || m.State == delayed) && (want.IsZero() || m.Deadline.Before(want)) {
			want = m.Deadline
		}
	}
	got, ok, err := s.NextDue(context.Background())
	if err != nil || ok != !want.IsZero() || !got.Equal(want) && ok {
		t.Errorf("NextDue = %v, %v, %v; want %v, %v", got, ok, err, want, !want.IsZero())
	}
}

// testConcurrent: 16 goroutines apply batches on disjoint messages at once
// (group commit in SyncFull); every batch succeeds and every change is seen.
func testConcurrent(t *testing.T, open Opener) {
	s := newStore(t, open)
	queues := []string{"a", "b", "c"}
	putQueues(t, s, queues...)
	const workers, rounds = 16, 8
	var (
		mu    sync.Mutex
		model = map[uint64]queuecore.Message{}
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for g := range workers {
		wg.Go(func() {
			<-start
			ctx := context.Background()
			apply := func(ops ...queuecore.Op) bool {
				if err := s.Apply(ctx, ops); err != nil {
					t.Errorf("worker %d: Apply(%s): %v", g, describeOps(ops), err)
					return false
				}
				return true
			}
			for i := range rounds {
				base := uint64(g*1000 + i*10)
				q := queues[g%len(queues)]
				m1, m2, m3 := msg(base+1, q, fmt.Sprintf("g%d-%d", g, base+1), ready),
					msg(base+2, q, fmt.Sprintf("g%d-%d", g, base+2), ready),
					msg(base+3, q, fmt.Sprintf("g%d-%d", g, base+3), ready)
				if !apply(ins(m1), ins(m2), ins(m3)) {
					return
				}
				m1 = withState(m1, leased, at(time.Duration(base)*time.Second))
				if !apply(upd(m1)) || !apply(del(m2.ID)) {
					return
				}
				m3 = withState(m3, archived, at(time.Hour))
				m3.Queue = queues[(g+1)%len(queues)]
				if !apply(upd(m3)) {
					return
				}
				mu.Lock()
				model[m1.ID], model[m3.ID] = withSize(m1), withSize(m3)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	snap := takeSnapshot(t, s)
	got := snap.messages()
	if len(got) != len(model) {
		t.Errorf("the store holds %d messages, want %d", len(got), len(model))
	}
	wantCount := map[string]map[queuecore.State]queuecore.Count{}
	for id, want := range model {
		g, ok := got[id]
		if !ok {
			t.Errorf("message %d is missing", id)
			continue
		}
		checkMessage(t, "after concurrent batches", want, g)
		if b := snap.Bodies[id]; string(b) != string(body(id)) {
			t.Errorf("Body(%d) = %s, want %s", id, abbrev(b), abbrev(body(id)))
		}
		if wantCount[want.Queue] == nil {
			wantCount[want.Queue] = map[queuecore.State]queuecore.Count{}
		}
		c := wantCount[want.Queue][want.State]
		wantCount[want.Queue][want.State] = queuecore.Count{N: c.N + 1, Bytes: c.Bytes + want.Size}
	}
	wantCounts(t, s, wantCount)
}

// testConcurrentFailure: failing batches among concurrent good ones fail
// alone, with their own error, and leave nothing behind.
func testConcurrentFailure(t *testing.T, open Opener) {
	s := newStore(t, open)
	putQueues(t, s, "a", "b")
	taken := withSize(msg(1, "a", "taken", leased))
	mustApply(t, s, ins(taken))
	const workers, rounds = 16, 8
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		mu    sync.Mutex
		good  []queuecore.Message
		bad   []queuecore.Message
	)
	for g := range workers {
		wg.Go(func() {
			<-start
			ctx := context.Background()
			for i := range rounds {
				id := uint64(100 + g*100 + i)
				m := withSize(msg(id, []string{"a", "b"}[i%2], fmt.Sprintf("m%d", id), ready))
				ops := []queuecore.Op{ins(m)}
				var want error
				if g%2 == 1 {
					switch (g/2 + i) % 4 {
					case 0:
						ops, want = append(ops, ins(msg(1, "b", "dup-id", ready))), queuecore.ErrExists
					case 1:
						ops, want = append(ops, ins(msg(id+50, "a", "taken", dead))), queuecore.ErrExists
					case 2:
						ops, want = append(ops, upd(msg(999999, "a", "x", ready))), queuecore.ErrNotFound
					case 3:
						ops, want = append(ops, del(999999)), queuecore.ErrNotFound
					}
				}
				err := s.Apply(ctx, ops)
				switch {
				case want == nil && err != nil:
					t.Errorf("worker %d: good batch %s failed: %v", g, describeOps(ops), err)
				case want != nil && !errors.Is(err, want):
					t.Errorf("worker %d: bad batch %s = %v, want %v", g, describeOps(ops), err, want)
				}
				mu.Lock()
				if want == nil {
					good = append(good, m)
				} else {
					bad = append(bad, m)
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	for _, m := range good {
		wantLookup(t, s, m)
		wantBody(t, s, m.ID, body(m.ID))
	}
	for _, m := range bad {
		wantNoLookup(t, s, m.Queue, m.Name, false)
		wantNoBody(t, s, m.ID)
	}
	wantLookup(t, s, taken)
	var n int64
	for _, ms := range takeSnapshot(t, s).Lists {
		n += int64(len(ms))
	}
	if want := int64(len(good) + 1); n != want {
		t.Errorf("the store holds %d messages, want %d", n, want)
	}
}

// testLock: one open store per directory. A second open fails at once with
// ErrLocked naming this process; the first store is unharmed; after Close
// the directory opens again.
func testLock(t *testing.T, open Opener) {
	ctx := context.Background()
	dir := t.TempDir()
	s1 := openStore(t, open, dir, queuecore.SyncFull)
	putQueues(t, s1, "a")
	m1 := withSize(msg(1, "a", "one", ready))
	mustApply(t, s1, ins(m1))

	secondOpen := func(t *testing.T) {
		t.Helper()
		done := make(chan struct{})
		var s2 queuecore.Store
		var err error
		go func() {
			defer close(done)
			s2, err = open(ctx, dir, queuecore.SyncFull)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a second open of a store in use blocks instead of failing at once")
		}
		if err == nil {
			s2.Close()
			t.Fatal("a second open of a store in use succeeded")
		}
		if !errors.Is(err, queuecore.ErrLocked) {
			t.Errorf("second open: %v, want an error wrapping ErrLocked", err)
		}
		if pid := strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), pid) {
			t.Errorf("second open: %q does not name the holder's pid %s", err, pid)
		}
	}
	secondOpen(t)

	// The failed open harmed neither the open store nor its files.
	m2 := withSize(msg(2, "a", "two", ready))
	mustApply(t, s1, ins(m2))
	wantLookup(t, s1, m1)
	if err := s1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s3 := openStore(t, open, dir, queuecore.SyncFull)
	wantLookup(t, s3, m1)
	wantLookup(t, s3, m2)
	wantBody(t, s3, 2, body(2))
	secondOpen(t) // the reopened store holds the lock again
}
