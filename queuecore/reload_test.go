package queuecore_test

import (
	"slices"
	"testing"
	"time"

	"yirangmq/queuecore"
	"yirangmq/testenv"
)

// deafStore is a shared store whose daemon hears no hints (its listener
// is down) and does not hold the duty.
type deafStore struct{ queuecore.SharedStore }

func (deafStore) Subscribe(func(queuecore.Change)) {}
func (deafStore) Duty() bool                       { return false }

// A daemon of a shared store that neither holds the duty nor hears hints
// still learns of a queue another daemon made: every daemon reloads its
// queues every 30 s, not only the duty holder.
func TestDeafDaemonWithoutDutyReloadsQueues(t *testing.T) {
	e := postgresEnv(t, func(st queuecore.Store) queuecore.Store { return st })
	st, err := postgresOpener(t)(e.ctx, e.dir, queuecore.SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deaf, err := queuecore.Open(e.ctx, deafStore{st.(queuecore.SharedStore)}, queuecore.Options{Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	defer deaf.Close()
	has := func() bool { return slices.Contains(deaf.QueueNames(), "late") }

	e.queue("late", "") // made by the duty holder; no hint reaches deaf
	time.Sleep(200 * time.Millisecond)
	for range 10 {
		e.clock.Advance(time.Second)
	}
	time.Sleep(200 * time.Millisecond)
	if has() {
		t.Fatal("the deaf daemon has the new queue within 10 s of its clock: the test's store is not deaf")
	}
	// Within the reload period (30 s) of its clock, it has it.
	advanced := 10 * time.Second
	if !testenv.RetryUntil(10*time.Second, func() bool {
		if advanced < 40*time.Second {
			e.clock.Advance(time.Second)
			advanced += time.Second
		}
		return has()
	}) {
		t.Fatalf("the deaf daemon without the duty does not have the queue made elsewhere after %v of its clock", advanced)
	}
	t.Logf("the queue showed after %v of the deaf daemon's clock", advanced)
}
