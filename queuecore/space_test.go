package queuecore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"yirangmq/backends/disk"
	"yirangmq/queuecore"
	"yirangmq/testenv"
)

func TestDefaultMinFree(t *testing.T) {
	for _, c := range []struct{ total, want int64 }{
		{2 << 20, 1 << 20},     // half a tiny filesystem
		{8 << 20, 2 << 20},     // at least 2 MiB
		{100 << 20, 10 << 20},  // a tenth
		{64 << 30, 64 << 20},   // at most 64 MiB
		{640 << 20, 64 << 20},  // the tenth reaches the cap
		{300 << 20, 30 << 20},  // a tenth
		{4 << 20, 2 << 20},     // 2 MiB is half of 4
		{3 << 20, 3 << 20 / 2}, // never more than half
	} {
		if got := queuecore.DefaultMinFree(c.total); got != c.want {
			t.Errorf("DefaultMinFree(%d) = %d, want %d", c.total, got, c.want)
		}
	}
}

// Under the floor (a fake disk), publishes are refused with ErrDiskLow
// at create and at commit, while leases, acks, nacks, dead-lettering,
// redrives and deletes go on; acks stop archiving and the archive is
// trimmed oldest first; once the space is back publishing resumes.
func TestFloorRefusesPublishesOnly(t *testing.T) {
	for _, s := range stores[:2] { // the local stores: the floor is theirs
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			core, free, dir := floorCore(t, s.opener)
			pub := func(name string) error {
				_, err := core.Publish(ctx, "q", name, []byte("body of "+name), queuecore.PublishOptions{})
				return err
			}
			consume := func(name string) {
				t.Helper()
				if _, err := core.Lease(ctx, "q", name, ""); err != nil {
					t.Fatalf("lease %s: %v", name, err)
				}
				if err := core.Ack(ctx, "q", name); err != nil {
					t.Fatalf("ack %s: %v", name, err)
				}
			}
			for _, n := range []string{"a1", "a2", "a3", "m1", "m2", "m3", "m4"} {
				if err := pub(n); err != nil {
					t.Fatal(err)
				}
			}
			for _, n := range []string{"a1", "a2", "a3"} {
				consume(n) // archived
			}
			// A reserve file is made while there is room.
			if !testenv.RetryUntil(5*time.Second, func() bool {
				fi, err := os.Stat(filepath.Join(dir, disk.ReserveName))
				return err == nil && fi.Size() == 2<<20
			}) {
				t.Errorf("no reserve file of 2 MiB (half the floor) in %s", dir)
			}

			// Under the floor, the reserve counted (a fake disk: the
			// reserve's blocks are not taken from what it reports).
			free.Store(1 << 20)
			// Far from the floor a measure serves for a moment: the drop
			// is seen within admitFresh.
			tries := 0
			if !testenv.RetryUntil(5*time.Second, func() bool {
				tries++
				return errors.Is(pub(fmt.Sprintf("early%d", tries)), queuecore.ErrDiskLow)
			}) {
				t.Fatal("publishes still accepted 5 s after the disk went under the floor")
			}
			if err := pub("refused"); !errors.Is(err, queuecore.ErrDiskLow) {
				t.Fatalf("publish under the floor: %v, want ErrDiskLow", err)
			}
			if err := core.CheckPublish(ctx, "q", "refused"); !errors.Is(err, queuecore.ErrDiskLow) {
				t.Fatalf("check of a publish under the floor: %v, want ErrDiskLow", err)
			}
			// Draining goes on: ack, nack, dead-letter, redrive, delete.
			consume("m1")
			if _, err := core.Lease(ctx, "q", "m2", ""); err != nil {
				t.Fatal(err)
			}
			if _, err := core.Nack(ctx, "q", "m2"); err != nil {
				t.Fatalf("nack under the floor: %v", err)
			}
			if _, err := core.DeadLetter(ctx, "q", "m3", queuecore.StateReady); err != nil {
				t.Fatalf("dead-letter under the floor: %v", err)
			}
			if _, err := core.Redrive(ctx, "q", "m3"); err != nil {
				t.Fatalf("redrive under the floor: %v", err)
			}
			if err := core.Delete(ctx, "q", queuecore.StateReady, "m4"); err != nil {
				t.Fatalf("delete under the floor: %v", err)
			}
			// The tick saw the floor: the archive is trimmed, and the ack
			// under the floor did not archive.
			d := waitLowTrimmed(t, core, "under the floor")
			if d.Disk.ArchiveTrimmedTotal < 3 || d.Disk.PublishesRefusedTotal < 2 || d.Disk.MinFreeBytes != 4<<20 {
				t.Errorf("disk stats %+v", d.Disk)
			}
			if _, err := core.Get(ctx, "q", queuecore.StateArchived, "m1"); !errors.Is(err, queuecore.ErrNotFound) {
				t.Errorf("m1, acked under the floor, is archived (%v)", err)
			}
			// The reserve went for the drain: what is really free is under
			// half the floor.
			if fi, err := os.Stat(filepath.Join(dir, disk.ReserveName)); err != nil || fi.Size() != 0 || d.Disk.ReserveBytes != 0 {
				t.Errorf("the reserve file was not given back under half the floor (%v, %+v)", err, d.Disk)
			}

			// Above the floor but under its headroom (a quarter of the
			// floor): still low, so publishing does not flap at the floor.
			free.Store(4<<20 + 512<<10)
			if err := pub("headroom"); !errors.Is(err, queuecore.ErrDiskLow) {
				t.Fatalf("publish above the floor, under its headroom, while low: %v, want ErrDiskLow", err)
			}
			if d, _ = core.DaemonStats(ctx); !d.Disk.Low {
				t.Errorf("above the floor, under its headroom: disk %+v, want still low", d.Disk)
			}
			free.Store(4<<20 + 1<<20 + 64<<10) // past the headroom and the refused publish
			if err := pub("past-headroom"); err != nil {
				t.Fatalf("publish past the floor's headroom: %v", err)
			}

			free.Store(100 << 20) // space is back
			if err := pub("back"); err != nil {
				t.Fatalf("publish once space is back: %v", err)
			}
			if !testenv.RetryUntil(5*time.Second, func() bool {
				d, _ = core.DaemonStats(ctx)
				return !d.Disk.Low && d.Disk.ReserveBytes == 2<<20
			}) {
				t.Errorf("space back: disk %+v, want not low and the reserve made again", d.Disk)
			}
		})
	}
}

// An idle daemon has no free-space timer, but a publish that finds the
// disk under its floor wakes the tick: the archive is trimmed and the
// floor is watched again, with no commit to start it.
func TestFloorSeenWhileIdle(t *testing.T) {
	for _, s := range stores[:2] {
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			core, free, _ := floorCore(t, s.opener)
			// archiveThenIdle archives two messages, then waits until
			// the tick idles and its last measure is past.
			archiveThenIdle := func(names ...string) {
				t.Helper()
				for _, n := range names {
					if _, err := core.Publish(ctx, "q", n, []byte("x"), queuecore.PublishOptions{}); err != nil {
						t.Fatal(err)
					}
					if _, err := core.Lease(ctx, "q", n, ""); err != nil {
						t.Fatal(err)
					}
					if err := core.Ack(ctx, "q", n); err != nil {
						t.Fatal(err)
					}
				}
				testenv.MustRetryUntil(t, 5*time.Second, "the free-space tick to idle after the last commit", func() bool {
					return queuecore.SpaceIdle(core)
				})
				// The tick's last measure serves a publish for admitFresh
				// (100 ms); past it the next publish measures for itself,
				// so it is refused without a commit that would wake the
				// tick anyway.
				time.Sleep(150 * time.Millisecond)
			}
			archiveThenIdle("a1", "a2")
			free.Store(1 << 20) // filled from outside, no commit since
			if _, err := core.Publish(ctx, "q", "p1", []byte("x"), queuecore.PublishOptions{}); !errors.Is(err, queuecore.ErrDiskLow) {
				t.Fatalf("publish under the floor: %v, want ErrDiskLow", err)
			}
			// Only the tick trims the archive; no commit has woken it.
			d := waitLowTrimmed(t, core, "under the floor while idle")
			free.Store(100 << 20)
			if !testenv.RetryUntil(5*time.Second, func() bool {
				d, _ = core.DaemonStats(ctx)
				return !d.Disk.Low
			}) {
				t.Fatalf("space back: disk %+v, want not low", d.Disk)
			}
			// A read of the stats alone sees the floor too, and wakes
			// the tick.
			archiveThenIdle("b1", "b2")
			free.Store(1 << 20)
			waitLowTrimmed(t, core, "stats read under the floor while idle")
		})
	}
}

// fakeDisk is the store directory's file system with the free space of
// free, of 1 GiB in all.
type fakeDisk struct {
	*disk.Disk
	free *atomic.Int64
}

func (f fakeDisk) Free() (int64, int64, error) { return f.free.Load(), 1 << 30, nil }

// floorCore opens store s in a new directory under a core whose disk is
// fake (free is what it reports, 100 MiB at first, of 1 GiB), with a
// floor of 4 MiB and a queue q. Both close when the test ends.
func floorCore(t *testing.T, opener func(testing.TB) openStore) (*queuecore.Core, *atomic.Int64, string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := opener(t)(ctx, dir, queuecore.SyncNormal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	free := new(atomic.Int64)
	free.Store(100 << 20)
	opts := queuecore.Options{Clock: testenv.NewFakeClock(t0), Disk: fakeDisk{disk.New(dir), free}, MinFree: 4 << 20}
	core, err := queuecore.Open(ctx, st, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { core.Close() })
	if err := core.CreateQueue(ctx, "q", 0, 0, 0o755); err != nil {
		t.Fatal(err)
	}
	return core, free, dir
}

// waitLowTrimmed waits until the core's disk is low and the archive of
// its one queue is empty (trimmed by the free-space tick), and returns
// the stats that showed it.
func waitLowTrimmed(t *testing.T, core *queuecore.Core, what string) queuecore.DaemonStats {
	t.Helper()
	var d queuecore.DaemonStats
	if !testenv.RetryUntil(5*time.Second, func() bool {
		d, _ = core.DaemonStats(context.Background())
		return d.Disk != nil && d.Disk.Low && d.Queues[0].Archived == 0
	}) {
		t.Fatalf("%s: disk %+v, archived %d; want low and the archive trimmed", what, d.Disk, d.Queues[0].Archived)
	}
	return d
}
