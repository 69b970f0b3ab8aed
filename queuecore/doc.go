// Package queuecore holds every rule of a yirangmq queue: names, policies,
// the states a message goes through and the transitions between them,
// leases, retries with backoff, dead letters, archive and retention,
// validation, deduplication, backpressure and stats. It knows nothing of
// FUSE or SQL: it keeps messages in a Store (implemented in backends/),
// takes time from a Clock, and tells a Notifier when a message moved.
//
// Concurrency: each queue has a mutex that is only held for in-memory work
// and short store reads, never across a commit. An operation reserves the
// names it touches (a "claim"), commits through Store.Apply with no lock
// held, so concurrent commits in one queue or many share a group commit,
// then releases its claims. Another operation on a claimed name waits for
// it; so of N racing leases exactly one wins and the others find the
// message gone.
package queuecore
