// Package fusefs serves a queuecore.Core as a FUSE filesystem: every queue
// is a directory, plain file operations are the API (SPEC.md §1–§6, §8).
// Nodes are thin: they translate syscalls into core calls and the core's
// errors into errnos (errno.go is the only place that does that).
//
// The traps it avoids, in short:
//   - A message is committed at the FLUSH that comes from the process that
//     created the file, once it has written something, so close(2) returns
//     the commit's result; else at RELEASE (empty files, descriptors handed
//     to another process). See pending.go.
//   - Pseudo-files (.stats, .policy, .next, .metrics) use direct I/O so
//     every read reaches the daemon.
//   - When the daemon moves a message by itself (expiry, backoff, retention,
//     fanout) the kernel is told with entry invalidations, sent from one
//     goroutine outside every request handler and lock.
//   - A blocked .next read returns EINTR when the reader gets a signal, and
//     takes no lease.
package fusefs
