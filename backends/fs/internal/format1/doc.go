// Package format1 reads fs stores of format 1, which builds before format 2
// wrote: message bodies in the tree, their metadata in a snapshot and a
// journal. It is kept so that such a store opens in a newer build with
// every message where it was, even one left by a crash: its Open recovers
// the store exactly as the last build that wrote format 1 did. Nothing
// else uses it; the fs store (package backends/fs) converts a format-1
// store with Export and never writes format 1 again.
//
// It is that build's code with three differences, none in what Open
// recovers:
//
//   - Export, the one way in.
//   - What no call from Export reaches is gone: Apply, PutQueue,
//     DeleteQueue, Lookup, Body, BodyFile, Due, Counts, Reclaim, the
//     journal's writer and the staging of big bodies (deadcode run on
//     cmd/yirangmq lists nothing left here). The description below still
//     tells what they did, since that is what made the stores it reads.
//   - What it had in common with the fs store, which was written from a
//     copy of it, now has one home that both use: the spare files made
//     ahead (package spare; Export asks for none, so Open only removes
//     what a crash left in DIR/spare, as before), and the in-memory index
//     (package memindex: the packed entry and its codec, a queue's trees,
//     the checks and the all-or-nothing apply of a batch, List). The
//     index is the same code moved, not new code: format 1's spill stays
//     here, in the queue's Ext and the entry's Slot, and the index calls
//     format 1's Add, Remove and ApplyOp, which spill as they did. One
//     thing reads differently: a message time of exactly the Unix epoch
//     now comes back from the index as the zero time, as every store
//     reads it (backends.Nanos); the fs store it is converted to reads
//     that time so anyway, so the converted store serves the same.
//
// Its long functions (decodeRecord, reconciler.resolve, readSnapshot,
// dirtySet.sync, Store.runFileOps) keep their shape: this is frozen code
// that only reads old stores, and every split is a chance to change what
// it recovers. (Two repeats inside it were merged: resolve moves a stray
// body with one closure, and the reconciler and the checkpoint read a
// directory in chunks with one helper, readChunks.) Format 1's own tests
// went with its writer; the upgrade tests (backends/fs/upgrade_test.go)
// open a clean and a crashed format-1 store (backends/fs/testdata) and
// compare everything the converted store serves, every field of every
// message, with what the build before these changes made of them.
//
// What follows is that build's description of format 1.
//
// # On-disk layout
//
//	DIR/LOCK                      advisory lock (backends.LockStore): pid and holder
//	DIR/queues/QUEUE/STATE/NAME   one plain file per message body; STATE is
//	                              inbox, processing, delayed, dlq or archive
//	                              (queuecore.State.Dir). Each body file carries
//	                              its message ID in the xattr user.yirangmq.id.
//	DIR/snapshot                  every queue and message's metadata as of the
//	                              last checkpoint (JSON lines, see below)
//	DIR/journal                   committed batches since that checkpoint
//	DIR/journal.old               the journal being checkpointed (only while a
//	                              checkpoint runs, or after a crash during one)
//	DIR/staged/ID                 a big body written and synced before the
//	                              record of its commit (in SyncFull and
//	                              SyncStrict, see Staged bodies below); a second
//	                              link to the body file until a snapshot holds
//	                              that record
//	DIR/spare/K/N                 empty files made ahead, which new body files
//	                              are written into and renamed from (package spare),
//	                              spread over 8 directories K, each named by a
//	                              random number when made (DIR/spare is marked
//	                              chattr +T where the file system knows it),
//	                              so a body file has the attributes a file
//	                              created in DIR/spare/K gets (default ACL,
//	                              group); what is left is removed at Open
//	                              and at Close
//	DIR/trash/                    queue directories being removed after a
//	                              DeleteQueue (emptied in the background and at Open)
//	DIR/lost+found/               files found at Open that no metadata
//	                              explains; kept for the operator, never read
//	DIR/spill/QUEUE.N             the metadata of a queue's newer ready
//	                              messages past the spill threshold (a cache:
//	                              emptied and rebuilt at Open, see Spill)
//
// Queue names are [A-Za-z0-9._-] and never start with '.'; message names
// never start with '.', hold no '/' or NUL and are at most 255 bytes. Live
// names are unique per queue and archived names among a queue's archived
// messages, so (queue, state directory, name) names one file. Files whose
// name starts with '.' are temporary and removed at Open.
//
// # Metadata: journal and snapshot
//
// The files hold bodies only. Metadata (queues with their policy and
// permissions, and every message's queuecore.Message) lives in memory, in
// an index of B-trees (except a backlog's spilled ready messages, below),
// and on disk in the snapshot plus the journal.
//
// The journal is an append-only log of committed batches. Each record is a
// frame: a 19-byte header "#LLLLLLLL CCCCCCCC\n" (payload length and
// CRC-32C, hex) and the payload, a JSON line followed by the raw bodies of
// the batch's inserts (each insert op says how many bytes its body has).
// Every record has a log sequence number (lsn). A record that is cut short
// or fails its CRC is a torn tail left by a crash: it and everything after
// it are ignored and cut off at Open. The file is extended with zeros ahead
// of its records, 1 MiB at a time, so that a commit's fdatasync overwrites
// allocated blocks instead of growing the file (measured about 1.5 times
// cheaper on the target machine); a header of zeros is the end.
//
// The snapshot is a JSON header line, one line per queue, one line per
// message and a trailer with a CRC-32C of everything before it. It is
// written with the durable-write helper (temp file, fsync, rename, fsync of
// the directory) and records the lsn it includes, so that journal records
// it already holds are skipped on replay.
//
// # Commits
//
// Apply validates a batch against the index, applies it there and appends
// its record to the journal with one write(2), all under one mutex; a
// failing batch changes nothing. Then, outside that mutex, in SyncFull it
// waits until an fdatasync covers the record: the first waiter syncs for
// everyone whose record was written before it started (group commit), so N
// concurrent commits share one fsync. SyncNormal and SyncOff do not sync: a
// write(2) survives a kill -9. Only once the record is durable are the file
// operations done (body written to a new file, a spare made ahead or a
// temp file, and renamed into place,
// renamed between state directories, unlinked), in journal order by
// whichever caller gets there first. A body file is therefore never removed
// or replaced before the record that says so is durable, and until the
// next checkpoint the journal holds every new body, so body files need no
// fsync of their own. Reads come from the index; Body reads the file, or
// the in-memory copy of a body whose file is not written yet (BodyFile,
// which hands the file to a reader, writes it first once the record is
// durable).
//
// A failed fsync or file operation puts the store in a failed state: every
// later change returns an error, and the next Open repairs from the journal.
// A lack of space (ENOSPC, EDQUOT) is not a failure: a commit whose record
// does not fit fails alone; file operations that do not fit wait in order,
// their bodies in the journal and in memory, and a checkpoint that cannot
// write its snapshot is held; both are retried by later commits and by
// Reclaim (space.go), so the store comes back without a restart.
//
// # Staged bodies
//
// In SyncFull and SyncStrict a body of Tuning.StageAt bytes or more
// (256 KiB by default) does not go through the journal: Apply writes it to
// DIR/staged/ID and fsyncs it before it takes the mutex, and every sync of
// a journal is preceded by one of DIR/staged, so no commit returns before
// its staged file's name is durable. The record holds the body's size and
// CRC-32C instead of its bytes; its file operation links the staged file
// where the message is. The staged name is kept as the journal keeps a
// small body: until a snapshot holds the record, so Open finds the body of
// every record it replays. A replayed record whose staged body is not
// there was made durable by a sync that had not synced its name: it and
// every record after it are a torn tail (no commit among them returned).
// A big body so reaches the disk once, in the commit that waits for it,
// instead of twice. See staged.go.
//
// # Checkpoints
//
// When the journal outgrows max(16 MiB, min(snapshot size, 32 MiB)), and
// at Close, a checkpoint rotates the journal (journal becomes journal.old, a fresh
// journal takes new commits), takes a copy-on-write clone of the index,
// finishes the file operations of the old journal, syncfs(2)s the store so
// every body file is durable, writes the snapshot and removes journal.old.
// Commits go on meanwhile: the rotation holds the store's mutex for the
// renames only, and leaves the sync of the old journal's tail and of the
// directory to the next sync of the journal (Store.syncRotationLocked),
// which runs before any later record counts as durable and before the
// checkpoint reads the old journal. The directories are synced the
// targets of moves first, and a body file whose move runs against that
// order (a cycle) is linked at its old path for the time of the sync, so
// that a power cut between the fsyncs of two directories cannot leave a
// body in neither (dirtySet). In
// SyncNormal, where file operations do not wait for a sync, the journals
// are synced before the directories (syncTree).
//
// # Spill
//
// A backlog must not grow the daemon's memory with it (about 180 bytes of
// heap a message in the index). Past the spill threshold (Tuning.SpillAt,
// --fs-spill-at, default 4096 ready messages in a queue), the queue's
// ready messages that sort after its last spilled one (its tail) move to
// the queue's spill file by batches of 64, all but the newest
// SpillAt/16 (at most 256), which absorb commits that arrive a little out
// of (Seq, ID) order: a record of its packed metadata, in List order. A
// record's ID must exceed the IDs two blocks before it, else the message
// stays in the index. In memory a spilled
// message costs about 12 bytes: a 32-bit hash of its name, its slot in an
// open-addressing table of record numbers by name hash, and per block of
// 64 records a file offset and a first ID. A name is found by probing the
// table and reading the record whose hash matches (a miss reads nothing);
// an ID by a binary search over the blocks and a read of one block. A
// message that leaves the ready state (lease, rename, delete) is marked
// gone in a bitmap and, if it stays live, enters the index like any
// message; the file is removed with its last live record. List of a
// queue's ready messages merges its tree with the spill file read a block
// at a time; a checkpoint writes both into the snapshot, from a copy of the
// bitmap. Below the threshold nothing changes: a small queue's messages
// are all in the index. A higher-priority message, or one that sorts
// before the spill's end, stays in the index, so a backlog of mixed
// priorities spills less. A queue whose backlog never drains below the
// threshold keeps its spill for good, so the spill is trimmed: once the
// records at its head that are gone number at least 65,536 and at least as
// many as the rest, after a commit that took records from it or a
// checkpoint, when no reader (a List, a checkpoint's image) holds the
// spill, the whole blocks of them are dropped from memory (the hashes,
// bitmap and block offsets are copied without them, the records numbered
// again from 0, the name table rebuilt) and punched out of the file
// (FALLOC_FL_PUNCH_HOLE; where the file system cannot, the rest of the
// file is copied to a new one if it is under 8 MiB; a file that cannot
// be trimmed keeps its bytes, said once in the log, and its memory is
// trimmed all the same). A spill then holds about twice its live records
// plus 65,536, in memory and on disk (more while readers keep putting
// trims off), however many messages passed through it in delivery
// order; a trim costs time in
// proportion to the records kept, which the records dropped pay for.
// Records that left from behind the head (a message leased or renamed by
// name while older ones wait) stay until the head passes them.
//
// The spill is a cache of the snapshot and the journal: Open removes
// DIR/spill and spills again while it loads, so recovery runs in the same
// bounded memory. The journal replayed at Open is at most about 32 MiB
// (the checkpoint cap above): the replay keeps per record the journal
// offset of a new body and a 64-bit hash of each path it touched. The repair reads state directories a chunk at a time and
// ticks spilled messages off in a bitmap. The set of body files to fsync at
// the next checkpoint holds at most 8192 paths; past it the checkpoint
// fsyncs every file of the directories noted (or relies on syncfs(2) when
// the store is not itself under FUSE).
//
// # Open and repair
//
// Open loads the snapshot, replays journal.old and journal, then reconciles
// the tree with the metadata: temp files are removed, a body found at the
// wrong path (a rename the crash cut off) is moved where its metadata says
// (the ID xattr tells whose a file is; without xattrs, the paths the
// journal gave its message), a body missing or damaged on disk is written
// from its journal record (a staged one linked from DIR/staged, checked
// by size and CRC; DIR/staged is emptied once the open's checkpoint has
// synced that), a file that holds a deleted message's body is
// removed, and files nothing explains go to lost+found. Only paths the
// replayed journal touched are checked closely: the others are as the last
// checkpoint synced them. A message whose
// body is nowhere is dropped with an error in the log (only a power cut in
// SyncNormal or SyncOff can cause that). Every repair is logged. If
// anything was replayed or repaired, Open ends with a checkpoint.
package format1
