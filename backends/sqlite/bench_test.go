package sqlite

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// Benchmarks of the store alone. The queue core makes one store read and
// one Apply per operation; BenchmarkRoundTrip does what it does for a
// publish, a lease and an ack.
//
//	go test -run '^$' -bench . -benchtime 2s ./backends/sqlite

var benchModes = []queuecore.SyncMode{queuecore.SyncNormal, queuecore.SyncFull}

// benchVFS compares the store's VFS and anchor (vfs.go) with SQLite's own.
var benchVFS = []struct {
	name string
	tun  config
}{{"vfs=yirangmq", config{}}, {"vfs=unix", config{plainVFS: true}}}

// benchBody is a 256-byte message body, the size the queue core's
// benchmarks use.
var benchBody = []byte(`{"device":"device-001","temperature":21.5,"humidity":40,"ts":"2026-01-13T10:21:00+09:00","reading":"` +
	strings.Repeat("x", 256-97) + `"}`)

func benchMessage(id uint64, state queuecore.State) queuecore.Message {
	now := time.Now()
	m := queuecore.Message{
		ID: id, Queue: "bench", Name: fmt.Sprintf("msg-%012d", id), State: state, Seq: id,
		Size: int64(len(benchBody)), MessageID: "0198c3f0-5d4e-7a1b-9c2d-3e4f5a6b7c8d",
		PublishedAt: now, FirstAt: now, StateAt: now, UID: 1000, GID: 1000,
	}
	if state == queuecore.StateLeased || state == queuecore.StateDelayed {
		m.Deadline = now.Add(30 * time.Second)
	}
	return m
}

// cpuTime is the CPU time (user and system) this process has used: on a
// shared machine it varies less than the wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter reports the CPU time per op of a benchmark.
type cpuMeter struct{ start time.Duration }

func startCPU(b *testing.B) cpuMeter {
	b.ResetTimer()
	return cpuMeter{start: cpuTime()}
}

func (m cpuMeter) report(b *testing.B) {
	b.ReportMetric(float64((cpuTime()-m.start).Microseconds())/float64(b.N), "cpu-µs/op")
}

// reportCommits adds commits/s and batches per commit to b's results.
func reportCommits(b *testing.B, commits *atomic.Int64, batches int) {
	sec := b.Elapsed().Seconds()
	n := commits.Load()
	b.ReportMetric(float64(batches)/sec, "applies/s")
	b.ReportMetric(float64(n)/sec, "commits/s")
	if n > 0 {
		b.ReportMetric(float64(batches)/float64(n), "batches/commit")
	}
}

// fill inserts n ready messages from ID first, 1000 per batch.
func fill(b testing.TB, s *Store, first uint64, n int) {
	b.Helper()
	ops := make([]queuecore.Op, 0, 1000)
	for i := range n {
		ops = append(ops, queuecore.Op{Kind: queuecore.OpInsert, Msg: benchMessage(first+uint64(i), queuecore.StateReady), Body: benchBody})
		if len(ops) == cap(ops) || i == n-1 {
			if err := s.Apply(context.Background(), ops); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
}

func BenchmarkApplyInsert(b *testing.B) {
	for _, mode := range benchModes {
		for _, v := range benchVFS {
			b.Run(mode.String()+"/"+v.name, func(b *testing.B) { benchInsert(b, mode, v.tun) })
		}
	}
}

func benchInsert(b *testing.B, mode queuecore.SyncMode, tun config) {
	ctx := context.Background()
	s := newTunedStore(b, mode, tun, "bench")
	commits := countCommits(s)
	ops := make([]queuecore.Op, 1)
	b.ReportAllocs()
	cpu := startCPU(b)
	for i := range b.N {
		ops[0] = queuecore.Op{Kind: queuecore.OpInsert, Msg: benchMessage(uint64(i+1), queuecore.StateReady), Body: benchBody}
		if err := s.Apply(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
	reportCommits(b, commits, b.N)
	cpu.report(b)
}

func BenchmarkApplyUpdate(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode.String(), func(b *testing.B) {
			ctx := context.Background()
			s := newTestStore(b, mode, "bench")
			fill(b, s, 1, 10000)
			commits := countCommits(s)
			ops := make([]queuecore.Op, 1)
			b.ReportAllocs()
			cpu := startCPU(b)
			for i := range b.N {
				// Lease and return messages in turn, as consumers do.
				st := queuecore.StateLeased
				if (i/10000)%2 == 1 {
					st = queuecore.StateReady
				}
				ops[0] = queuecore.Op{Kind: queuecore.OpUpdate, Msg: benchMessage(uint64(i%10000+1), st)}
				if err := s.Apply(ctx, ops); err != nil {
					b.Fatal(err)
				}
			}
			reportCommits(b, commits, b.N)
			cpu.report(b)
		})
	}
}

// BenchmarkApplyDelete: deletes of small messages, told their size as
// queuecore tells it, in a store that has no body file and in one that
// has one (files.go: fileFloor).
func BenchmarkApplyDelete(b *testing.B) {
	for _, mode := range benchModes {
		for _, files := range []int{0, 1} {
			b.Run(fmt.Sprintf("%s/files=%d", mode, files), func(b *testing.B) {
				ctx := context.Background()
				s := newTestStore(b, mode, "bench")
				fill(b, s, 1, b.N)
				if files > 0 {
					big := benchMessage(uint64(b.N+1), queuecore.StateReady)
					body := make([]byte, defaultFileBodies)
					big.Size = int64(len(body))
					if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: big, Body: body}}); err != nil {
						b.Fatal(err)
					}
				}
				commits := countCommits(s)
				ops := make([]queuecore.Op, 1)
				b.ReportAllocs()
				cpu := startCPU(b)
				for i := range b.N {
					ops[0] = queuecore.Op{Kind: queuecore.OpDelete, Msg: queuecore.Message{ID: uint64(i + 1), Size: int64(len(benchBody))}}
					if err := s.Apply(ctx, ops); err != nil {
						b.Fatal(err)
					}
				}
				reportCommits(b, commits, b.N)
				cpu.report(b)
			})
		}
	}
}

// BenchmarkApplyConcurrent: 8 goroutines insert at once; group commit
// makes them share transactions (and fsyncs in full mode).
func BenchmarkApplyConcurrent(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode.String(), func(b *testing.B) {
			ctx := context.Background()
			s := newTestStore(b, mode, "bench")
			commits := countCommits(s)
			const workers = 8
			var next atomic.Uint64
			var wg sync.WaitGroup
			b.ReportAllocs()
			cpu := startCPU(b)
			for range workers {
				wg.Go(func() {
					ops := make([]queuecore.Op, 1)
					for {
						id := next.Add(1)
						if id > uint64(b.N) {
							return
						}
						ops[0] = queuecore.Op{Kind: queuecore.OpInsert, Msg: benchMessage(id, queuecore.StateReady), Body: benchBody}
						if err := s.Apply(ctx, ops); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			reportCommits(b, commits, b.N)
			cpu.report(b)
		})
	}
}

// BenchmarkRoundTrip is the store's part of publish + lease + ack in the
// queue core: a read, then an Apply, for each.
func BenchmarkRoundTrip(b *testing.B) {
	for _, mode := range benchModes {
		for _, v := range benchVFS {
			for _, backlog := range []int{0, 100000} {
				b.Run(fmt.Sprintf("%s/%s/backlog=%d", mode, v.name, backlog), func(b *testing.B) { benchRoundTrip(b, mode, v.tun, backlog) })
			}
		}
	}
}

func benchRoundTrip(b *testing.B, mode queuecore.SyncMode, tun config, backlog int) {
	ctx := context.Background()
	s := newTunedStore(b, mode, tun, "bench")
	fill(b, s, 1_000_000_000, backlog) // waiting behind, in a higher-priority-free FIFO
	ops := make([]queuecore.Op, 1)
	b.ReportAllocs()
	cpu := startCPU(b)
	for i := range b.N {
		id := uint64(i + 1)
		m := benchMessage(id, queuecore.StateReady)
		m.Priority = 1 // ahead of the backlog
		// publish: the name must be free, then insert
		if _, err := s.Lookup(ctx, "bench", m.Name, false); err == nil {
			b.Fatal("name taken")
		}
		ops[0] = queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: benchBody}
		if err := s.Apply(ctx, ops); err != nil {
			b.Fatal(err)
		}
		// lease: the first ready message, then update it
		var first queuecore.Message
		if err := s.List(ctx, "bench", queuecore.StateReady, func(x queuecore.Message) bool { first = x; return false }); err != nil {
			b.Fatal(err)
		}
		if first.ID != id {
			b.Fatalf("first ready = %d, want %d", first.ID, id)
		}
		first.State, first.Deadline = queuecore.StateLeased, time.Now().Add(30*time.Second)
		ops[0] = queuecore.Op{Kind: queuecore.OpUpdate, Msg: first}
		if err := s.Apply(ctx, ops); err != nil {
			b.Fatal(err)
		}
		// ack: find it by name, then delete
		got, err := s.Lookup(ctx, "bench", m.Name, false)
		if err != nil {
			b.Fatal(err)
		}
		ops[0] = queuecore.Op{Kind: queuecore.OpDelete, Msg: queuecore.Message{ID: got.ID}}
		if err := s.Apply(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "roundtrips/s")
	cpu.report(b)
}

func BenchmarkLookup(b *testing.B) {
	ctx := context.Background()
	s := newTestStore(b, queuecore.SyncNormal, "bench")
	const n = 100000
	fill(b, s, 1, n)
	b.ReportAllocs()
	cpu := startCPU(b)
	for i := range b.N {
		m := benchMessage(uint64(i%n+1), queuecore.StateReady)
		if _, err := s.Lookup(ctx, "bench", m.Name, false); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

func BenchmarkBody(b *testing.B) {
	ctx := context.Background()
	s := newTestStore(b, queuecore.SyncNormal, "bench")
	const n = 100000
	fill(b, s, 1, n)
	b.ReportAllocs()
	cpu := startCPU(b)
	for i := range b.N {
		if _, err := s.Body(ctx, uint64(i%n+1)); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

// BenchmarkBodyBig reads 1 MiB bodies from 64 stored messages, from
// GOMAXPROCS goroutines: the store's own ceiling for a big read, before
// FUSE copies anything (about 0.9-1.1 GB/s on 2 vCPUs, 256 overflow
// pages of 4 KiB each per body).
func BenchmarkBodyBig(b *testing.B) {
	ctx := context.Background()
	s := newTestStore(b, queuecore.SyncNormal, "bench")
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i)
	}
	const n = 64
	for i := range n {
		m := benchMessage(uint64(i+1), queuecore.StateReady)
		m.Size = int64(len(big))
		if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: m, Body: big}}); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(big)))
	b.ResetTimer()
	var next atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := next.Add(1)%n + 1
			body, err := s.Body(ctx, id)
			if err != nil {
				b.Fatal(err)
			}
			if len(body) != len(big) {
				b.Fatalf("body of %d: %d bytes, want %d", id, len(body), len(big))
			}
		}
	})
}

// BenchmarkCheckpointInterval: the round trip with wal_autocheckpoint at
// several values (pages of WAL between checkpoints).
func BenchmarkCheckpointInterval(b *testing.B) {
	for _, pages := range []int{250, 500, 1000, 2000, 4000, 16000} {
		b.Run(fmt.Sprintf("normal/pages=%d", pages), func(b *testing.B) {
			benchRoundTrip(b, queuecore.SyncNormal, config{walAutocheckpoint: pages}, 0)
		})
	}
}

// BenchmarkPageSize: the round trip with smaller database pages.
func BenchmarkPageSize(b *testing.B) {
	for _, size := range []int{1024, 2048, 4096} {
		for _, backlog := range []int{0, 100000} {
			b.Run(fmt.Sprintf("normal/page=%d/backlog=%d", size, backlog), func(b *testing.B) {
				benchRoundTrip(b, queuecore.SyncNormal, config{pageSize: size}, backlog)
			})
		}
	}
}
