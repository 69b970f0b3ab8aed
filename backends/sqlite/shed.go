package sqlite

import "context"

// ShedCaches gives back the page caches of the writer and of the idle
// readers (PRAGMA shrink_memory), then the C allocator's free pages: the
// daemon calls it near its memory budget (queuecore.CacheShedder) and once
// it has gone idle after work. The writer is taken if no commit is in
// flight or queued (else its cache is left for the next call), a reader
// from the idle pool, and each is given back at once, so nothing waits
// for it for long and the pool keeps its size; the pages are read again
// when needed, from the kernel's page cache at worst.
func (s *Store) ShedCaches() {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return
	}
	before := sqliteMemoryUsed()
	// The writer only if it is free: the memory watcher calls this under
	// load, and must not wait for the load to pause.
	if w := s.tryTakeWriter(); w != nil {
		if _, err := w.conn.ExecContext(context.Background(), "PRAGMA shrink_memory", nil); err != nil {
			s.log.Warn("shrink the writer's cache", "err", err)
		}
		s.giveWriter()
	}
	s.shrinkIdleReaders()
	trimCHeap()
	s.log.Debug("sqlite caches shed", "sqlite_kib_before", before>>10, "sqlite_kib_after", sqliteMemoryUsed()>>10)
}

// shrinkIdleReaders empties the page cache of every idle reader.
func (s *Store) shrinkIdleReaders() {
	if s.db != nil {
		s.shrinkSQLReads()
		return
	}
	var took []*reader
	defer func() {
		for _, r := range took {
			s.idle <- r // never blocks: these came from it
		}
	}()
	for {
		select {
		case r := <-s.idle:
			took = append(took, r)
			if _, err := r.conn.ExecContext(context.Background(), "PRAGMA shrink_memory", nil); err != nil {
				s.log.Warn("shrink a reader's cache", "err", err)
			}
		default:
			return
		}
	}
}
