// Package fs is the plain-directory store of yirangmq: a queuecore.Store
// whose tree is the truth. Every message is one file holding its exact
// body, in the directory of its queue and state, with its metadata in
// extended attributes beside the bytes. A person can read the store with
// ls, cat and getfattr, back it up with cp -a, and change it with mv, cp,
// rm and an editor while the daemon is stopped: the next start takes each
// change as the transition it means (queuecore.HandEdited).
//
// # On-disk layout (format 2)
//
//	DIR/LOCK                      advisory lock (backends.LockStore): pid and holder
//	DIR/format                    "yirangmq fs store, format 2"; a later format is refused
//	DIR/snapshot                  a header that builds of format 1 refuse (they read it first)
//	DIR/ids                       the IDs and sequence numbers handed out so far, rounded up
//	DIR/manifest                  every message's ID and place at the last clean stop (a hint)
//	DIR/queues/QUEUE/policy.json  the queue's policy; its attributes: uid, gid, mode, created_at
//	DIR/queues/QUEUE/STATE/NAME   one file per message; STATE is inbox, processing,
//	                              delayed, dlq or archive (queuecore.State.Dir)
//	DIR/intents/N/                a batch of several messages under way: its intent and
//	                              the bodies of its new messages
//	DIR/spare/K/N                 empty files made ahead, which new bodies are written into
//	                              (package spare); what is left there is removed at Open
//	DIR/trash/                    deleted queues' directories, emptied in the background
//	DIR/lost+found/               what Open found that cannot be a message, with the reason
//	                              in the log
//
// Names starting with ".yirangmq.tmp." are the store's temp files and
// directories, written whole and renamed into place; Open removes what a
// crash left of them. Any other name starting with '.' is not a message
// (the mount keeps such names for drafts): Open moves it to lost+found.
//
// # Metadata
//
// A message's fields are attributes user.yirangmq.KEY of its file (meta.go):
// id, state and queue (where the daemon last put it), seq, priority,
// message_id, published_at, first_at, state_at, deadline, attempts,
// redrives, reason, reason_message, failed_at, consumer, dedup_key, uid,
// gid; as text, times in RFC 3339 (UTC), fields at their default left out.
// The file's size is the body's. rename(2) and link(2) carry them along.
//
// One attribute changes with one setxattr(2), atomically. A change of
// more (a lease: its state, deadline and consumer; a move to another
// directory) first writes the attribute txn: the whole new metadata and
// the paths the file goes from and to. Then the file moves and its fields
// are written; the txn is removed once all that is durable. While it is
// there it is the truth about the file, whatever the fields say: a start
// that finds it finishes the change.
//
// A batch of several messages (a publish with fanout, a forward, several
// moves) cannot be one syscall: its intent, with the bodies of its new
// messages, is written to DIR/intents/N and made durable before the batch
// touches the tree, and removed once all of the batch is durable. A start
// that finds an intent finishes its batch (intent ops whose message has
// moved or gone since, by a person's hand, are skipped). A batch whose
// only two ops are the delete of an archived message and the ack that
// takes its name (the archive keeps the latest) is one rename(2) and
// needs no intent.
//
// # Commits and durability
//
// Apply writes the bodies of new messages to temp files (a spare file
// made ahead, or one of its own) with their attributes (synced in SyncFull
// and SyncStrict), then, under the store's
// mutex, checks the batch against the in-memory index (built at Open) and
// changes the tree: renames of new bodies into place, moves and attribute
// writes, unlinks. Nothing is synced under the mutex. The syncs that make
// a commit durable are a flush's (flush.go): the group commit of every
// change since the last one, so that a commit that returns durable takes
// every commit before it along. (A flush's syncs may also catch changes
// committed while they run; nothing orders those at a power cut, which
// is why a lease or an ack that returned before its flush may be undone
// by one while a later batch is not: the contract allows it, a message
// delivered again.) A move
// to another directory links the new name and removes the old one only
// once a flush has made the new name durable: a rename(2) made durable in
// its source directory first would leave the file under no name at a
// power cut. In SyncFull a lease or an ack (queuecore.Op.NoSync) returns
// before its flush, which comes within queuecore.SyncDelay; every other
// commit waits for it. SyncNormal and SyncOff sync nothing: a change
// survives the daemon's crash (the kernel has it), not a power cut.
//
// # Open: the tree is the truth
//
// Open reads every queue directory and every file with its attributes,
// finishes what a crash cut short (txn attributes, then intents), and
// builds the index. Whatever else it finds is a person's doing, and is
// honoured:
//   - a file where its attributes say it is: the message, unchanged
//     (its body, its priority and the other fields as the file has them now);
//   - a file in another state or queue than its attributes say: a move
//     by hand (queuecore.HandMoved);
//   - a file without attributes: a new message (queuecore.HandNew), its
//     times the file's mtime and its owner the file's;
//   - a second file with an ID another holds (cp -a): a copy, which gets
//     a new ID (queuecore.HandCopied);
//   - a message of the manifest of the last clean stop whose file is gone:
//     a delete by hand (queuecore.HandGone); after a crash there is no
//     manifest, and such a delete is not told from a message never there;
//   - a directory without policy.json under queues/: a queue made by hand,
//     with the default policy and the directory's owner and mode.
//
// The store keeps such messages where they were found, with the
// attributes they had, and reports them (HandChanges); the queue core
// applies each as the transition it means and only then are the
// attributes rewritten, so a crash before that finds the same changes
// again. What cannot be a message goes to lost+found, each with a log
// line: a directory or a non-regular file in a state directory, a name
// the mount refuses, a file beside the state directories, a file or a
// directory under queues/ that cannot be a queue, a second live message
// of one name.
//
// The index keeps an entry in memory per message (its size:
// BenchmarkMessageMemory, docs/performance.md), so the store holds at most
// Tuning.MaxMessages (100,000 by default): past it an insert fails with
// queuecore.ErrStoreFull (EDQUOT through the mount).
//
// # Format 1
//
// Builds before format 2 kept the metadata in a snapshot and a journal.
// Open converts such a store (upgrade.go), reading it with the code of the
// last build that wrote it (internal/format1), which recovers it after a
// crash as that build did.
package fs
