package fusefs

import (
	"fmt"
	"strconv"

	"yirangmq/queuecore"
)

// Metrics renders daemon stats in the Prometheus text exposition format
// (MOUNT/.metrics), for node_exporter's textfile collector or a scraper.
func Metrics(d queuecore.DaemonStats) []byte {
	var b []byte
	family := func(name, kind, help string, value func(s queuecore.QueueStats) float64) {
		b = fmt.Appendf(b, "# HELP yirangmq_%s %s\n# TYPE yirangmq_%s %s\n", name, help, name, kind)
		for _, s := range d.Queues {
			b = fmt.Appendf(b, "yirangmq_%s{queue=%s} %s\n", name, strconv.Quote(s.Queue), strconv.FormatFloat(value(s), 'g', -1, 64))
		}
	}
	b = fmt.Appendf(b, "# HELP yirangmq_uptime_seconds Seconds since the daemon started.\n# TYPE yirangmq_uptime_seconds gauge\nyirangmq_uptime_seconds %g\n", d.UptimeSec)
	gauge := func(name, help string, v func(s queuecore.QueueStats) int64) {
		family(name, "gauge", help, func(s queuecore.QueueStats) float64 { return float64(v(s)) })
	}
	counter := func(name, help string, v func(s queuecore.QueueStats) int64) {
		family(name, "counter", help, func(s queuecore.QueueStats) float64 { return float64(v(s)) })
	}
	gauge("ready_messages", "Messages in inbox/.", func(s queuecore.QueueStats) int64 { return s.Ready })
	gauge("inflight_messages", "Messages in processing/.", func(s queuecore.QueueStats) int64 { return s.Inflight })
	gauge("delayed_messages", "Messages in delayed/.", func(s queuecore.QueueStats) int64 { return s.Delayed })
	gauge("dlq_messages", "Messages in dlq/.", func(s queuecore.QueueStats) int64 { return s.DLQ })
	gauge("archived_messages", "Messages in archive/.", func(s queuecore.QueueStats) int64 { return s.Archived })
	gauge("bytes", "Bytes of message bodies in every state.", func(s queuecore.QueueStats) int64 { return s.Bytes })
	family("oldest_ready_age_seconds", "gauge", "Age of the oldest ready message.", func(s queuecore.QueueStats) float64 { return s.OldestReadyAgeSec })
	counter("published_total", "Messages published.", func(s queuecore.QueueStats) int64 { return s.PublishedTotal })
	counter("leased_total", "Leases taken.", func(s queuecore.QueueStats) int64 { return s.LeasedTotal })
	counter("acked_total", "Messages acknowledged.", func(s queuecore.QueueStats) int64 { return s.AckedTotal })
	counter("nacked_total", "Messages returned by consumers.", func(s queuecore.QueueStats) int64 { return s.NackedTotal })
	counter("expired_total", "Leases that ran out.", func(s queuecore.QueueStats) int64 { return s.ExpiredTotal })
	counter("dead_lettered_total", "Messages moved to dlq/.", func(s queuecore.QueueStats) int64 { return s.DeadLetteredTotal })
	counter("redriven_total", "Dead letters sent back to inbox/.", func(s queuecore.QueueStats) int64 { return s.RedrivenTotal })
	counter("rejected_total", "Messages that failed validation.", func(s queuecore.QueueStats) int64 { return s.RejectedTotal })
	counter("deduplicated_total", "Duplicates accepted and dropped.", func(s queuecore.QueueStats) int64 { return s.DeduplicatedTotal })
	gauge("paused", "1 when leasing is paused.", func(s queuecore.QueueStats) int64 {
		if s.Paused {
			return 1
		}
		return 0
	})
	if k := d.Disk; k != nil {
		one := func(name, kind, help string, v int64) {
			b = fmt.Appendf(b, "# HELP yirangmq_%s %s\n# TYPE yirangmq_%s %s\nyirangmq_%s %d\n", name, help, name, kind, name, v)
		}
		low := int64(0)
		if k.Low {
			low = 1
		}
		one("disk_free_bytes", "gauge", "Free bytes under the store, space the store reuses and its reserve included.", k.FreeBytes)
		one("disk_total_bytes", "gauge", "Size of the filesystem under the store.", k.TotalBytes)
		one("disk_min_free_bytes", "gauge", "Free-space floor: below it publishes are refused with ENOSPC.", k.MinFreeBytes)
		one("disk_reserve_bytes", "gauge", "Bytes held in the store's space.reserve file.", k.ReserveBytes)
		one("disk_low", "gauge", "1 while free space is below the floor.", low)
		one("disk_publishes_refused_total", "counter", "Publishes refused because free space was below the floor.", k.PublishesRefusedTotal)
		one("disk_archive_trimmed_total", "counter", "Archived messages dropped to free space (trimmed, or not archived at ack).", k.ArchiveTrimmedTotal)
		one("disk_low_events_total", "counter", "Times free space went below the floor.", k.LowEventsTotal)
	}
	return b
}
