package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/mattn/go-sqlite3"

	"yirangmq/queuecore"
)

// A batch is one caller's unit of work for the writer: the ops of an Apply,
// or fn for PutQueue and DeleteQueue. The leader that commits it sets err,
// then done under Store.groupMu.
type batch struct {
	ops  []queuecore.Op
	fn   func(w *writer) error
	err  error
	done bool
	// inFile marks the inserts of ops whose body Apply wrote to its file
	// (files.go); nil when none. gone lists the body files that the
	// batch's deletes left unreferenced, to be removed once it committed.
	inFile []bool
	gone   []uint64
	// committed is set once the transaction holding the batch committed,
	// even if the sync after it failed (then err is set too): its body
	// files are named by a row that may be there, and must stay.
	committed bool
	// seq is set, in SyncFull, when the batch committed in a group that
	// returned before its sync: the lazy sync's count of that commit.
	// Its body files are removed once a sync covers it.
	seq uint64
	// wake is made when the caller has to wait (a commit is in flight);
	// it is signalled once, under groupMu: when the batch is done, or
	// when its caller is to lead the next commit.
	wake chan struct{}
}

// single reports whether the batch is one statement, which SQLite runs in
// a transaction of its own: no BEGIN, SAVEPOINT or COMMIT needed. (An
// insert with a large body is two: the row and the body.)
func (b *batch) single() bool {
	return b.fn != nil || len(b.ops) == 1 && b.inFile == nil && (b.ops[0].Kind != queuecore.OpInsert || len(b.ops[0].Body) <= inlineBody)
}

// write hands b to the group commit and returns its result.
//
// Group commit: a caller queues its batch and, if no commit is in flight,
// becomes the leader: it takes every queued batch, commits them in one
// transaction (one fsync in SyncFull), marks them done and wakes their
// callers, and only them. Then it hands the writer to the first batch
// queued meanwhile, whose caller leads the next commit with every batch
// queued by then; no other waiter wakes up for nothing. The uncontended
// case is one mutex taken twice and no goroutine switch.
func (s *Store) write(b *batch) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return errClosed
	}
	s.groupMu.Lock()
	s.pending = append(s.pending, b)
	if s.committing {
		b.wake = make(chan struct{}, 1)
		s.groupMu.Unlock()
		<-b.wake
		s.groupMu.Lock()
		if b.done {
			s.groupMu.Unlock()
			return withErrno(b.err)
		}
		// Handed the writer (committing stays set): lead the next commit.
	} else {
		s.committing = true
	}
	group := s.pending
	s.pending = s.spare[:0]
	s.groupMu.Unlock()

	s.w.commitGroup(group)
	if s.sync == queuecore.SyncFull {
		wait := groupWaits(s.sync, group)
		seq := s.lazy.committed(wait) // leases and acks alone need not wait (lazysync.go)
		if wait {
			return s.syncGroup(b, group, seq)
		}
		for _, g := range group {
			g.seq = seq
		}
	}

	s.groupMu.Lock()
	for _, g := range group {
		g.done = true
		if g != b {
			g.wake <- struct{}{} // every other batch of the group waits
		}
	}
	clear(group) // let the callers' ops go
	s.spare = group[:0]
	s.handOff()
	s.groupMu.Unlock()
	return withErrno(b.err)
}

// syncGroup finishes the commit of a group that must be durable in
// SyncFull: it hands the writer on first, so that the next group is
// written while this one's fdatasync of the WAL runs (which covers every
// frame written before it, and so the groups committed while it waited
// for an earlier sync to end), then wakes the group's callers.
func (s *Store) syncGroup(b *batch, group []*batch, seq uint64) error {
	s.groupMu.Lock()
	s.spare = nil // group stays ours until its callers are woken
	s.handOff()
	s.groupMu.Unlock()
	if err := s.lazy.sync(seq); err != nil {
		failAll(group, fmt.Errorf("sync WAL: %w", err))
	}
	s.groupMu.Lock()
	for _, g := range group {
		g.done = true
		if g != b {
			g.wake <- struct{}{}
		}
	}
	s.groupMu.Unlock()
	return withErrno(b.err)
}

// handOff gives up the writer: to the first batch queued, whose caller
// then leads the next commit, or to nobody. groupMu is held.
func (s *Store) handOff() {
	if len(s.pending) > 0 {
		s.pending[0].wake <- struct{}{} // queued while committing: it waits
		return
	}
	s.committing = false
	if s.writerWaiters > 0 {
		s.writerFree.Broadcast()
	}
}

// takeWriter waits until no commit is in flight and keeps the writer for
// the caller (Close, tests) until giveWriter.
func (s *Store) takeWriter() *writer {
	s.groupMu.Lock()
	defer s.groupMu.Unlock()
	for s.committing {
		s.writerWaiters++
		s.writerFree.Wait()
		s.writerWaiters--
	}
	s.committing = true
	return s.w
}

// tryTakeWriter keeps the writer for the caller, as takeWriter, if no
// commit is in flight or queued; else it returns nil at once. Under a
// steady load the writer passes from group to group without being free
// (handOff), so takeWriter could wait as long as the load lasts.
func (s *Store) tryTakeWriter() *writer {
	s.groupMu.Lock()
	defer s.groupMu.Unlock()
	if s.committing || len(s.pending) > 0 {
		return nil
	}
	s.committing = true
	return s.w
}

func (s *Store) giveWriter() {
	s.groupMu.Lock()
	defer s.groupMu.Unlock()
	s.handOff()
}

// writer is the one connection that writes, used only by the leader of a
// group commit (while Store.committing is set). Its statements are
// prepared once and its argument slice is reused, so a commit allocates
// little.
type writer struct {
	conn *sqlite3.SQLiteConn

	insert, insertBody          *sqlite3.SQLiteStmt
	insertFile, fileOfStmt      *sqlite3.SQLiteStmt
	queueFilesStmt              *sqlite3.SQLiteStmt
	update, delete              *sqlite3.SQLiteStmt
	putQueue, deleteQueue       *sqlite3.SQLiteStmt
	begin, commit, rollback     *sqlite3.SQLiteStmt
	savepoint, release, restore *sqlite3.SQLiteStmt

	args []driver.NamedValue

	// gone collects, for the batch being run, the IDs whose body files
	// its deletes made unreferenced (files.go); fileFloor is the store's.
	gone      []uint64
	fileFloor *fileFloor
	lookups   int // fileOf's look-ups in the database, for tests

	// reads holds the argument and destination slices of the writer's
	// own queries (fileOf, queueFiles).
	reads *reader
}

// openWriter opens the writer connection on a store file whose schema is
// in place, and prepares its statements.
func openWriter(c *sqlite3.SQLiteConn) (*writer, error) {
	w := &writer{conn: c, args: newArgs(nMsgCols + 1)}
	stmts := []struct {
		p   **sqlite3.SQLiteStmt
		sql string
	}{
		{&w.insert, sqlInsert},
		{&w.insertBody, sqlInsertBody},
		{&w.insertFile, sqlInsertFile},
		{&w.fileOfStmt, sqlFileOf},
		{&w.queueFilesStmt, sqlQueueFiles},
		{&w.update, sqlUpdate},
		{&w.delete, sqlDelete},
		{&w.putQueue, sqlPutQueue},
		{&w.deleteQueue, sqlDeleteQueue},
		// IMMEDIATE takes the write lock at BEGIN, where busy_timeout
		// applies. A deferred transaction takes it at its first write and
		// fails there with SQLITE_BUSY_SNAPSHOT, without waiting, if
		// another connection wrote meanwhile (only a sqlite3 shell on a
		// live store could).
		{&w.begin, "BEGIN IMMEDIATE"},
		{&w.commit, "COMMIT"},
		{&w.rollback, "ROLLBACK"},
		{&w.savepoint, "SAVEPOINT batch"},
		{&w.release, "RELEASE batch"},
		{&w.restore, "ROLLBACK TO batch"},
	}
	for _, st := range stmts {
		ds, err := c.Prepare(st.sql)
		if err != nil {
			w.close()
			return nil, fmt.Errorf("prepare %q: %w", st.sql, err)
		}
		*st.p = ds.(*sqlite3.SQLiteStmt)
	}
	w.reads = newScratch(nil)
	return w, nil
}

// close finalizes the statements and closes the connection.
func (w *writer) close() error {
	for _, st := range []*sqlite3.SQLiteStmt{
		w.insert, w.insertBody, w.insertFile, w.fileOfStmt, w.queueFilesStmt, w.update, w.delete, w.putQueue, w.deleteQueue,
		w.begin, w.commit, w.rollback, w.savepoint, w.release, w.restore,
	} {
		if st != nil {
			st.Close()
		}
	}
	return w.conn.Close()
}

// exec runs a prepared statement. The context is always Background: a
// write is short, and a caller's cancellation must not abort a commit (a
// signal to a FUSE client cancels its request).
func (w *writer) exec(st *sqlite3.SQLiteStmt, args []driver.NamedValue) (int64, error) {
	res, err := st.ExecContext(context.Background(), args)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// commitGroup runs the batches in one transaction with a savepoint each,
// so that a failing batch rolls back alone, and sets every batch's err.
func (w *writer) commitGroup(group []*batch) {
	if len(group) == 1 && group[0].single() {
		group[0].err = w.run(group[0])
		group[0].committed = group[0].err == nil
		return
	}
	for len(group) > 0 {
		group = w.tryGroup(group)
	}
}

// tryGroup runs group in one transaction. If a batch's error made SQLite
// roll back the whole transaction (an I/O error or a full disk, never a
// constraint), that batch has failed and tryGroup returns the others to be
// run again in a new transaction.
//
// A batch of one statement needs no savepoint of its own: SQLite undoes a
// failing statement, and only it, when the transaction survives (a
// constraint, or an update or delete that finds no row). Only batches of
// several statements get one, and the savepoints (two statements each)
// are spared in the common group of single leases, acks and publishes.
func (w *writer) tryGroup(group []*batch) (again []*batch) {
	if _, err := w.exec(w.begin, nil); err != nil {
		failAll(group, fmt.Errorf("begin transaction: %w", err))
		return nil
	}
	many := len(group) > 1
	ok := 0
	for i, b := range group {
		sp := many && !b.single()
		if sp {
			if _, err := w.exec(w.savepoint, nil); err != nil {
				w.abort(group, fmt.Errorf("savepoint: %w", err))
				return nil
			}
		}
		b.err = w.run(b)
		if b.err == nil {
			ok++
			if sp {
				if _, err := w.exec(w.release, nil); err != nil {
					w.abort(group, fmt.Errorf("release savepoint: %w", err))
					return nil
				}
			}
			continue
		}
		if w.conn.AutoCommit() {
			// The transaction is gone, and with it the batches before b.
			return append(group[:i:i], group[i+1:]...)
		}
		if !many {
			_, _ = w.exec(w.rollback, nil)
			return nil
		}
		if !sp {
			continue // SQLite undid the statement
		}
		if _, err := w.exec(w.restore, nil); err != nil {
			w.abort(group, fmt.Errorf("roll back to savepoint: %w", err))
			return nil
		}
		if _, err := w.exec(w.release, nil); err != nil {
			w.abort(group, fmt.Errorf("release savepoint: %w", err))
			return nil
		}
	}
	if ok == 0 {
		_, _ = w.exec(w.rollback, nil)
		return nil
	}
	if _, err := w.exec(w.commit, nil); err != nil {
		w.abort(group, fmt.Errorf("commit: %w", err))
		return nil
	}
	for _, b := range group {
		b.committed = b.err == nil
	}
	return nil
}

// abort rolls the open transaction back and fails every batch of group
// that had not failed yet with err.
func (w *writer) abort(group []*batch, err error) {
	if !w.conn.AutoCommit() {
		_, _ = w.exec(w.rollback, nil)
	}
	failAll(group, err)
}

func failAll(group []*batch, err error) {
	for _, b := range group {
		if b.err == nil {
			b.err = err
		}
	}
}

// run executes one batch's statements inside the current transaction (or
// as its own, when it is a single statement).
func (w *writer) run(b *batch) error {
	w.gone = w.gone[:0]
	b.gone = nil
	err := w.runOps(b)
	if err == nil && len(w.gone) > 0 {
		b.gone = append([]uint64(nil), w.gone...)
	}
	return err
}

func (w *writer) runOps(b *batch) error {
	if b.fn != nil {
		return b.fn(w)
	}
	for i := range b.ops {
		if err := w.apply(&b.ops[i], b.inFile != nil && b.inFile[i]); err != nil {
			if len(b.ops) > 1 {
				return fmt.Errorf("op %d of %d: %w", i+1, len(b.ops), err)
			}
			return err
		}
	}
	return nil
}

// apply executes one op. inFile: the op is an insert whose body is in its
// file already.
func (w *writer) apply(op *queuecore.Op, inFile bool) error {
	m := &op.Msg
	switch op.Kind {
	case queuecore.OpInsert, queuecore.OpUpdate:
		if !m.State.Valid() {
			return fmt.Errorf("message %d: invalid state %d", m.ID, m.State)
		}
	case queuecore.OpDelete:
	default:
		return fmt.Errorf("message %d: invalid op kind %d", m.ID, op.Kind)
	}

	switch op.Kind {
	case queuecore.OpInsert:
		bindMessage(w.args, m)
		apart := len(op.Body) > inlineBody && !inFile
		switch {
		case apart, inFile:
			w.args[nMsgCols].Value = nil // NULL: in bodies
		case op.Body == nil:
			w.args[nMsgCols].Value = []byte{} // nil would bind NULL
		default:
			w.args[nMsgCols].Value = op.Body
		}
		_, err := w.exec(w.insert, w.args[:nMsgCols+1])
		w.args[nMsgCols].Value = nil // do not keep the caller's body
		if err != nil {
			return opErr("insert", m, err)
		}
		if apart {
			w.args[0].Value = int64(m.ID)
			w.args[1].Value = op.Body
			_, err := w.exec(w.insertBody, w.args[:2])
			w.args[1].Value = nil
			if err != nil {
				return opErr("insert body of", m, err)
			}
		}
		if inFile {
			w.args[0].Value = int64(m.ID)
			w.args[1].Value = int64(len(op.Body))
			if _, err := w.exec(w.insertFile, w.args[:2]); err != nil {
				return opErr("record the body file of", m, err)
			}
		}
	case queuecore.OpUpdate:
		bindMessage(w.args, m)
		n, err := w.exec(w.update, w.args[:nMsgCols])
		if err != nil {
			return opErr("update", m, err)
		}
		if n == 0 {
			return fmt.Errorf("update message %d: %w", m.ID, queuecore.ErrNotFound)
		}
	case queuecore.OpDelete:
		file, err := w.fileOf(m.ID, m.Size)
		if err != nil {
			return fmt.Errorf("delete message %d: %w", m.ID, err)
		}
		w.args[0].Value = int64(m.ID)
		n, err := w.exec(w.delete, w.args[:1])
		if err != nil {
			return fmt.Errorf("delete message %d: %w", m.ID, err)
		}
		if n == 0 {
			return fmt.Errorf("delete message %d: %w", m.ID, queuecore.ErrNotFound)
		}
		if file {
			w.gone = append(w.gone, m.ID)
		}
	}
	return nil
}

// fileOf reports whether message id, whose body is size bytes (0 if not
// known), has its body in a file. It asks the database only when the
// store has held a body file of size bytes or fewer since it opened: an
// ack of a small message in a store that also carries big ones costs no
// look-up.
func (w *writer) fileOf(id uint64, size int64) (bool, error) {
	if !w.fileFloor.mayHold(size) {
		return false, nil
	}
	w.lookups++
	r := w.reads
	r.args[0].Value = int64(id)
	found, err := r.one(connStmt{w.fileOfStmt}, 1, r.dest[:1])
	if err != nil {
		return false, fmt.Errorf("look up its body file: %w", err)
	}
	return found, nil
}

// queueFiles adds the body files of queue's messages to w.gone.
func (w *writer) queueFiles(queue string) error {
	if !w.fileFloor.any() {
		return nil
	}
	r := w.reads
	r.args[0].Value = queue
	rows, err := r.rows(connStmt{w.queueFilesStmt}, 1)
	if err != nil {
		return fmt.Errorf("list its body files: %w", err)
	}
	defer rows.Close()
	dest := r.dest[:1]
	err = eachRow(rows, dest, func() (bool, error) {
		var c scanner
		id := c.int(dest[0])
		w.gone = append(w.gone, uint64(id))
		return true, c.err
	})
	if err != nil {
		return fmt.Errorf("list its body files: %w", err)
	}
	return nil
}

// opErr describes a failed insert or update, with the sentinel of a
// constraint violation.
func opErr(verb string, m *queuecore.Message, err error) error {
	if sentinel := constraintErr(err); sentinel != nil {
		what := "message id or name is taken"
		if errors.Is(sentinel, queuecore.ErrNotFound) {
			what = "no such queue"
		}
		return fmt.Errorf("%s message %d (%s/%s/%q): %s: %w", verb, m.ID, m.Queue, m.State, m.Name, what, sentinel)
	}
	return fmt.Errorf("%s message %d (%s/%s/%q): %w", verb, m.ID, m.Queue, m.State, m.Name, err)
}

// putQueueFn creates or replaces a queue.
func putQueueFn(q queuecore.QueueInfo) func(*writer) error {
	return func(w *writer) error {
		policy := q.Policy
		if policy == nil {
			policy = []byte{}
		}
		args := w.args[:6]
		args[0].Value = q.Name
		args[1].Value = policy
		args[2].Value = int64(q.UID)
		args[3].Value = int64(q.GID)
		args[4].Value = int64(q.Mode)
		args[5].Value = nanos(q.CreatedAt)
		_, err := w.exec(w.putQueue, args)
		args[1].Value = nil
		if err != nil {
			return fmt.Errorf("put queue %q: %w", q.Name, err)
		}
		return nil
	}
}

// deleteQueueFn deletes a queue; the foreign key's ON DELETE CASCADE takes
// its messages in the same statement.
func deleteQueueFn(name string) func(*writer) error {
	return func(w *writer) error {
		if err := w.queueFiles(name); err != nil {
			return fmt.Errorf("delete queue %q: %w", name, err)
		}
		w.args[0].Value = name
		n, err := w.exec(w.deleteQueue, w.args[:1])
		if err != nil {
			return fmt.Errorf("delete queue %q: %w", name, err)
		}
		if n == 0 {
			return fmt.Errorf("delete queue %q: %w", name, queuecore.ErrNotFound)
		}
		return nil
	}
}
