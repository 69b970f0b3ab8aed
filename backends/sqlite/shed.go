package sqlite

import "context"

// ShedCaches gives back the page caches of the idle readers (PRAGMA
// shrink_memory): the daemon calls it near its memory budget
// (queuecore.CacheShedder). A reader is taken from the idle pool and given
// back at once, so no read waits for it for long, and the pool keeps its
// size; the pages are read again when needed.
func (s *Store) ShedCaches() {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
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
