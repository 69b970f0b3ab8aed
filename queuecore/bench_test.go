package queuecore_test

// Benchmarks of the queue core in process (issue 2), on both stores and in
// both durable sync modes: Publish, the publish+lease+ack round trip
// (against a goqite-style SQLite queue measured in the same run),
// concurrent publishers with group commit against one fsync per message,
// and how leasing, stats and memory scale with the size of the inbox.
// docs/performance-history.md has the figures, the commands and what they mean.
//
//	go test -run '^$' -bench . -benchtime 2s ./queuecore/
//	YIRANGMQ_BENCH_1M=1 go test -run '^$' -bench Scale -benchtime 20000x -timeout 60m ./queuecore/
//
// Every store is opened in a fresh b.TempDir: Publish runs in a fresh
// directory, the round trip under churn (each message is created and then
// deleted). The leaves named "ratio" measure nothing: they report the
// ratios the goals are about, between results of the same run.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers "sqlite3" for database/sql (the goqite baseline)

	"yirangmq/queuecore"
	"yirangmq/testenv"
	"yirangmq/testenv/goqite"
)

const (
	benchQueue      = "bench"
	benchBodySize   = 256
	benchWorkers    = 8
	benchConsumer   = "uid=1000 pid=1 bench"
	policyNoArchive = `{"archive": {"enabled": false}}`

	// env1M runs the million-message benchmarks of BenchmarkScale even when
	// -bench does not name them.
	env1M = "YIRANGMQ_BENCH_1M"
	// envChildDir and envChildStore make TestScaleMemoryChild measure a
	// store that BenchmarkScale filled (see scaleMemory).
	envChildDir   = "YIRANGMQ_BENCH_CHILD_DIR"
	envChildStore = "YIRANGMQ_BENCH_CHILD_STORE"
)

// benchBody is a fresh 256-byte message body.
func benchBody() []byte { return bytes.Repeat([]byte("x"), benchBodySize) }

// durableModes are the sync modes measured: full (the default) and normal.
func durableModes() []queuecore.SyncMode {
	return []queuecore.SyncMode{queuecore.SyncFull, queuecore.SyncNormal}
}

// benchEnv is a core on a store, closed at the end of the benchmark.
type benchEnv struct {
	store queuecore.Store
	core  *queuecore.Core
}

func openBench(b testing.TB, open openStore, dir string, mode queuecore.SyncMode) *benchEnv {
	b.Helper()
	ctx := context.Background()
	st, err := open(ctx, dir, mode)
	if err != nil {
		b.Fatalf("open store: %v", err)
	}
	c, err := queuecore.Open(ctx, st, queuecore.Options{})
	if err != nil {
		st.Close()
		b.Fatalf("open core: %v", err)
	}
	e := &benchEnv{store: st, core: c}
	b.Cleanup(e.close)
	return e
}

func (e *benchEnv) close() {
	if e.core != nil {
		e.core.Close()
		e.store.Close()
		e.core, e.store = nil, nil
	}
}

func (e *benchEnv) queue(b testing.TB, policy string) {
	b.Helper()
	ctx := context.Background()
	if err := e.core.CreateQueue(ctx, benchQueue, 1000, 1000, 0o755); err != nil {
		b.Fatalf("create queue: %v", err)
	}
	if policy != "" {
		if err := e.core.SetPolicy(ctx, benchQueue, []byte(policy)); err != nil {
			b.Fatalf("set policy: %v", err)
		}
	}
}

func (e *benchEnv) publish(b testing.TB, name string, body []byte) {
	if _, err := e.core.Publish(context.Background(), benchQueue, name, body, queuecore.PublishOptions{UID: 1000, GID: 1000}); err != nil {
		b.Fatalf("publish %s: %v", name, err)
	}
}

// roundTrip publishes name, leases it as the next message and acks it.
func (e *benchEnv) roundTrip(b testing.TB, name string, body []byte) {
	ctx := context.Background()
	e.publish(b, name, body)
	m, err := e.core.Next(ctx, benchQueue, benchConsumer, true)
	if err != nil {
		b.Fatalf("next: %v", err)
	}
	if m.Name != name {
		b.Fatalf("next leased %s, want %s", m.Name, name)
	}
	if err := e.core.Ack(ctx, benchQueue, name); err != nil {
		b.Fatalf("ack %s: %v", name, err)
	}
}

// cpuTime is the CPU time (user and system) the process has used: on a
// shared 2-vCPU machine it varies less than the wall time, and it counts
// the work of every goroutine (the scheduler's too).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// meter reports a rate and the CPU time per op of a benchmark.
type meter struct{ cpu time.Duration }

func startMeter(b *testing.B) meter {
	b.ResetTimer()
	return meter{cpu: cpuTime()}
}

// result is what a benchmark measured, for the ratios.
type result struct {
	rate  float64 // operations per second of wall time
	cpuUS float64 // CPU µs per operation, every goroutine of the process
}

// report adds unit (operations per second of wall time) and cpu-µs/op to
// b's results and returns both.
func (m meter) report(b *testing.B, unit string) result {
	b.StopTimer()
	r := result{
		rate:  float64(b.N) / b.Elapsed().Seconds(),
		cpuUS: float64((cpuTime() - m.cpu).Nanoseconds()) / 1e3 / float64(b.N),
	}
	b.ReportMetric(r.rate, unit)
	b.ReportMetric(r.cpuUS, "cpu-µs/op")
	return r
}

// ratio compares two results of a run: num.rate/denom.rate by wall time
// and denom.cpuUS/num.cpuUS by CPU time, which a busy machine disturbs
// less. Both are above 1 when num is the faster. wallOnly leaves the CPU
// ratio out where it means nothing (time spent waiting for fsync).
type ratio struct {
	unit       string
	num, denom result
	wallOnly   bool
}

// reportRatios is a leaf benchmark that measures nothing and reports the
// ratios of results measured before it in the same run, so that they show
// in plain `go test -bench` output (parent benchmarks print logs only with
// -v); its ns/op is set to 0. Ratios whose results are missing (not run,
// filtered out by -bench) are left out, and the leaf too if none is left.
func reportRatios(b *testing.B, name string, ratios ...ratio) {
	var have []ratio
	for _, r := range ratios {
		if r.num.rate > 0 && r.denom.rate > 0 {
			have = append(have, r)
		}
	}
	if len(have) == 0 {
		return
	}
	b.Run(name, func(b *testing.B) {
		b.ReportMetric(0, "ns/op")
		for _, r := range have {
			b.ReportMetric(r.num.rate/r.denom.rate, r.unit)
			if !r.wallOnly && r.num.cpuUS > 0 && r.denom.cpuUS > 0 {
				b.ReportMetric(r.denom.cpuUS/r.num.cpuUS, r.unit+"-by-cpu")
			}
		}
	})
}

// BenchmarkPublish: one goroutine publishes 256-byte messages under new
// names into a fresh queue. native-create is this machine's cost, in the
// same run, of what an fs publish does at least: create a 256-byte file
// (on ext4 without a journal it swings tenfold with the number of inodes
// freed in the last minute, by this run or any other process).
func BenchmarkPublish(b *testing.B) {
	b.Run("native-create", func(b *testing.B) {
		dir := b.TempDir()
		body := benchBody()
		m := startMeter(b)
		for i := range b.N {
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), body, 0o600); err != nil {
				b.Fatal(err)
			}
		}
		m.report(b, "files/s")
	})
	for _, s := range stores {
		for _, mode := range durableModes() {
			b.Run(s.name+"/"+mode.String(), func(b *testing.B) {
				e := openBench(b, s.opener(b), b.TempDir(), mode)
				e.queue(b, "")
				body := benchBody()
				m := startMeter(b)
				for i := range b.N {
					e.publish(b, "m-"+strconv.Itoa(i), body)
				}
				m.report(b, "msgs/s")
			})
		}
	}
}

// BenchmarkRoundTrip: one goroutine publishes a message, leases it with
// Next and acks it, with the archive off and with the default archive
// (acked messages kept, at most 10,000, the excess trimmed by the
// scheduler). goqite and goqite-autocommit are the SQLite baseline of
// goqiteRoundTrip, in rt/s like the rest; the leaf "ratio" compares.
func BenchmarkRoundTrip(b *testing.B) {
	res := map[string]result{}
	b.Run("goqite/normal", func(b *testing.B) { res["goqite"] = goqiteRoundTrip(b, true) })
	b.Run("goqite-autocommit/normal", func(b *testing.B) { res["goqite-autocommit"] = goqiteRoundTrip(b, false) })
	for _, s := range stores {
		for _, mode := range []queuecore.SyncMode{queuecore.SyncNormal, queuecore.SyncFull} {
			for _, archive := range []struct{ name, policy string }{{"off", policyNoArchive}, {"default", ""}} {
				name := s.name + "/" + mode.String() + "/archive=" + archive.name
				b.Run(name, func(b *testing.B) {
					e := openBench(b, s.opener(b), b.TempDir(), mode)
					e.queue(b, archive.policy)
					body := benchBody()
					m := startMeter(b)
					for i := range b.N {
						e.roundTrip(b, "m-"+strconv.Itoa(i), body)
					}
					res[name] = m.report(b, "rt/s")
				})
			}
		}
	}
	// Goal: sqlite in normal mode at least twice goqite's round trips.
	reportRatios(b, "ratio",
		ratio{"x-sqlite-vs-goqite", res["sqlite/normal/archive=off"], res["goqite"], false},
		ratio{"x-sqlite-archive-vs-goqite", res["sqlite/normal/archive=default"], res["goqite"], false},
		ratio{"x-sqlite-vs-goqite-autocommit", res["sqlite/normal/archive=off"], res["goqite-autocommit"], false},
	)
}

// goqiteQuerier is what *sql.DB and *sql.Tx share.
type goqiteQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// goqiteRoundTrip is the baseline: a queue the way goqite keeps one, with
// database/sql and go-sqlite3 on one connection, WAL, synchronous=NORMAL.
// Send is one INSERT, receive one UPDATE … RETURNING, delete one DELETE.
// With inTx each runs in a transaction of its own, as goqite's Send,
// Receive and Delete do (internal/sql.InTx: BEGIN, statement, COMMIT);
// without, each statement is its own transaction (a leaner goqite, the
// stricter baseline).
func goqiteRoundTrip(b *testing.B, inTx bool) result {
	ctx := context.Background()
	dsn := "file:" + filepath.Join(b.TempDir(), "goqite.db") + "?_journal=WAL&_timeout=5000&_fk=true&_sync=NORMAL"
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	if _, err := db.ExecContext(ctx, goqite.Schema); err != nil {
		b.Fatal(err)
	}
	var syncMode string
	if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&syncMode); err != nil || syncMode != "1" {
		b.Fatalf("PRAGMA synchronous = %q (%v), want 1 (NORMAL)", syncMode, err)
	}
	// run is goqite's InTx, or the bare statement.
	run := func(f func(q goqiteQuerier) error) error {
		if !inTx {
			return f(db)
		}
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
		if err != nil {
			return err
		}
		if err := f(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	const timeout, maxReceive = 5 * time.Second, 3
	body := benchBody()
	m := startMeter(b)
	for range b.N {
		var sent, got string
		err := run(func(q goqiteQuerier) error {
			return q.QueryRowContext(ctx, goqite.Send, benchQueue, body, time.Now().Format(goqite.Time)).Scan(&sent)
		})
		if err != nil {
			b.Fatalf("send: %v", err)
		}
		err = run(func(q goqiteQuerier) error {
			now := time.Now()
			var gotBody []byte
			var received int
			return q.QueryRowContext(ctx, goqite.Receive, now.Add(timeout).Format(goqite.Time), benchQueue,
				now.Format(goqite.Time), maxReceive).Scan(&got, &gotBody, &received)
		})
		if err != nil {
			b.Fatalf("receive: %v", err)
		}
		if got != sent {
			b.Fatalf("received %s, want %s", got, sent)
		}
		err = run(func(q goqiteQuerier) error {
			_, err := q.ExecContext(ctx, goqite.Delete, benchQueue, got)
			return err
		})
		if err != nil {
			b.Fatalf("delete: %v", err)
		}
	}
	return m.report(b, "rt/s")
}

// BenchmarkPublishParallel: 8 goroutines publish at once. group-commit is
// the core as it is: concurrent commits share a transaction and, in full
// mode, one fsync. one-fsync-per-msg (full mode only) is the same with
// the publishes serialized by a mutex, so each pays its own fsync: the
// leaf "ratio" compares the two (goal ≥ 5x for sqlite).
func BenchmarkPublishParallel(b *testing.B) {
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			res := map[string]result{}
			for _, mode := range durableModes() {
				variants := []string{"group-commit"}
				if mode == queuecore.SyncFull {
					variants = append(variants, "one-fsync-per-msg")
				}
				for _, v := range variants {
					name := mode.String() + "/" + v
					b.Run(name, func(b *testing.B) {
						e := openBench(b, s.opener(b), b.TempDir(), mode)
						e.queue(b, "")
						res[name] = publishParallel(b, e, v == "one-fsync-per-msg")
					})
				}
			}
			// Goal: at least 5x for sqlite.
			reportRatios(b, "ratio", ratio{"x-group-vs-one-fsync", res["full/group-commit"], res["full/one-fsync-per-msg"], true})
		})
	}
}

func publishParallel(b *testing.B, e *benchEnv, serialize bool) result {
	ctx := context.Background()
	body := benchBody()
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	m := startMeter(b)
	for range benchWorkers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if serialize {
					mu.Lock()
				}
				_, err := e.core.Publish(ctx, benchQueue, "m-"+strconv.FormatInt(i, 10), body, queuecore.PublishOptions{UID: 1000, GID: 1000})
				if serialize {
					mu.Unlock()
				}
				if err != nil {
					b.Errorf("publish: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	return m.report(b, "msgs/s")
}

// want1M says whether the million-message benchmarks run: when -bench
// names them ("1M" in the pattern) or YIRANGMQ_BENCH_1M=1. Filling a
// million messages takes a while (a million files for the fs store), so
// `make bench` (-bench .) leaves them out.
func want1M() bool {
	if os.Getenv(env1M) == "1" {
		return true
	}
	f := flag.Lookup("test.bench")
	return f != nil && strings.Contains(f.Value.String(), "1M")
}

// scaleCost is what one inbox size costs.
type scaleCost struct {
	nextAck, stats result
}

// BenchmarkScale compares an inbox of 100 ready messages with one of a
// million: the cost of leasing the next message and acking it, of Stats,
// and the resident memory of a process that opens the store and works on
// it. Stores run in normal mode with the archive off; the million are put
// in the store directly in large batches before the core opens on it.
// The million runs with YIRANGMQ_BENCH_1M=1 or when -bench names it:
//
//	YIRANGMQ_BENCH_1M=1 go test -run '^$' -bench Scale -benchtime 20000x -timeout 60m ./queuecore/
//	go test -run '^$' -bench 'Scale/sqlite/(ready=(100|1M)|ratio)' -benchtime 20000x ./queuecore/
func BenchmarkScale(b *testing.B) {
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			levels := []struct {
				name string
				n    int
			}{{"ready=100", 100}, {"ready=1M", 1_000_000}}
			costs := make([]scaleCost, len(levels))
			for i, lvl := range levels {
				b.Run(lvl.name, func(b *testing.B) {
					if lvl.n > 1000 && !want1M() {
						b.Skipf("set %s=1 or name 1M in -bench to run", env1M)
					}
					costs[i] = benchScale(b, s.name, s.opener(b), lvl.n)
				})
			}
			// Goal: leasing and stats within 2x of their cost with 100.
			small, big := costs[0], costs[1]
			reportRatios(b, "ratio",
				ratio{"x-next-ack-1M-vs-100", small.nextAck, big.nextAck, false},
				ratio{"x-stats-1M-vs-100", small.stats, big.stats, false},
			)
		})
	}
}

// benchScale fills a store with n ready messages, opens the core on it
// and runs the sub-benchmarks next-ack, stats and memory.
func benchScale(b *testing.B, storeName string, open openStore, n int) scaleCost {
	ctx := context.Background()
	dir := b.TempDir()
	st, err := open(ctx, dir, queuecore.SyncNormal)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	fillReady(b, st, n)
	b.Logf("%s: filled %d ready messages in %v", storeName, n, time.Since(start).Round(time.Millisecond))
	c, err := queuecore.Open(ctx, st, queuecore.Options{})
	if err != nil {
		st.Close()
		b.Fatal(err)
	}
	e := &benchEnv{store: st, core: c}
	b.Cleanup(e.close)
	if got := mustStats(b, e).Ready; got != int64(n) {
		b.Fatalf("ready = %d after the fill, want %d", got, n)
	}

	var cost scaleCost
	body := benchBody()
	added := 0 // names of the messages that keep the inbox full
	refill := func(k int) {
		for range k {
			added++
			e.publish(b, "p-"+strconv.Itoa(added), body)
		}
	}
	b.Run("next-ack", func(b *testing.B) {
		// The inbox is topped up to n, outside the timer, every refillEvery
		// leases, so that every lease sees (nearly) n ready messages.
		const refillEvery = 20
		var inNext, inAck time.Duration
		owed := 0
		var refillCPU time.Duration
		m := startMeter(b)
		for range b.N {
			if owed == refillEvery {
				b.StopTimer()
				c0 := cpuTime()
				refill(owed)
				owed = 0
				refillCPU += cpuTime() - c0
				b.StartTimer()
			}
			t0 := time.Now()
			msg, err := e.core.Next(ctx, benchQueue, benchConsumer, true)
			if err != nil {
				b.Fatalf("next: %v", err)
			}
			t1 := time.Now()
			if err := e.core.Ack(ctx, benchQueue, msg.Name); err != nil {
				b.Fatalf("ack %s: %v", msg.Name, err)
			}
			inNext += t1.Sub(t0)
			inAck += time.Since(t1)
			owed++
		}
		m.cpu += refillCPU
		cost.nextAck = m.report(b, "leases/s")
		b.ReportMetric(float64(inNext.Nanoseconds())/float64(b.N)/1e3, "next-µs")
		b.ReportMetric(float64(inAck.Nanoseconds())/float64(b.N)/1e3, "ack-µs")
		refill(owed)
	})
	b.Run("stats", func(b *testing.B) {
		m := startMeter(b)
		for range b.N {
			if _, err := e.core.Stats(ctx, benchQueue); err != nil {
				b.Fatal(err)
			}
		}
		cost.stats = m.report(b, "stats/s")
	})
	var mem *childMemory
	b.Run("memory", func(b *testing.B) {
		// Measured once (by a child process), reported at every b.N.
		if mem == nil {
			e.close() // the child takes the store's lock
			mem = scaleMemory(b, storeName, dir)
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(mem.rss, "rss-MiB")
		b.ReportMetric(mem.hwm, "hwm-MiB")
		b.ReportMetric(mem.heap, "heap-MiB")
		b.ReportMetric(mem.open.Seconds(), "open-s")
	})
	return cost
}

func mustStats(b *testing.B, e *benchEnv) queuecore.QueueStats {
	b.Helper()
	s, err := e.core.Stats(context.Background(), benchQueue)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// fillReady creates the queue with the archive off and puts n ready
// messages in the store, 10,000 per Apply, with the fields a publish
// gives them (IDs and Seqs 1..n, FIFO, published over the last n µs).
func fillReady(b *testing.B, st queuecore.Store, n int) {
	b.Helper()
	ctx := context.Background()
	p, err := queuecore.ParsePolicy([]byte(policyNoArchive))
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	info := queuecore.QueueInfo{Name: benchQueue, Policy: p.JSON(), UID: 1000, GID: 1000, Mode: 0o755, CreatedAt: now}
	if err := st.PutQueue(ctx, info); err != nil {
		b.Fatal(err)
	}
	body := benchBody()
	const batch = 10_000
	ops := make([]queuecore.Op, 0, batch)
	for i := 1; i <= n; i++ {
		at := now.Add(time.Duration(i-n) * time.Microsecond)
		ops = append(ops, queuecore.Op{Kind: queuecore.OpInsert, Body: body, Msg: queuecore.Message{
			ID: uint64(i), Seq: uint64(i), Queue: benchQueue, Name: fmt.Sprintf("r-%07d", i),
			State: queuecore.StateReady, Size: int64(len(body)),
			MessageID:   fmt.Sprintf("00000000-0000-4000-8000-%012d", i),
			PublishedAt: at, FirstAt: at, StateAt: at, UID: 1000, GID: 1000,
		}})
		if len(ops) == batch || i == n {
			if err := st.Apply(ctx, ops); err != nil {
				b.Fatalf("fill: %v", err)
			}
			ops = ops[:0]
		}
	}
}

// childMemory is what TestScaleMemoryChild measured.
type childMemory struct {
	rss, hwm, heap float64 // MiB
	open           time.Duration
}

// scaleMemory measures the memory of a process that opens the store in
// dir and works on it, in a child process (this test binary running
// TestScaleMemoryChild): in this process the fill and the other
// benchmarks would count too, in VmHWM above all.
func scaleMemory(b *testing.B, storeName, dir string) *childMemory {
	b.Helper()
	cmd := testenv.SelfCommand("-test.run=^TestScaleMemoryChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envChildDir+"="+dir, envChildStore+"="+storeName)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("memory child: %v\n%s", err, out)
	}
	var m childMemory
	var openMS int64
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if _, err := fmt.Sscanf(strings.TrimSpace(sc.Text()), "scale-memory rss=%f hwm=%f heap=%f open_ms=%d", &m.rss, &m.hwm, &m.heap, &openMS); err == nil {
			m.open = time.Duration(openMS) * time.Millisecond
			return &m
		}
	}
	b.Fatalf("memory child printed no figures:\n%s", out)
	return nil
}

// TestScaleMemoryChild is the child of scaleMemory, and skips otherwise.
// It opens the store and the core, publishes, leases and acks a thousand
// messages, takes a hundred Stats, and prints VmRSS and VmHWM from
// /proc/self/status, the Go heap in use and how long the open took.
func TestScaleMemoryChild(t *testing.T) {
	dir, storeName := os.Getenv(envChildDir), os.Getenv(envChildStore)
	if dir == "" {
		t.Skip("run by BenchmarkScale")
	}
	var open openStore
	for _, s := range stores {
		if s.name == storeName {
			open = s.opener(t)
		}
	}
	if open == nil {
		t.Fatalf("no store %q", storeName)
	}
	start := time.Now()
	e := openBench(t, open, dir, queuecore.SyncNormal)
	opened := time.Since(start)
	ctx := context.Background()
	body := benchBody()
	for i := range 1000 {
		e.publish(t, fmt.Sprintf("c-%d-%d", os.Getpid(), i), body)
		m, err := e.core.Next(ctx, benchQueue, benchConsumer, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.core.Ack(ctx, benchQueue, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		if _, err := e.core.Stats(ctx, benchQueue); err != nil {
			t.Fatal(err)
		}
	}
	rss, hwm := procMemory(t)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	const mib = 1 << 20
	fmt.Printf("scale-memory rss=%.1f hwm=%.1f heap=%.1f open_ms=%d\n",
		float64(rss)/mib, float64(hwm)/mib, float64(ms.HeapInuse)/mib, opened.Milliseconds())
}

// procMemory reads VmRSS and VmHWM, in bytes, from /proc/self/status.
func procMemory(t testing.TB) (rss, hwm uint64) {
	t.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok || key != "VmRSS" && key != "VmHWM" {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if key == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	if rss == 0 || hwm == 0 {
		t.Fatal(errors.New("no VmRSS or VmHWM in /proc/self/status"))
	}
	return rss, hwm
}
