// Package fusefs serves a queuecore.Core as a FUSE filesystem: every queue
// is a directory, plain file operations are the API (docs/contract.md §1–§6, §8).
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
//   - The daemon never sends an entry invalidation and never calls into its
//     own mount (mount.go): either can keep a killed daemon from exiting and
//     wedge the mount. Missing names are not cached, created names are not
//     cached, other names briefly; every operation is checked again by the
//     daemon (placements.go). See docs/fusefs.md.
//   - A blocked .next read returns EINTR when the reader gets a signal, and
//     takes no lease.
package fusefs
