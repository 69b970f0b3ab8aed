package sqlite

import "context"

// ShedCaches gives back the page caches of the writer (PRAGMA
// shrink_memory) and of the idle readers (closed: database/sql opens new
// ones as reads need them), then the C allocator's free pages: the daemon
// calls it near its memory budget (queuecore.CacheShedder) and once it
// has gone idle after work. The writer is taken if no commit is in flight
// or queued (else its cache is left for the next call) and given back at
// once, so nothing waits for it for long; the pages are read again when
// needed, from the kernel's page cache at worst.
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

// shrinkIdleReaders closes database/sql's idle readers, and so frees
// their page caches; the pool opens new ones as reads need them.
func (s *Store) shrinkIdleReaders() {
	s.db.SetMaxIdleConns(0)
	s.db.SetMaxIdleConns(maxReaders)
}
