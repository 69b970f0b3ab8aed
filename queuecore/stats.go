package queuecore

import (
	"context"
	"os"
	"sync/atomic"
	"time"
)

// counters count events since the core started (Prometheus counter
// semantics: they start again from 0 after a restart). Gauges, by
// contrast, are exact from the store.
type counters struct {
	published, leased, acked, nacked, expired atomic.Int64
	deadLettered, redriven, rejected          atomic.Int64
	deduplicated                              atomic.Int64
}

const (
	ratePublished = iota
	rateLeased
	rateAcked
	rateKinds
)

// rates counts events per second over the last minute in a ring of
// one-second buckets; guarded by the queue's mutex.
type rates struct {
	sec [60]int64
	n   [60][rateKinds]int64
}

func (r *rates) add(now time.Time, kind int) {
	s := now.Unix()
	i := s % 60
	if r.sec[i] != s {
		r.sec[i] = s
		r.n[i] = [rateKinds]int64{}
	}
	r.n[i][kind]++
}

// perSec returns published, leased and acked per second over the last
// minute.
func (r *rates) perSec(now time.Time) (published, leased, acked float64) {
	s := now.Unix()
	var sum [rateKinds]int64
	for i := range r.sec {
		if r.sec[i] > s-60 && r.sec[i] <= s {
			for k := range sum {
				sum[k] += r.n[i][k]
			}
		}
	}
	return float64(sum[ratePublished]) / 60, float64(sum[rateLeased]) / 60, float64(sum[rateAcked]) / 60
}

// QueueStats is a snapshot of one queue (QUEUE/.stats).
type QueueStats struct {
	Queue             string  `json:"queue"`
	Ready             int64   `json:"ready"`
	Inflight          int64   `json:"inflight"`
	Delayed           int64   `json:"delayed"`
	DLQ               int64   `json:"dlq"`
	Archived          int64   `json:"archived"`
	Bytes             int64   `json:"bytes"` // bodies of messages in every state
	OldestReadyAgeSec float64 `json:"oldest_ready_age_sec"`

	PublishedTotal    int64 `json:"published_total"`
	LeasedTotal       int64 `json:"leased_total"`
	AckedTotal        int64 `json:"acked_total"`
	NackedTotal       int64 `json:"nacked_total"`
	ExpiredTotal      int64 `json:"expired_total"`
	DeadLetteredTotal int64 `json:"dead_lettered_total"`
	RedrivenTotal     int64 `json:"redriven_total"`
	RejectedTotal     int64 `json:"rejected_total"`
	DeduplicatedTotal int64 `json:"deduplicated_total"`

	Paused bool  `json:"paused"`
	Rates  Rates `json:"rates_1m"`

	// RefusedTotal counts the operations on the queue refused since the
	// daemon started, and LastRefusals are the last of them, the newest
	// first (refusals.go). MOUNT/.stats, which every user of the mount
	// may read, leaves them out (nil): they name messages and users, and
	// QUEUE/.stats is reached only through the queue's directory, with
	// its permissions.
	RefusedTotal int64     `json:"refused_total"`
	LastRefusals []Refusal `json:"last_refusals,omitzero"`
}

// Rates are events per second averaged over the last minute.
type Rates struct {
	PublishedPerSec float64 `json:"published_per_sec"`
	LeasedPerSec    float64 `json:"leased_per_sec"`
	AckedPerSec     float64 `json:"acked_per_sec"`
}

// DaemonStats is MOUNT/.stats.
type DaemonStats struct {
	Version   string  `json:"version"`
	Backend   string  `json:"backend"`
	Store     string  `json:"store"`
	UptimeSec float64 `json:"uptime_sec"`
	// Pid is the daemon's process: `yirangmq umount` waits for it to exit.
	Pid int `json:"pid"`
	// Duty is set with a store several daemons share: whether this daemon
	// now does the timed work (expiry, backoff, retention) for all of them.
	Duty *bool `json:"duty,omitempty"`
	// Disk is the free-space floor and the filesystem under the store
	// (none for a database server's store).
	Disk   *DiskStats   `json:"disk,omitempty"`
	Queues []QueueStats `json:"queues"`
}

// oldestScan bounds the look for the oldest ready message: with
// priorities the oldest is not always first in line, so the age is that of
// the oldest among the next oldestScan messages (exact without priorities).
const oldestScan = 64

// Stats returns a snapshot of one queue. It costs one short store read
// whatever the queue holds.
func (c *Core) Stats(ctx context.Context, queueName string) (QueueStats, error) {
	q, err := c.queue(queueName)
	if err != nil {
		return QueueStats{}, err
	}
	if err := c.gauges.refresh(ctx); err != nil {
		return QueueStats{}, err
	}
	now := c.now()
	var oldest time.Time
	n := 0
	if err := c.store.List(ctx, queueName, StateReady, func(m Message) bool {
		// PublishedAt may be a time its writer set (PublishOptions.MTime);
		// the commit time is then FirstAt, and after a redrive PublishedAt.
		at := m.PublishedAt
		if m.FirstAt.After(at) {
			at = m.FirstAt
		}
		if oldest.IsZero() || at.Before(oldest) {
			oldest = at
		}
		n++
		return n < oldestScan
	}); err != nil {
		return QueueStats{}, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	g := q.gauges
	s := QueueStats{
		Queue: queueName, Ready: g[StateReady].N, Inflight: g[StateLeased].N, Delayed: g[StateDelayed].N,
		DLQ: g[StateDead].N, Archived: g[StateArchived].N, Paused: q.policy.Paused,
	}
	for _, st := range States {
		s.Bytes += g[st].Bytes
	}
	if !oldest.IsZero() {
		s.OldestReadyAgeSec = max(0, now.Sub(oldest).Seconds())
	}
	k := &q.counters
	s.PublishedTotal, s.LeasedTotal, s.AckedTotal = k.published.Load(), k.leased.Load(), k.acked.Load()
	s.NackedTotal, s.ExpiredTotal, s.DeadLetteredTotal = k.nacked.Load(), k.expired.Load(), k.deadLettered.Load()
	s.RedrivenTotal, s.RejectedTotal, s.DeduplicatedTotal = k.redriven.Load(), k.rejected.Load(), k.deduplicated.Load()
	s.Rates.PublishedPerSec, s.Rates.LeasedPerSec, s.Rates.AckedPerSec = q.rates.perSec(now)
	s.RefusedTotal, s.LastRefusals = q.refused.total, q.refused.newestFirst()
	return s, nil
}

// DaemonStats returns the stats of every queue.
func (c *Core) DaemonStats(ctx context.Context) (DaemonStats, error) {
	d := DaemonStats{
		Version: c.opts.Version, Backend: c.opts.Backend, Store: c.opts.StorePath,
		UptimeSec: c.now().Sub(c.started).Seconds(), Pid: os.Getpid(), Duty: c.leaser.reportDuty(), Queues: []QueueStats{},
	}
	if c.space != nil {
		d.Disk = c.space.stats()
	}
	for _, name := range c.QueueNames() {
		s, err := c.Stats(ctx, name)
		if err != nil {
			continue // deleted meanwhile
		}
		s.LastRefusals = nil // see QueueStats
		d.Queues = append(d.Queues, s)
	}
	return d, nil
}

// pruneDedup forgets dedup keys older than the window once the map has
// grown; q.mu must be held.
func (q *queue) pruneDedup(now time.Time, window time.Duration) {
	if len(q.dedup) < 1024 || len(q.dedup)%256 != 0 {
		return
	}
	for k, at := range q.dedup {
		if now.Sub(at) >= window {
			delete(q.dedup, k)
		}
	}
}
