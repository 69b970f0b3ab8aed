package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"yirangmq/backends"
	"yirangmq/queuecore"
	"yirangmq/testenv/pgtest"
)

// The benchmarks run on a server of their own, through its unix socket,
// in SyncFull (synchronous_commit on, fsync on): every op is one
// transaction and one WAL flush. -benchtime=1000x times 1000 calls.

// BenchmarkApplyInsert: one Apply of one insert (a publish) per op.
func BenchmarkApplyInsert(b *testing.B) {
	srv := pgtest.Start(b)
	ctx := context.Background()
	s := open(b, srv.CreateDB(b, "bench_apply"), backends.Options{Sync: queuecore.SyncFull})
	if err := s.PutQueue(ctx, testQueue("q")); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 256)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		m := readyMsg(uint64(i+1), "q", fmt.Sprintf("m%d", i))
		m.Size = int64(len(body))
		if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpInsert, Msg: m, Body: body}}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLeaseNext: one LeaseNext (the first ready message to leased,
// with its deadline) per op, from a queue holding b.N messages.
func BenchmarkLeaseNext(b *testing.B) {
	srv := pgtest.Start(b)
	ctx := context.Background()
	s := open(b, srv.CreateDB(b, "bench_lease"), backends.Options{Sync: queuecore.SyncFull})
	if err := s.PutQueue(ctx, testQueue("q")); err != nil {
		b.Fatal(err)
	}
	var ops []queuecore.Op
	for i := range b.N {
		ops = append(ops, queuecore.Op{Kind: queuecore.OpInsert, Msg: readyMsg(uint64(i+1), "q", fmt.Sprintf("m%d", i)), Body: []byte("x")})
		if len(ops) == 500 || i == b.N-1 {
			if err := s.Apply(ctx, ops); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	deadline := time.Now().Add(time.Minute)
	lease := func(m queuecore.Message) queuecore.Message {
		m.State, m.Deadline, m.StateAt = queuecore.StateLeased, deadline, time.Now()
		return m
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := s.LeaseNext(ctx, "q", nil, lease); err != nil {
			b.Fatal(err)
		}
	}
}
