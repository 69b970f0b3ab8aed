package sqlite

import (
	"context"
	"sync"
	"testing"

	"yirangmq/queuecore"
)

// ShedCaches leaves every reader usable and the pool whole, also while
// reads run.
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
	s.readersMu.Lock()
	open := s.readers
	s.readersMu.Unlock()
	if len(s.idle) != open {
		t.Errorf("%d idle readers of %d open after the reads", len(s.idle), open)
	}
	if _, err := s.Queues(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.ShedCaches() // closed: nothing to do, no panic
}
