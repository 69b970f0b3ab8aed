package backendtest

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"yirangmq/queuecore"
)

// listKey names one List: a queue and a state.
type listKey struct {
	Queue string
	State queuecore.State
}

func (k listKey) String() string { return k.Queue + "/" + k.State.String() }

// snapshot is everything a store answers, read through its interface: the
// suite compares snapshots to check that a failed batch changed nothing and
// that a reopened store is the one that was closed.
type snapshot struct {
	Queues []queuecore.QueueInfo
	Lists  map[listKey][]queuecore.Message // non-empty lists only, in List order
	Bodies map[uint64][]byte
	Counts map[string]map[queuecore.State]queuecore.Count // empty entries pruned
	MaxID  uint64
}

// readSnapshot reads every queue, message, body and count of s.
func readSnapshot(ctx context.Context, s queuecore.Store) (*snapshot, error) {
	qs, err := s.Queues(ctx)
	if err != nil {
		return nil, fmt.Errorf("queues: %w", err)
	}
	snap := &snapshot{Queues: qs, Lists: map[listKey][]queuecore.Message{}, Bodies: map[uint64][]byte{}}
	for _, q := range qs {
		for _, st := range queuecore.States {
			var ms []queuecore.Message
			err := s.List(ctx, q.Name, st, func(m queuecore.Message) bool {
				ms = append(ms, m)
				return true
			})
			if err != nil {
				return nil, fmt.Errorf("list %s/%s: %w", q.Name, st, err)
			}
			if len(ms) > 0 {
				snap.Lists[listKey{q.Name, st}] = ms
			}
		}
	}
	for _, ms := range snap.Lists {
		for _, m := range ms {
			b, err := s.Body(ctx, m.ID)
			if err != nil {
				return nil, fmt.Errorf("body of message %d: %w", m.ID, err)
			}
			snap.Bodies[m.ID] = b
		}
	}
	c, err := s.Counts(ctx)
	if err != nil {
		return nil, fmt.Errorf("counts: %w", err)
	}
	snap.Counts = pruneCounts(c)
	if snap.MaxID, err = s.MaxID(ctx); err != nil {
		return nil, fmt.Errorf("max id: %w", err)
	}
	return snap, nil
}

func takeSnapshot(t *testing.T, s queuecore.Store) *snapshot {
	t.Helper()
	snap, err := readSnapshot(context.Background(), s)
	if err != nil {
		t.Fatalf("read the whole store: %v", err)
	}
	return snap
}

// messages returns every message of the snapshot by ID.
func (s *snapshot) messages() map[uint64]queuecore.Message {
	out := map[uint64]queuecore.Message{}
	for _, ms := range s.Lists {
		for _, m := range ms {
			out[m.ID] = m
		}
	}
	return out
}

// diffSnapshots lists how got differs from want. MaxID is compared only if
// withMaxID: a failed batch may or may not leave its IDs counted.
func diffSnapshots(want, got *snapshot, withMaxID bool) []string {
	var diffs []string
	if len(want.Queues) != len(got.Queues) {
		diffs = append(diffs, fmt.Sprintf("queues: got %v, want %v", queueNames(got.Queues), queueNames(want.Queues)))
	} else {
		for i := range want.Queues {
			if d := diffQueue(want.Queues[i], got.Queues[i]); d != "" {
				diffs = append(diffs, d)
			}
		}
	}
	keys := map[listKey]bool{}
	for k := range want.Lists {
		keys[k] = true
	}
	for k := range got.Lists {
		keys[k] = true
	}
	for k := range keys {
		w, g := want.Lists[k], got.Lists[k]
		if !slices.Equal(ids(w), ids(g)) {
			diffs = append(diffs, fmt.Sprintf("List(%s): got IDs %v, want %v", k, ids(g), ids(w)))
			continue
		}
		for i := range w {
			if d := diffMessage(w[i], g[i]); d != "" {
				diffs = append(diffs, fmt.Sprintf("List(%s): message %d: %s", k, w[i].ID, d))
			}
		}
	}
	for id, wb := range want.Bodies {
		if gb, ok := got.Bodies[id]; ok && !bytes.Equal(wb, gb) {
			diffs = append(diffs, fmt.Sprintf("Body(%d) = %s, want %s", id, abbrev(gb), abbrev(wb)))
		}
	}
	if !reflect.DeepEqual(want.Counts, got.Counts) {
		diffs = append(diffs, fmt.Sprintf("Counts = %v, want %v", got.Counts, want.Counts))
	}
	if withMaxID && got.MaxID < want.MaxID {
		diffs = append(diffs, fmt.Sprintf("MaxID = %d, want at least %d", got.MaxID, want.MaxID))
	}
	slices.Sort(diffs)
	return diffs
}

// wantSnapshot fails the test if got differs from want.
func wantSnapshot(t *testing.T, what string, want, got *snapshot, withMaxID bool) {
	t.Helper()
	for _, d := range diffSnapshots(want, got, withMaxID) {
		t.Errorf("%s: %s", what, d)
	}
}

func queueNames(qs []queuecore.QueueInfo) []string {
	out := make([]string, len(qs))
	for i, q := range qs {
		out[i] = q.Name
	}
	return out
}

// diffQueue compares every field of a queue.
func diffQueue(want, got queuecore.QueueInfo) string {
	if want.Name != got.Name || !bytes.Equal(want.Policy, got.Policy) || want.UID != got.UID ||
		want.GID != got.GID || want.Mode != got.Mode || !want.CreatedAt.Equal(got.CreatedAt) ||
		want.CreatedAt.IsZero() != got.CreatedAt.IsZero() {
		return fmt.Sprintf("queue %q: got {policy %s uid %d gid %d mode %o created %v}, want {policy %s uid %d gid %d mode %o created %v}",
			want.Name, got.Policy, got.UID, got.GID, got.Mode, got.CreatedAt,
			want.Policy, want.UID, want.GID, want.Mode, want.CreatedAt)
	}
	return ""
}
