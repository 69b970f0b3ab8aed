package fs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// Benchmarks of single commits, as queuecore makes them: a publish
// (insert), a lease (update that moves the file to processing/) and an ack
// (delete), one message per Apply, 256-byte bodies, in a fresh directory.
//
//	go test -run '^$' -bench . -benchtime 5000x ./backends/fs

var benchBody = bytes.Repeat([]byte("x"), 256)

func benchMsg(id uint64, st queuecore.State) queuecore.Message {
	m := tmsg(id, "q", "m"+strconv.FormatUint(id, 10), st)
	m.Size = int64(len(benchBody))
	return m
}

func benchInsert(id uint64) queuecore.Op {
	return queuecore.Op{Kind: queuecore.OpInsert, Msg: benchMsg(id, ready), Body: benchBody}
}

func reportOps(b *testing.B, s *Store, fsyncsBefore int64) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(float64(s.fsyncs.Load()-fsyncsBefore)/float64(b.N), "fsyncs/op")
}

func BenchmarkApply(b *testing.B) {
	for _, mode := range []queuecore.SyncMode{queuecore.SyncNormal, queuecore.SyncFull} {
		b.Run(mode.String()+"/insert", func(b *testing.B) {
			s := openTest(b, b.TempDir(), mode, config{}, nil)
			mustPutQueues(b, s, "q")
			ctx := context.Background()
			f0 := s.fsyncs.Load()
			b.ResetTimer()
			for i := range b.N {
				if err := s.Apply(ctx, []queuecore.Op{benchInsert(uint64(i + 1))}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportOps(b, s, f0)
		})
		b.Run(mode.String()+"/update", func(b *testing.B) {
			s := openTest(b, b.TempDir(), mode, config{}, nil)
			mustPutQueues(b, s, "q")
			preload(b, s, b.N)
			ctx := context.Background()
			f0 := s.fsyncs.Load()
			b.ResetTimer()
			for i := range b.N {
				m := benchMsg(uint64(i+1), leased)
				if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: m}}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportOps(b, s, f0)
		})
		b.Run(mode.String()+"/delete", func(b *testing.B) {
			s := openTest(b, b.TempDir(), mode, config{}, nil)
			mustPutQueues(b, s, "q")
			preload(b, s, b.N)
			ctx := context.Background()
			f0 := s.fsyncs.Load()
			b.ResetTimer()
			for i := range b.N {
				if err := s.Apply(ctx, []queuecore.Op{tdel(uint64(i + 1))}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportOps(b, s, f0)
		})
		// A message's whole life under churn: publish, lease, ack, with the
		// names of acked messages reused (ext4 without a journal is slow to
		// create where files were just deleted).
		b.Run(mode.String()+"/publish-lease-ack", func(b *testing.B) {
			s := openTest(b, b.TempDir(), mode, config{}, nil)
			mustPutQueues(b, s, "q")
			ctx := context.Background()
			f0 := s.fsyncs.Load()
			b.ResetTimer()
			for i := range b.N {
				id := uint64(i + 1)
				m := benchMsg(id, ready)
				m.Name = "m" + strconv.Itoa(i%1000)
				ins := queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: benchBody}
				m.State, m.Deadline = leased, epoch
				if err := s.Apply(ctx, []queuecore.Op{ins}); err != nil {
					b.Fatal(err)
				}
				if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: m}}); err != nil {
					b.Fatal(err)
				}
				if err := s.Apply(ctx, []queuecore.Op{tdel(id)}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "messages/s")
			b.ReportMetric(float64(s.fsyncs.Load()-f0)/float64(b.N), "fsyncs/message")
		})
	}
}

func preload(b *testing.B, s *Store, n int) {
	b.Helper()
	const batch = 500
	for i := 0; i < n; i += batch {
		var ops []queuecore.Op
		for j := i; j < min(i+batch, n); j++ {
			ops = append(ops, benchInsert(uint64(j+1)))
		}
		mustApply(b, s, ops...)
	}
}

// BenchmarkConcurrentInsertFull: g goroutines publish at once in SyncFull;
// group commit lets them share fdatasyncs.
func BenchmarkConcurrentInsertFull(b *testing.B) {
	for _, g := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			s := openTest(b, b.TempDir(), queuecore.SyncFull, config{}, nil)
			mustPutQueues(b, s, "q")
			var next atomic.Int64
			f0 := s.fsyncs.Load()
			b.ResetTimer()
			var wg sync.WaitGroup
			for range g {
				wg.Go(func() {
					ctx := context.Background()
					for {
						id := next.Add(1)
						if id > int64(b.N) {
							return
						}
						if err := s.Apply(ctx, []queuecore.Op{benchInsert(uint64(id))}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			reportOps(b, s, f0)
		})
	}
}

// BenchmarkBaseline measures this machine in the same run: what a publish
// costs as a plain file (create, write 256 B, close) and what an appending
// write+fdatasync costs.
func BenchmarkBaseline(b *testing.B) {
	b.Run("create-write-close", func(b *testing.B) {
		dir := b.TempDir()
		for i := range b.N {
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), benchBody, 0o600); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
	b.Run("append-fdatasync", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "log"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		rec := bytes.Repeat([]byte("y"), 600)
		for range b.N {
			if _, err := f.Write(rec); err != nil {
				b.Fatal(err)
			}
			if err := unix.Fdatasync(int(f.Fd())); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
	b.Run("overwrite-fdatasync", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "log"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		rec := bytes.Repeat([]byte("y"), 600)
		if _, err := f.Write(make([]byte, (b.N+1)*len(rec))); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := range b.N {
			if _, err := f.WriteAt(rec, int64(i*len(rec))); err != nil {
				b.Fatal(err)
			}
			if err := unix.Fdatasync(int(f.Fd())); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
}

// TestMemoryMillion reports the memory a million messages take. The index
// part (what the store keeps in RAM per message) runs with
// YIRANGMQ_FS_MILLION=index; =full also fills a real store (a million body
// files: slow where creating files is slow) and times its reopen.
//
//	YIRANGMQ_FS_MILLION=full go test -run TestMemoryMillion -v -timeout 60m ./backends/fs
func TestMemoryMillion(t *testing.T) {
	mode := os.Getenv("YIRANGMQ_FS_MILLION")
	if mode == "" {
		t.Skip("set YIRANGMQ_FS_MILLION=index or =full to run")
	}
	const n, batch = 1_000_000, 1000
	ops := func(i int, body []byte) []queuecore.Op {
		ops := make([]queuecore.Op, 0, batch)
		for j := i; j < i+batch; j++ {
			m := tmsg(uint64(j+1), "q", fmt.Sprintf("msg-%08d", j), ready)
			m.MessageID = fmt.Sprintf("%08x-6f2a-4f43-9c1d-2b7a1c9e8d01", j) // UUID-sized
			m.Consumer = "uid 1000 pid 4242 worker"
			m.Size = int64(len(body))
			ops = append(ops, queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: body})
		}
		return ops
	}
	body := bytes.Repeat([]byte("b"), 64)

	base := memStats(t)
	ix := newIndex()
	ix.putQueue(queuecore.QueueInfo{Name: "q"})
	for i := 0; i < n; i += batch {
		if _, err := ix.applyOps(ops(i, body)); err != nil {
			t.Fatal(err)
		}
	}
	after := memStats(t)
	t.Logf("index of %d messages: %.0f MB live heap, %.0f bytes per message; RSS grew %.0f MB (GOGC headroom included)",
		n, float64(after.heap-base.heap)/1e6, float64(after.heap-base.heap)/n, float64(after.rss-base.rss)/1e6)
	runtime.KeepAlive(ix)
	ix = nil
	if mode != "full" {
		return
	}

	// YIRANGMQ_FS_MILLION_DIR keeps the store (and reuses a full one), so
	// that the reopen can be timed again without filling it again.
	dir := os.Getenv("YIRANGMQ_FS_MILLION_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	opts := backends.Options{Sync: queuecore.SyncOff}
	if _, err := os.Stat(filepath.Join(dir, snapshotName)); err != nil {
		base = memStats(t)
		s, err := Open(context.Background(), dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		mustPutQueues(t, s, "q")
		start := time.Now()
		for i := 0; i < n; i += batch {
			mustApply(t, s, ops(i, body)...)
		}
		t.Logf("inserted %d messages in batches of %d in %v", n, batch, time.Since(start))
		full := memStats(t)
		t.Logf("store of %d messages: %.0f MB live heap (%.0f bytes per message); process RSS %.0f MB",
			n, float64(full.heap-base.heap)/1e6, float64(full.heap-base.heap)/n, float64(full.rss)/1e6)
		start = time.Now()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("close (final checkpoint) took %v", time.Since(start))
	}

	base = memStats(t)
	if p := os.Getenv("YIRANGMQ_FS_PROFILE"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	s, err := Open(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	pprof.StopCPUProfile()
	t.Logf("reopen (snapshot load and tree walk) of %d messages took %v", n, time.Since(start))
	defer s.Close()
	if fi, err := os.Stat(filepath.Join(dir, snapshotName)); err == nil {
		t.Logf("snapshot: %.0f MB", float64(fi.Size())/1e6)
	}
	reopened := memStats(t)
	t.Logf("after reopen: %.0f MB live heap, process RSS %.0f MB", float64(reopened.heap-base.heap)/1e6, float64(reopened.rss)/1e6)
	start = time.Now()
	count := 0
	_ = s.List(context.Background(), "q", ready, func(queuecore.Message) bool { count++; return true })
	t.Logf("List of %d messages took %v", count, time.Since(start))
	if count != n {
		t.Errorf("List returned %d messages, want %d", count, n)
	}
}

type mem struct{ heap, rss uint64 }

func memStats(t *testing.T) mem {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return mem{heap: ms.HeapAlloc, rss: vmRSS(t)}
}

// vmRSS is this process's resident set size.
func vmRSS(t *testing.T) uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}
