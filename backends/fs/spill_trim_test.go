package fs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// TestSpillTrimConcurrent trims a spill while other goroutines list the
// queue (whole, and its first few) and look its messages up by name, and
// checkpoints take images of it: each listing must stay in delivery order
// and every name it gives must be found, with hole punching and with the
// copy to a new file, and the backlog must be whole after a crash.
func TestSpillTrimConcurrent(t *testing.T) {
	for _, punch := range []bool{true, false} {
		t.Run(fmt.Sprintf("punch=%v", punch), func(t *testing.T) {
			if !punch {
				stubPunch(t, unix.EOPNOTSUPP)
			}
			ctx := context.Background()
			dir := t.TempDir()
			cfg := config{spillAt: 4, spillTrimAt: 64, checkpointBytes: 8192}
			s := openTest(t, dir, queuecore.SyncNormal, cfg, nil)
			mustPutQueues(t, s, "q")
			const backlog, passes = 300, 1500
			var next uint64
			publish := func() {
				next++
				mustApply(t, s, tins(tmsg(next, "q", fmt.Sprintf("m%06d", next), queuecore.StateReady)))
			}
			for range backlog {
				publish()
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var fail atomic.Value
			for r := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						var prev queuecore.Message
						n := 0
						err := s.List(ctx, "q", queuecore.StateReady, func(m queuecore.Message) bool {
							if n > 0 && prev.Seq > m.Seq {
								fail.Store(fmt.Sprintf("List: %s (seq %d) after %s (seq %d)", m.Name, m.Seq, prev.Name, prev.Seq))
							}
							prev = m
							n++
							if r == 0 {
								// Leased meanwhile is fine; another message
								// under the name is not.
								got, err := s.Lookup(ctx, "q", m.Name, false)
								if err == nil && got.ID != m.ID {
									fail.Store(fmt.Sprintf("Lookup %s: message %d, List gave %d", m.Name, got.ID, m.ID))
								}
							}
							return r != 2 || n < 3
						})
						if err != nil {
							fail.Store(err.Error())
						}
					}
				}()
			}
			trimmed := int64(0)
			for i := range passes {
				publish()
				var first queuecore.Message
				if err := s.List(ctx, "q", queuecore.StateReady, func(m queuecore.Message) bool { first = m; return false }); err != nil {
					t.Fatal(err)
				}
				if b, err := s.Body(ctx, first.ID); err != nil || string(b) != string(tbody(first.ID)) {
					t.Fatalf("pass %d: Body(%d) = %q, %v", i, first.ID, b, err)
				}
				first.State = queuecore.StateLeased
				first.Deadline = epoch
				mustApply(t, s, tupd(first))
				mustApply(t, s, tdel(first.ID))
				s.mu.RLock()
				if sp := s.ix.queues["q"].spill; sp != nil {
					trimmed = max(trimmed, sp.trimmed)
				}
				s.mu.RUnlock()
			}
			close(stop)
			wg.Wait()
			if v := fail.Load(); v != nil {
				t.Fatal(v)
			}
			if trimmed == 0 {
				t.Error("no trim in all the passes")
			}
			crash(t, s)
			s = openTest(t, dir, queuecore.SyncNormal, cfg, nil)
			var want []string
			for id := next - backlog + 1; id <= next; id++ {
				want = append(want, fmt.Sprintf("m%06d", id))
			}
			if got := listNames(t, s, "q", queuecore.StateReady); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("after a crash: %d ready messages, want the %d of the backlog in order", len(got), len(want))
			}
		})
	}
}
