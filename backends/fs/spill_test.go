package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// listNames returns the names List gives for a queue's state, in order.
func listNames(t *testing.T, s *Store, q string, st queuecore.State) []string {
	t.Helper()
	var out []string
	if err := s.List(context.Background(), q, st, func(m queuecore.Message) bool {
		out = append(out, m.Name)
		return true
	}); err != nil {
		t.Fatalf("List(%s, %s): %v", q, st, err)
	}
	return out
}

func spillFiles(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(dir, spillDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// TestSpill publishes past a tiny spill threshold and works on the spilled
// messages through the store API: lookup, body, dedup of a taken name,
// List order (with a higher-priority message that stays in the tree),
// lease, rename, ack, a failing batch, and a reopen (which rebuilds the
// spill from the snapshot and the journal).
func TestSpill(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := config{spillAt: 4}
	s := openTest(t, dir, queuecore.SyncFull, cfg, nil)
	mustPutQueues(t, s, "q", "r")
	const n = 1000
	var want []string
	for i := uint64(1); i <= n; i++ {
		m := tmsg(i, "q", fmt.Sprintf("m%04d", i), queuecore.StateReady)
		mustApply(t, s, tins(m))
		want = append(want, m.Name)
	}
	if sp, tree := s.ix.queues["q"].spill, s.ix.queues["q"].byState[queuecore.StateReady].Len(); sp == nil || sp.live+tree != n || tree > 4+2 {
		t.Fatalf("after %d publishes: %d ready messages in the tree, spill %+v; want at most 6 in the tree", n, tree, sp)
	}
	if got := spillFiles(t, dir); len(got) != 1 {
		t.Fatalf("spill files %v, want one", got)
	}
	if got := listNames(t, s, "q", queuecore.StateReady); !slices.Equal(got, want) {
		t.Fatalf("List ready = %v\nwant %v", got, want)
	}
	m150 := tmsg(150, "q", "m0150", queuecore.StateReady)
	wantMessage(t, s, m150, tbody(150))

	// A taken name and a taken ID are refused, whether spilled or not.
	dup := tmsg(1000, "q", "m0150", queuecore.StateReady)
	if err := s.Apply(ctx, []queuecore.Op{tins(dup)}); !errors.Is(err, queuecore.ErrExists) {
		t.Errorf("insert of a spilled name: %v, want ErrExists", err)
	}
	dupID := tmsg(150, "q", "other", queuecore.StateReady)
	if err := s.Apply(ctx, []queuecore.Op{tins(dupID)}); !errors.Is(err, queuecore.ErrExists) {
		t.Errorf("insert of a spilled ID: %v, want ErrExists", err)
	}

	// A high-priority message sorts first and stays in the tree.
	hi := tmsg(n+1, "q", "hi", queuecore.StateReady)
	hi.Priority = 5
	mustApply(t, s, tins(hi))
	if got := listNames(t, s, "q", queuecore.StateReady); len(got) != n+1 || got[0] != "hi" {
		t.Fatalf("List ready after a priority publish starts %v (%d names)", got[:3], len(got))
	}

	// Lease a spilled message, rename another inside inbox/, move a third
	// to another queue, ack the leased one.
	l := tmsg(150, "q", "m0150", queuecore.StateLeased)
	mustApply(t, s, tupd(l))
	wantMessage(t, s, l, tbody(150))
	ren := tmsg(151, "q", "renamed", queuecore.StateReady)
	mustApply(t, s, tupd(ren))
	wantMessage(t, s, ren, tbody(151))
	if _, err := s.Lookup(ctx, "q", "m0151", false); !errors.Is(err, queuecore.ErrNotFound) {
		t.Errorf("Lookup of the old name of a renamed spilled message: %v", err)
	}
	mv := tmsg(152, "r", "m0152", queuecore.StateReady)
	mustApply(t, s, tupd(mv))
	wantMessage(t, s, mv, tbody(152))
	mustApply(t, s, tdel(150))
	wantGone(t, s, 150)
	// The freed name can be taken again; a batch that fails halfway
	// changes nothing.
	again := tmsg(n+2, "q", "m0150", queuecore.StateReady)
	bad := []queuecore.Op{tins(again), tdel(153), tdel(99999)}
	if err := s.Apply(ctx, bad); !errors.Is(err, queuecore.ErrNotFound) {
		t.Fatalf("failing batch: %v", err)
	}
	wantMessage(t, s, tmsg(153, "q", "m0153", queuecore.StateReady), tbody(153))
	mustApply(t, s, tins(again))
	wantMessage(t, s, again, tbody(n+2))

	check := func(s *Store) {
		t.Helper()
		var exp []string
		exp = append(exp, "hi")
		for _, w := range want {
			switch w {
			case "m0151":
				exp = append(exp, "renamed") // a rename keeps its Seq
			case "m0150", "m0152":
			default:
				exp = append(exp, w)
			}
		}
		exp = append(exp, "m0150")
		if got := listNames(t, s, "q", queuecore.StateReady); !slices.Equal(got, exp) {
			t.Errorf("List ready = %v\nwant %v", got, exp)
		}
		c, err := s.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := c["q"][queuecore.StateReady].N; got != int64(len(exp)) {
			t.Errorf("Counts ready = %d, want %d", got, len(exp))
		}
		wantMessage(t, s, tmsg(299, "q", "m0299", queuecore.StateReady), tbody(299))
		wantMessage(t, s, ren, tbody(151))
	}
	check(s)

	// Reopen after a crash (journal replay) and after a clean close
	// (snapshot): the spill is rebuilt.
	crash(t, s)
	s = openTest(t, dir, queuecore.SyncFull, cfg, nil)
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, queuecore.SyncFull, cfg, nil)
	check(s)

	// Drain: the spill goes away with its last message.
	for {
		var first queuecore.Message
		_ = s.List(ctx, "q", queuecore.StateReady, func(m queuecore.Message) bool { first = m; return false })
		if first.ID == 0 {
			break
		}
		first.State = queuecore.StateLeased
		first.Deadline = epoch
		mustApply(t, s, tupd(first))
		mustApply(t, s, tdel(first.ID))
	}
	if s.ix.queues["q"].spill != nil || len(spillFiles(t, dir)) != 0 {
		t.Errorf("after the drain: spill %v, files %v; want none", s.ix.queues["q"].spill, spillFiles(t, dir))
	}
}

// BenchmarkWaitingMessage measures what a waiting (ready) message costs
// in the store's memory, with spilling off and on:
//
//	go test -run '^$' -bench BenchmarkWaitingMessage -benchtime 1x ./backends/fs
func BenchmarkWaitingMessage(b *testing.B) {
	for _, c := range []struct {
		name    string
		spillAt int
	}{{"index", -1}, {"spill", 0}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				s := openTest(b, b.TempDir(), queuecore.SyncOff, config{spillAt: c.spillAt}, nil)
				mustPutQueues(b, s, "q")
				const n = 100_000
				before := heapAlloc()
				ops := make([]queuecore.Op, 0, 100)
				for i := uint64(1); i <= n; i++ {
					m := tmsg(i, "q", fmt.Sprintf("m%07d", i), queuecore.StateReady)
					ops = append(ops, queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: []byte("x")})
					if len(ops) == cap(ops) {
						mustApply(b, s, ops...)
						ops = ops[:0]
					}
				}
				s.runFileOps(s.written.Load())
				b.ReportMetric(float64(heapAlloc()-before)/n, "B/msg")
				_ = s.Close()
			}
		})
	}
}

func heapAlloc() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestSpillOutOfOrder commits messages whose IDs and Seqs are a little out
// of order, as concurrent publishes are: they still spill (but for the
// tail kept in memory), and List gives them in (Seq, ID) order.
func TestSpillOutOfOrder(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncOff, config{spillAt: 64}, nil)
	mustPutQueues(t, s, "q")
	const n = 3000
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	// Shuffle IDs within windows of 8 and commit in an order that is
	// shuffled too: Seq follows the commit order, ID does not.
	for w := 0; w+8 <= n; w += 8 {
		win := ids[w : w+8]
		win[0], win[5], win[2], win[7] = win[5], win[0], win[7], win[2]
	}
	var want []string
	for i, id := range ids {
		m := tmsg(id, "q", fmt.Sprintf("m%05d", id), queuecore.StateReady)
		m.Seq = uint64(n + i) // commit order
		mustApply(t, s, tins(m))
		want = append(want, m.Name)
	}
	q := s.ix.queues["q"]
	if tree := q.byState[queuecore.StateReady].Len(); q.spill == nil || tree > 64+spillKeepFor(64)+spillBatchFor(spillKeepFor(64)) {
		t.Fatalf("%d of %d ready messages stayed in the tree", tree, n)
	}
	if got := listNames(t, s, "q", queuecore.StateReady); !slices.Equal(got, want) {
		t.Fatalf("List order differs from commit order")
	}
	for _, id := range []uint64{1, 6, 1500, 2999, 3000} {
		m := tmsg(id, "q", fmt.Sprintf("m%05d", id), queuecore.StateReady)
		got, err := s.Lookup(context.Background(), "q", m.Name, false)
		if err != nil || got.ID != id {
			t.Errorf("Lookup %s = %d, %v", m.Name, got.ID, err)
		}
		if b, err := s.Body(context.Background(), id); err != nil || string(b) != string(tbody(id)) {
			t.Errorf("Body(%d) = %q, %v", id, b, err)
		}
	}
}

// TestSpillTrim keeps a queue's backlog above the spill threshold while
// 6,000 messages pass through it, one published for each one leased and
// acked, so that the spill never empties: its gone head must be trimmed,
// in memory (records held) and on disk (blocks of the file), with every
// message delivered once, in order, before and after a reopen. Then the
// same where the file system cannot punch holes (the kept records are
// copied to a new file), and with a reader holding the spill (no trim).
func TestSpillTrim(t *testing.T) {
	for _, punch := range []string{"works", "unsupported", "fails"} {
		t.Run("punch="+punch, func(t *testing.T) {
			switch punch {
			case "unsupported":
				stubPunch(t, unix.EOPNOTSUPP)
			case "fails":
				stubPunch(t, unix.EIO)
			}
			testSpillTrim(t, punch)
		})
	}
}

func stubPunch(t *testing.T, err error) {
	old := punchHole
	punchHole = func(*os.File, int64, int64) error { return err }
	t.Cleanup(func() { punchHole = old })
}

func testSpillTrim(t *testing.T, punch string) {
	ctx := context.Background()
	dir := t.TempDir()
	const trimAt = 64
	cfg := config{spillAt: 4, spillTrimAt: trimAt}
	var log logBuffer
	s := openTest(t, dir, queuecore.SyncOff, cfg, &log)
	mustPutQueues(t, s, "q")
	const backlog, passes = 100, 6000
	var want []string // the ready names, in order
	next := uint64(1)
	publish := func() {
		m := tmsg(next, "q", fmt.Sprintf("m%06d", next), queuecore.StateReady)
		mustApply(t, s, tins(m))
		want = append(want, m.Name)
		next++
	}
	for range backlog {
		publish()
	}
	q := s.ix.queues["q"]
	sp := q.spill
	if sp == nil {
		t.Fatal("no spill after the backlog")
	}
	maxHeld := 0
	for i := range passes {
		publish()
		var first queuecore.Message
		if err := s.List(ctx, "q", queuecore.StateReady, func(m queuecore.Message) bool { first = m; return false }); err != nil {
			t.Fatal(err)
		}
		if first.Name != want[0] {
			t.Fatalf("pass %d: first ready message %q, want %q", i, first.Name, want[0])
		}
		want = want[1:]
		first.State = queuecore.StateLeased
		first.Deadline = epoch
		mustApply(t, s, tupd(first))
		mustApply(t, s, tdel(first.ID))
		if q.spill != sp {
			t.Fatalf("pass %d: the spill was dropped or replaced", i)
		}
		if sp.n != len(sp.hashes) || len(sp.gone) != (sp.n+63)/64 || len(sp.blockOff) != (sp.n+63)/64 {
			t.Fatalf("pass %d: spill of %d records holds %d hashes, %d gone words, %d blocks", i, sp.n, len(sp.hashes), len(sp.gone), len(sp.blockOff))
		}
		maxHeld = max(maxHeld, sp.n)
	}
	// A trim is due once the gone head reaches trimAt and the rest: about
	// twice the backlog, and a batch of appends more.
	if limit := 2*(backlog+2*spillPerBlock) + trimAt; maxHeld > limit || sp.trimmed == 0 {
		t.Errorf("the spill held up to %d records (trimmed %d of %d that passed), want at most %d", maxHeld, sp.trimmed, int64(sp.n)+sp.trimmed, limit)
	}
	var st unix.Stat_t
	if err := unix.Stat(sp.path, &st); err != nil {
		t.Fatal(err)
	}
	// A record is over 30 bytes here: 6,000 of them are over 128 KiB.
	onDisk := st.Blocks * 512
	warnings := strings.Count(log.String(), "cannot give the spill's trimmed head back")
	switch punch {
	case "works", "unsupported":
		if onDisk > 128<<10 || (punch == "unsupported" && st.Size > 128<<10) {
			t.Errorf("the spill file takes %d bytes on disk (size %d) after %d records passed", onDisk, st.Size, int64(sp.n)+sp.trimmed)
		}
		if warnings != 0 {
			t.Errorf("%d warnings about the file's trim:\n%s", warnings, log.String())
		}
	case "fails":
		// The memory is trimmed all the same (checked above); the file
		// keeps its bytes, said once.
		if onDisk < 128<<10 || warnings != 1 {
			t.Errorf("with punching failing: %d bytes on disk, %d warnings, want all the records and one warning:\n%s", onDisk, warnings, log.String())
		}
	}
	if got := listNames(t, s, "q", queuecore.StateReady); !slices.Equal(got, want) {
		t.Fatalf("List ready after the passes: %d names, want %d", len(got), len(want))
	}
	for _, name := range []string{want[0], want[len(want)/2], want[len(want)-1]} {
		if m, err := s.Lookup(ctx, "q", name, false); err != nil || m.Name != name {
			t.Errorf("Lookup %s = %q, %v", name, m.Name, err)
		} else if b, err := s.Body(ctx, m.ID); err != nil || string(b) != string(tbody(m.ID)) {
			t.Errorf("Body of %s = %q, %v", name, b, err)
		}
	}

	// No trim while a reader holds the spill.
	v := sp.view(false)
	sp.head = sp.n - 1 // as if every record but the last were gone
	if sp.trimmable(trimAt) {
		t.Error("trimmable with a reader holding the spill")
	}
	v.sp.release()
	sp.head = firstLive(sp)

	crash(t, s)
	s = openTest(t, dir, queuecore.SyncOff, cfg, nil)
	if got := listNames(t, s, "q", queuecore.StateReady); !slices.Equal(got, want) {
		t.Fatalf("List ready after a reopen: %d names, want %d", len(got), len(want))
	}
}

func firstLive(sp *spill) int {
	r := 0
	for r < sp.n && sp.isGone(r) {
		r++
	}
	return r
}
