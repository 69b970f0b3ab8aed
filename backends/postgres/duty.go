package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"yirangmq/queuecore"
)

// Duty timing: the holder checks its connection, and the others try the
// lock, every dutyInterval; a check gives up after dutyCheckTimeout.
const (
	dutyInterval     = time.Second
	dutyCheckTimeout = 3 * time.Second
)

// dutySessionSettings bound how long the server keeps the lock of a
// holder that vanished: 10 s without a query, or a dead TCP peer found by
// keepalive probes after 5 s idle, 2 s apart, 3 missed. The holder stops
// its duty after dutyInterval + dutyCheckTimeout (4 s) without an answer,
// before the server lets another daemon take it.
var dutySessionSettings = []string{
	"SET idle_session_timeout = '10s'",
	"SET tcp_keepalives_idle = 5",
	"SET tcp_keepalives_interval = 2",
	"SET tcp_keepalives_count = 3",
}

// Duty reports whether this store holds the database's duty lock.
func (s *Store) Duty() bool { return s.duty.Load() }

// dutyState is what the duty goroutine keeps.
type dutyState struct {
	c       *pgx.Conn // dedicated connection; holds the lock when held
	held    bool
	failing bool // the last connect failed (and was logged)
}

// dutyLoop holds or tries the duty lock until ctx is done. The lock is a
// session advisory lock on a connection of its own: it is released by the
// server when that connection ends, however this process ends. The
// holder checks its connection every second; when the check fails it
// drops the connection (so that the server releases the lock, if it has
// not yet) and Duty turns false at once. Another store then takes the
// lock within a second of the server releasing it.
func (s *Store) dutyLoop(ctx context.Context) {
	var d dutyState
	defer s.releaseDuty(&d)
	t := time.NewTicker(dutyInterval)
	defer t.Stop()
	for {
		s.dutyStep(ctx, &d)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Store) dutyStep(ctx context.Context, d *dutyState) {
	if d.c == nil {
		c, err := s.connect(ctx)
		if err != nil {
			if ctx.Err() == nil && !d.failing {
				s.log.Warn("duty: cannot connect; retrying every second", queuecore.LogErr, err)
			}
			d.failing = true
			return
		}
		// A holder cut off from the server without a word (its host died,
		// the network split) must not keep the lock until the server's
		// TCP keepalive notices, hours later by default: the server ends
		// a session that sends nothing for dutyIdleTimeout (the holder
		// sends SELECT 1 every second), and probes its socket early.
		// idle_session_timeout is PostgreSQL 14's; older servers skip it.
		for _, set := range dutySessionSettings {
			if _, err := c.Exec(ctx, set); err != nil {
				s.log.Debug("duty: session setting refused", "setting", set, queuecore.LogErr, err)
			}
		}
		d.c = c
	}
	qctx, cancel := context.WithTimeout(ctx, dutyCheckTimeout)
	defer cancel()
	if d.held {
		if _, err := d.c.Exec(qctx, "SELECT 1"); err != nil {
			s.duty.Store(false)
			d.held = false
			s.dropDutyConn(d)
			if ctx.Err() == nil {
				s.log.Info("duty lost", queuecore.LogErr, err)
			}
		}
		return
	}
	var got bool
	if err := d.c.QueryRow(qctx, "SELECT pg_try_advisory_lock($1)", s.dutyKey).Scan(&got); err != nil {
		s.dropDutyConn(d)
		if ctx.Err() == nil && !d.failing {
			s.log.Warn("duty: cannot try the lock; retrying every second", queuecore.LogErr, err)
		}
		d.failing = true
		return
	}
	if d.failing {
		s.log.Info("duty: connected again")
		d.failing = false
	}
	if got {
		d.held = true
		s.duty.Store(true)
		s.log.Info("duty taken")
	}
}

func (s *Store) dropDutyConn(d *dutyState) {
	if d.c != nil {
		closeConn(d.c)
		d.c = nil
	}
}

// releaseDuty ends the duty connection at Close, which releases the lock.
func (s *Store) releaseDuty(d *dutyState) {
	if d.held {
		s.duty.Store(false)
		s.log.Info("duty released")
	}
	s.dropDutyConn(d)
}
