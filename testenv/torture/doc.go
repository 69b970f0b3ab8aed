// Package torture is the kill -9 torture of a real mount (issue 4):
// producers and consumers use a queue through plain system calls while
// the daemon is killed with SIGKILL and restarted at random moments; every
// client call is recorded in a History, and Check then holds that history
// against the queue as it stands after the last restart.
//
// The rule that keeps the check exact: a call counts as done only when it
// returned 0 (close(2) for a publish, rename(2) for a lease or a nack,
// unlink(2) for an ack). A call that failed while the mount was dying or
// being restarted has an unknown outcome: it may or may not have taken
// effect, and the checker never counts it as committed, nor blames the
// queue for doing it. Which failures are refusals by a live daemon is
// told by an epoch that the runner bumps around every kill and restart.
//
// Three things the torture found on the kernel side of the mount:
//
//   - rename(2) between two names of one inode returns 0 without reaching
//     the filesystem (vfs_rename: source == target). When a message was
//     one kernel inode in every state, a kernel still caching inbox/NAME
//     after the daemon leased the message through .next, and looking up
//     processing/NAME (the same inode) as the rename's target, made
//     `mv inbox/NAME processing/` return 0 for a message another consumer
//     held. fusefs now gives each placement of a message its own kernel
//     inode (same st_ino, new generation); the checker still reports such
//     leases apart, as rename anomalies, should it come back.
//   - A .next lease is a move the kernel does not see: with negative
//     entries cached, a "processing/NAME is absent" left by a stat or by
//     a rename that lost the race made the consumer's cat and rm of the
//     name .next had just returned fail with ENOENT, and the lease run
//     out (duplicates with no kill, nack or abandon behind them). fusefs
//     now lets the kernel cache no missing names (TestNextThenReadAndAck).
//   - SIGKILL did not always end the daemon: a thread sending an entry
//     invalidation sleeps uninterruptibly in fuse_reverse_inval_entry for
//     the lock of a directory that a client holds while it waits for the
//     daemon's answer, so the daemon never finished dying and the mount
//     stayed wedged until someone aborted its FUSE connection. An earlier
//     version of this harness did that itself, and so hid the hang from
//     its verdict. fusefs now sends no entry invalidations, and the
//     harness kills like a supervisor: SIGKILL, wait for the exit, start
//     again, with no abort and no unmount in between; a daemon still there
//     or a client call still blocked 10 s later fails the run (kill.go).
package torture
