package fs

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// BenchmarkMessageMemory measures what a message costs in the store's
// memory (its index entry: the limit of --fs-max-messages is about
// this): the Go heap in use after a collection, with 100,000 messages
// of one queue against none, per message. It reports heap-B/msg.
//
//	go test -run '^$' -bench MessageMemory -benchtime 1x ./backends/fs
func BenchmarkMessageMemory(b *testing.B) {
	const n = 100_000
	for range b.N {
		ctx := context.Background()
		s, err := OpenTuned(ctx, b.TempDir(), backends.Options{Sync: queuecore.SyncOff}, Tuning{MaxMessages: n, Spares: -1})
		if err != nil {
			b.Fatal(err)
		}
		at := time.Unix(1_700_000_000, 0)
		if err := s.PutQueue(ctx, queuecore.QueueInfo{Name: "q", Policy: []byte(`{}`), UID: 1000, GID: 1000, Mode: 0o750, CreatedAt: at}); err != nil {
			b.Fatal(err)
		}
		before := heapInUse()
		body := []byte("a message of a few bytes\n")
		var ops []queuecore.Op
		for id := uint64(1); id <= n; id++ {
			m := queuecore.Message{
				ID: id, Queue: "q", Name: fmt.Sprintf("m%07d.json", id), State: queuecore.StateReady, Seq: id,
				MessageID: fmt.Sprintf("%032x", id), PublishedAt: at, FirstAt: at, StateAt: at,
				UID: 1000, GID: 1000, Size: int64(len(body)),
			}
			ops = append(ops, queuecore.Op{Kind: queuecore.OpInsert, Msg: m, Body: body})
			if len(ops) == 1000 {
				if err := s.Apply(ctx, ops); err != nil {
					b.Fatal(err)
				}
				ops = ops[:0]
			}
		}
		ops = nil
		after := heapInUse()
		b.ReportMetric(float64(after-before)/n, "heap-B/msg")
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// heapInUse is the Go heap in use after two collections.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}
