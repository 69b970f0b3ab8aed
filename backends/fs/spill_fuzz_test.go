package fs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// TestSpillRandom runs random batches (publishes, leases, nacks back to
// inbox/ with a new Seq, renames, moves between queues, deletes of any
// message and of the oldest, and batches that fail halfway) on a store
// with a tiny spill threshold, and after each one checks that every
// message List gives is found by ID (Body) and by name (Lookup), and that
// Counts agree; it reopens the store now and then. Seed 4 keeps one queue
// whose spill is trimmed as it goes (spill.trim), and fails if none was.
func TestSpillRandom(t *testing.T) {
	ctx := context.Background()
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			dir := t.TempDir()
			cfg := config{spillAt: 2, checkpointBytes: 4096, spillTrimAt: 1}
			s := openTest(t, dir, queuecore.SyncOff, cfg, nil)
			queues := []string{"a", "b", "c"}
			inserts, width := 5, 4 // inserts in 10 ops; ops in a batch, at most
			if seed == 4 {
				// One queue whose spill lives long, and a backlog that
				// grows slowly: its spill's head is trimmed.
				queues, inserts, width = queues[:1], 4, 8
			}
			mustPutQueues(t, s, queues...)
			live := map[uint64]queuecore.Message{}
			var next uint64
			var trimmed int64 // the most records a spill of queue a dropped
			for step := range 400 {
				var ops []queuecore.Op
				for range 1 + rng.IntN(width) {
					ids := make([]uint64, 0, len(live))
					for id := range live {
						ids = append(ids, id)
					}
					if len(ids) == 0 || rng.IntN(10) < inserts {
						next++
						m := tmsg(next, queues[rng.IntN(len(queues))], fmt.Sprintf("n%d", next), queuecore.StateReady)
						m.Seq = next + uint64(rng.IntN(5)) // commits a little out of order
						ops = append(ops, tins(m))
						live[m.ID] = m
						continue
					}
					if rng.IntN(2) == 0 {
						// The oldest goes, as a consumer takes them: the
						// head of a spill empties, and trims are tried.
						id := slices.Min(ids)
						delete(live, id)
						ops = append(ops, tdel(id))
						continue
					}
					m := live[ids[rng.IntN(len(ids))]]
					delete(live, m.ID)
					switch rng.IntN(5) {
					case 0:
						ops = append(ops, tdel(m.ID))
						continue
					case 1:
						m.State, m.Deadline = queuecore.StateLeased, epoch
					case 2:
						next++
						m.State, m.Seq = queuecore.StateReady, next
						m.Deadline = time.Time{}
					case 3:
						m.Name = m.Name + "r"
					case 4:
						m.Queue = queues[rng.IntN(len(queues))]
						next++
						m.State, m.Seq = queuecore.StateReady, next
					}
					ops = append(ops, tupd(m))
					live[m.ID] = m
				}
				fail := rng.IntN(12) == 0
				if fail {
					ops = append(ops, tdel(1<<40))
				}
				err := s.Apply(ctx, ops)
				if fail != (err != nil) {
					t.Fatalf("step %d: Apply: %v (fail %v)", step, err, fail)
				}
				if fail {
					// Undo the model.
					for _, op := range ops {
						delete(live, op.Msg.ID)
					}
					live = map[uint64]queuecore.Message{}
					for _, q := range queues {
						for _, st := range queuecore.States {
							_ = s.List(ctx, q, st, func(m queuecore.Message) bool { live[m.ID] = m; return true })
						}
					}
				}
				if rng.IntN(100) == 0 {
					if rng.IntN(2) == 0 {
						crash(t, s)
					} else if err := s.Close(); err != nil {
						t.Fatal(err)
					}
					s = openTest(t, dir, queuecore.SyncOff, cfg, nil)
				}
				checkSpillStore(t, s, queues, live, step)
				if sp := s.ix.queues["a"].spill; sp != nil {
					trimmed = max(trimmed, sp.trimmed)
				}
			}
			if seed == 4 && trimmed == 0 {
				t.Error("no spill was trimmed")
			}
		})
	}
}

func checkSpillStore(t *testing.T, s *Store, queues []string, live map[uint64]queuecore.Message, step int) {
	t.Helper()
	ctx := context.Background()
	seen := 0
	counts, _ := s.Counts(ctx)
	for _, q := range queues {
		for _, st := range queuecore.States {
			var ms []queuecore.Message
			if err := s.List(ctx, q, st, func(m queuecore.Message) bool {
				ms = append(ms, m)
				return true
			}); err != nil {
				t.Fatal(err)
			}
			n := len(ms)
			for i, m := range ms {
				s.mu.RLock()
				e, err := s.ix.get(m.ID)
				var info string
				if e == nil {
					qq := s.ix.queues[q]
					if sp := qq.spill; sp != nil {
						info = fmt.Sprintf("spill n %d head %d live %d blockMax %v", sp.n, sp.head, sp.live, sp.blockMax)
						_ = sp.each(qq, func(e *entry) { info += fmt.Sprintf(" [%d slot %d]", e.id, e.slot) })
					}
				}
				s.mu.RUnlock()
				if e == nil || err != nil {
					t.Fatalf("step %d: %s/%s lists message %d (%s) but get does not find it: %v; %s", step, q, st, m.ID, m.Name, err, info)
				}
				got, err := s.Lookup(ctx, q, m.Name, st == queuecore.StateArchived)
				if err != nil || got.ID != m.ID {
					t.Fatalf("step %d: Lookup(%s, %s) = %d, %v; want %d", step, q, m.Name, got.ID, err, m.ID)
				}
				if want, ok := live[m.ID]; !ok || want.Queue != q || want.Name != m.Name || want.State != st {
					t.Fatalf("step %d: %s/%s lists %d %s; the model has %+v", step, q, st, m.ID, m.Name, want)
				}
				if i > 0 {
					prev := ms[i-1]
					if prev.SortKey() > m.SortKey() || prev.SortKey() == m.SortKey() && prev.Seq > m.Seq {
						t.Fatalf("step %d: %s/%s out of order: %d (seq %d) before %d (seq %d)", step, q, st, prev.ID, prev.Seq, m.ID, m.Seq)
					}
				}
			}
			seen += n
			if c := counts[q][st].N; c != int64(n) {
				t.Fatalf("step %d: Counts %s/%s = %d, List gives %d", step, q, st, c, n)
			}
		}
	}
	if seen != len(live) {
		t.Fatalf("step %d: the store lists %d messages, the model has %d", step, seen, len(live))
	}
}
