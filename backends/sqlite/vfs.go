package sqlite

// #include <stdlib.h>
// #include "vfs.h"
import "C"

import (
	"fmt"
	"unsafe"
)

// The store opens its database through a VFS of its own, "yirangmq", a thin
// layer over SQLite's "unix" VFS (vfs.c), and holds an "anchor" beside its
// connections. Both exist for speed: on Linux, a commit in WAL mode is
// dominated by system calls, not by SQLite.
//
// They are infrastructure of the store's own, and stay because they move
// the goals table (docs/bench.md) by more than the 10% asked of such a
// part: the publish rows of the sqlite mount against the go-fuse
// loopback, measured by make bench against SQLite's own VFS (the build
// tag yirangmq_novfs builds the daemon and the in-process store without
// them, to measure again; vfs.c re-declares SQLite structs by hand, so a
// new SQLite release is a reason to).
//
//   - SQLite writes a WAL frame as two pwrite calls, header and page: a
//     commit of three pages is six calls. The VFS gathers the appends to
//     the WAL of a transaction in a buffer and writes them in one call
//     when the commit frame (the last of the transaction) is written, so
//     before the transaction is visible to readers (it becomes so through
//     the wal-index, which SQLite updates after writing the frames) and
//     before SQLite returns the commit or syncs the WAL. Every other file
//     operation on the WAL (read, sync, truncate, size, a write that is
//     not an append) writes the buffer out first. Measured on this
//     machine: 18 µs of pwrite calls per three-page commit, 4 µs gathered.
//   - Every transaction takes and drops a SHARED lock on the database file
//     (two fcntl calls). SQLite's unix VFS counts the locks of a process
//     and makes those calls only for the first and the last holder, so a
//     unix file that holds SHARED for the store's life, the anchor, makes
//     them free. In WAL mode SHARED keeps nothing from working: writers
//     and readers meet through the wal-index locks. It only keeps a
//     closing connection from taking EXCLUSIVE to checkpoint and delete
//     the WAL, which is what Close wants of every connection but the last
//     (the anchor is released before the writer closes), and what a
//     sqlite3 shell opened on a live store should not do either.
//   - A write transaction takes and drops the wal-index write lock (two
//     fcntl calls on the -shm file, of the six a commit makes). The
//     writer's connection (URI parameter writerParam) keeps it at the
//     system level between its transactions: SQLite's unlock is not
//     passed on, and its next lock finds it held. Readers, in this
//     process or another (a sqlite3 shell, its .backup), never need it:
//     only a writer, a RESTART or TRUNCATE checkpoint, or the recovery
//     of a torn wal-index header (which a reader retries) take it. So
//     another process can still read and back the store up while it is
//     open (TestOnlineBackup), but not write to it: "database is locked".
//     The lock goes when the connection unmaps the wal-index (Close), or
//     with the process.
//
// The durability of a commit is unchanged: the bytes reach the kernel (and,
// in SyncFull, the disk) before SQLite reports the commit, in the same
// order.
const vfsName = C.YIRANGMQ_VFS_NAME

// writerParam is the URI parameter that marks the writer's connection.
const writerParam = C.YIRANGMQ_WRITER_PARAM

// registerVFS registers the VFS with SQLite, once per process (SQLite's
// list of VFSes is process-wide).
func registerVFS() error {
	if rc := C.yirangmq_vfs_register(); rc != 0 {
		return fmt.Errorf("register SQLite VFS %s: error %d", vfsName, rc)
	}
	return nil
}

// anchor is a SHARED lock on the database file held through the unix VFS.
type anchor struct{ p *C.yirangmq_anchor }

func openAnchor(path string) (*anchor, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var p *C.yirangmq_anchor
	if rc := C.yirangmq_anchor_open(cpath, &p); rc != 0 {
		return nil, fmt.Errorf("hold shared lock on %s: error %d", path, rc)
	}
	return &anchor{p: p}, nil
}

func (a *anchor) close() error {
	if a == nil || a.p == nil {
		return nil
	}
	rc := C.yirangmq_anchor_close(a.p)
	a.p = nil
	if rc != 0 {
		return fmt.Errorf("release shared lock: error %d", rc)
	}
	return nil
}
