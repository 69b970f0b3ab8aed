package sqlite

import (
	"context"
	"sync"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// ShedCaches leaves the readers usable, also while reads run, and no
// reader taken.
func TestShedCachesKeepsReaders(t *testing.T) {
	s := newTestStore(t, queuecore.SyncNormal, "q")
	ctx := context.Background()
	var _ queuecore.CacheShedder = s
	var wg sync.WaitGroup
	for g := 0; g < 2*maxReaders; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				if _, err := s.Queues(ctx); err != nil {
					t.Error(err)
					return
				}
				if _, err := s.Lookup(ctx, "q", "missing", false); err == nil {
					t.Error("Lookup of a missing name found something")
					return
				}
			}
		}()
	}
	for i := 0; i < 20; i++ {
		s.ShedCaches()
	}
	wg.Wait()
	if st := s.db.Stats(); st.InUse != 0 || st.OpenConnections > maxReaders {
		t.Errorf("after the reads: %d readers in use, %d open; want 0 and at most %d", st.InUse, st.OpenConnections, maxReaders)
	}
	if _, err := s.Queues(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.ShedCaches() // closed: nothing to do, no panic
}

// ShedCaches gives back the writer's page cache too, which is the store's
// largest (up to writerCacheKiB): after 20,000 inserts it holds megabytes
// that the idle readers' caches alone never do.
func TestShedCachesEmptiesTheWriter(t *testing.T) {
	s := newTestStore(t, queuecore.SyncNormal, "bench")
	defer s.Close()
	fill(t, s, 1, 20_000)
	before := sqliteMemoryUsed()
	if before < 0 {
		t.Fatal("sqlite3_status64(SQLITE_STATUS_MEMORY_USED) failed")
	}
	s.ShedCaches()
	after := sqliteMemoryUsed()
	t.Logf("SQLite's memory: %d KiB before ShedCaches, %d KiB after", before>>10, after>>10)
	if freed := before - after; freed < 2<<20 {
		t.Errorf("ShedCaches gave back %d KiB of SQLite's %d KiB, want at least 2 MiB (the writer's cache)", freed>>10, before>>10)
	}
	// The pages are read again when needed.
	m, err := s.Lookup(context.Background(), "bench", benchMessage(12_345, queuecore.StateReady).Name, false)
	if err != nil || m.ID != 12_345 {
		t.Fatalf("Lookup after ShedCaches = %d, %v; want message 12345", m.ID, err)
	}
	fill(t, s, 20_001, 10)
}

// The memory watcher calls ShedCaches under load, when the writer may pass
// from one commit to the next for as long as the load lasts: ShedCaches
// leaves the writer's cache alone then, rather than wait for it.
func TestShedCachesDoesNotWaitForTheWriter(t *testing.T) {
	s := newTestStore(t, queuecore.SyncNormal, "q")
	defer s.Close()
	s.takeWriter() // a commit in flight
	done := make(chan struct{})
	go func() {
		s.ShedCaches()
		close(done)
	}()
	select {
	case <-done:
		s.giveWriter()
	case <-time.After(30 * time.Second):
		s.giveWriter()
		<-done
		t.Fatal("ShedCaches waited for the writer a commit held")
	}
}
