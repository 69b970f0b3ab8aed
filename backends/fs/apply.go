package fs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// maxRetries bounds how often Apply starts over: because an old name of
// a moved message holds a name it needs (it flushes first), or because
// the tree changed between its plan and its commit.
const maxRetries = 8

// errReplan: the batch would now do something else than its intent says
// (another commit changed one of its messages meanwhile): start over.
var errReplan = errors.New("the batch changed since its intent was written")

// Apply commits a batch: see "Commits" in the package comment. Once it
// has changed the tree, Apply does not look at ctx again: a commit is
// never reported as failed because its caller went away.
func (s *Store) Apply(ctx context.Context, ops []queuecore.Op) error {
	if len(ops) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.RLock()
	err := s.writableLocked()
	if err == nil {
		s.inflight.Add(1) // Close waits for this commit
	}
	s.mu.RUnlock()
	if err != nil {
		return err
	}
	defer s.inflight.Done()
	for try := 0; ; try++ {
		gen, again, err := s.apply(ops)
		if again > 0 && try < maxRetries {
			if err := s.flushUntil(again); err != nil {
				return err
			}
			continue
		}
		if errors.Is(err, errReplan) && try < maxRetries {
			continue
		}
		if err != nil {
			return err
		}
		switch {
		case gen == 0:
			return nil
		case s.durable && queuecore.WaitsFor(s.opts.Sync, ops):
			return s.flushUntil(gen)
		default:
			s.flushSoon()
			return nil
		}
	}
}

// apply is one attempt of Apply: the plan of a batch of several messages
// (does it need an intent?), the new bodies, the intent, the commit.
func (s *Store) apply(ops []queuecore.Op) (gen, again uint64, err error) {
	var plan []intentOp
	if len(ops) > 1 {
		if plan, err = s.plan(ops); err != nil {
			return 0, 0, err
		}
	}
	var b *batchDir
	if plan != nil {
		if b, err = s.newBatchDir(); err != nil {
			return 0, 0, err
		}
		defer b.remove() // a no-op once the commit took it over
	}
	temps, err := s.prepare(ops, b)
	if err != nil {
		return 0, 0, err
	}
	defer removeTemps(temps)
	if b != nil {
		if err := s.writeIntent(b, plan); err != nil {
			return 0, 0, err
		}
		for i, p := range temps {
			if p != "" {
				temps[i] = filepath.Join(b.final, filepath.Base(p))
			}
		}
	}
	return s.commit(ops, temps, b, plan)
}

// plan works out, under the lock and without doing it, what a batch of
// several ops will do: the ops of its intent, or nil when it is one
// change of the tree (a delete whose file the next op replaces is part of
// that op's rename), which needs none.
func (s *Store) plan(ops []queuecore.Op) ([]intentOp, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writableLocked(); err != nil {
		return nil, err
	}
	changes, err := s.ix.applyOps(ops)
	if err != nil {
		return nil, err
	}
	defer s.ix.undo(changes)
	if steps(changes, s.replacedLocked(changes)) <= 1 {
		return nil, nil
	}
	return s.intentOpsLocked(changes), nil
}

// prepare writes the body of every insert to a temp file, with its
// attributes, synced in SyncFull and SyncStrict: a new body is durable
// before its commit, outside the lock, so that commits of other messages
// do not wait for it. The temp file is in the state directory the body
// goes to, or in the batch's directory b when the batch has an intent. An
// insert whose place is not valid gets no temp file: commit refuses it.
// temps[i] is op i's temp file ("" for other ops); the caller removes
// what commit did not rename.
func (s *Store) prepare(ops []queuecore.Op, b *batchDir) ([]string, error) {
	temps := make([]string, len(ops))
	for i := range ops {
		op := &ops[i]
		if op.Kind != queuecore.OpInsert {
			continue
		}
		s.mu.RLock()
		_, err := s.ix.checkPlace(&op.Msg)
		s.mu.RUnlock()
		if err != nil {
			continue
		}
		m := op.Msg
		if b == nil {
			if p, ok := s.writeSpare(op.Body, fields(&m)); ok {
				temps[i] = p
				continue
			}
		}
		var p string
		if b != nil {
			p = filepath.Join(b.tmp, strconv.FormatUint(op.Msg.ID, 10))
		} else {
			p = s.bodyPath(op.Msg.Queue, op.Msg.State, tempPrefix+strconv.FormatUint(op.Msg.ID, 10)+"."+strconv.FormatUint(s.tempGen.Add(1), 10))
		}
		if err := s.writeBody(p, op.Body, fields(&m)); err != nil {
			removeTemps(temps)
			return nil, fmt.Errorf("insert message %d: %w", op.Msg.ID, err)
		}
		temps[i] = p
	}
	return temps, nil
}

// writeBody creates the file p (which must not exist) with body and the
// attributes fs, synced when the store is durable.
func (s *Store) writeBody(p string, body []byte, fs []field) (err error) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(p)
		}
	}()
	if _, err := f.Write(body); err != nil {
		return err
	}
	fd := int(f.Fd())
	for _, fl := range fs {
		if err := unix.Fsetxattr(fd, xattrPrefix+fl.key, []byte(fl.val), 0); err != nil {
			return fmt.Errorf("set %s%s on %s: %w", xattrPrefix, fl.key, p, err)
		}
	}
	if s.durable {
		return s.fsync(f)
	}
	return nil
}

// writeSpare writes body and its attributes into a spare file, if one is
// ready, and returns its path. A spare that fails for lack of space is
// dropped (the caller's own file will fail the same way); for another
// reason it also turns the pool off.
func (s *Store) writeSpare(body []byte, fs []field) (string, bool) {
	f, ok := s.spares.take()
	if !ok {
		return "", false
	}
	err := writeAll(f.fd, body)
	for _, fl := range fs {
		if err != nil {
			break
		}
		err = unix.Fsetxattr(f.fd, xattrPrefix+fl.key, []byte(fl.val), 0)
	}
	if err == nil && s.durable {
		if s.cfg.fsync != nil {
			err = s.cfg.fsync(os.NewFile(uintptr(f.fd), f.path))
		} else {
			err = unix.Fsync(f.fd)
		}
	}
	if err != nil {
		s.spares.discard(f)
		if !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EDQUOT) {
			s.spares.failed(err)
		}
		return "", false
	}
	unix.Close(f.fd)
	return f.path, true
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func removeTemps(temps []string) {
	for _, p := range temps {
		if p != "" {
			os.Remove(p)
		}
	}
}

// opDirt is what one commit changed, for the flusher.
type opDirt struct {
	files map[uint64]struct{}
	dirs  map[string]struct{}
	stale map[string]uint64
	txns  map[uint64]uint64
	// intent is the batch's intent file, "" for a batch of one message.
	intent string
}

func (d *opDirt) dir(p string) {
	if d.dirs == nil {
		d.dirs = map[string]struct{}{}
	}
	d.dirs[filepath.Dir(p)] = struct{}{}
}

// commit validates the batch, applies it to the index and changes the
// tree, all under the store's mutex. It returns the flusher's gen that
// makes it durable (0 when nothing is to sync), or, when an old name of a
// moved message holds a name the batch needs, again: the gen to flush up
// to before trying again. With an intent (b, plan), it first checks that
// the batch still does what the intent says (errReplan otherwise).
func (s *Store) commit(ops []queuecore.Op, temps []string, b *batchDir, plan []intentOp) (gen, again uint64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writableLocked(); err != nil {
		return 0, 0, err
	}
	changes, err := s.ix.applyOps(ops)
	if err != nil {
		return 0, 0, err
	}
	for i, c := range changes {
		if c.old == nil && temps[i] == "" {
			s.ix.undo(changes) // cannot happen: prepare checked the place
			return 0, 0, fmt.Errorf("insert message %d: no body file written: %w", c.new.id, errBadOp)
		}
	}
	if err := s.checkLimitLocked(changes); err != nil {
		s.ix.undo(changes)
		return 0, 0, err
	}
	replaced := s.replacedLocked(changes)
	if g := s.staleConflictLocked(changes); g > 0 {
		s.ix.undo(changes)
		return 0, g, nil
	}
	if (b != nil) != (steps(changes, replaced) > 1) || b != nil && !sameOps(plan, s.intentOpsLocked(changes)) {
		s.ix.undo(changes)
		return 0, 0, errReplan
	}
	if err := s.reserveIDsLocked(changes); err != nil {
		s.ix.undo(changes)
		return 0, 0, err
	}
	var d opDirt
	touched := false
	for i, c := range changes {
		var err error
		switch {
		case c.new == nil:
			err = s.deleteLocked(c.old, replaced[i], &d)
		case c.old == nil:
			err = s.insertLocked(c.new, temps[i], replacing(replaced, i), &d)
			if err == nil {
				temps[i] = ""
			}
		default:
			err = s.updateLocked(c.old, c.new, replacing(replaced, i), &d)
		}
		if err != nil {
			if touched {
				// Part of the batch is in the tree: only its intent can
				// finish it, at the next Open.
				b.keep()
				s.failLocked(fmt.Errorf("batch stopped half way, finished at the next open from %s: %w", b.final, err))
			}
			s.ix.undo(changes)
			return 0, 0, err
		}
		touched = touched || replaced[i] < 0
	}
	if b != nil {
		b.keep()
		d.intent = b.final
	}
	return s.noteLocked(&d), 0, nil
}

// noteLocked hands a commit's dirt to the flusher and returns the gen a
// flush must reach for it to be durable (0 when nothing is to wait for).
// SyncNormal and SyncOff sync nothing: their flushes only finish txns
// (write the fields, remove the attribute), and an intent goes as soon as
// its batch is in the tree, which a crash of the daemon keeps.
func (s *Store) noteLocked(d *opDirt) uint64 {
	if !s.durable && d.intent != "" {
		os.RemoveAll(d.intent)
		d.intent = ""
	}
	if len(d.files)+len(d.dirs)+len(d.stale)+len(d.txns) == 0 && d.intent == "" {
		return 0
	}
	gen := s.fl.note(func(fd *dirt) {
		for id := range d.files {
			fd.files[id] = struct{}{}
		}
		for p := range d.dirs {
			fd.dirs[p] = struct{}{}
		}
		for p, g := range d.stale {
			fd.stale[p] = g
		}
		for id, g := range d.txns {
			fd.txns[id] = g
		}
		if d.intent != "" {
			fd.intents = append(fd.intents, d.intent)
		}
	})
	return gen
}

// checkLimitLocked refuses a batch that would take the store past its
// message limit, saying so in the log at most once a minute.
func (s *Store) checkLimitLocked(changes []change) error {
	if s.ix.n <= s.cfg.maxMessages {
		return nil
	}
	for _, c := range changes {
		if c.old == nil {
			if ok, skipped := s.full.allow(time.Now()); ok {
				s.log.Warn("fs store full: publishes refused (EDQUOT) until messages are acked or deleted",
					queuecore.LogLimit, s.cfg.maxMessages, "refused_since_last_line", skipped)
			}
			return fmt.Errorf("fs store holds %d messages, its limit (--fs-max-messages): %w", s.cfg.maxMessages, queuecore.ErrStoreFull)
		}
	}
	return nil
}

// replacedLocked finds the deletes of a batch whose file path a later op
// of the batch takes (the archive keeps the latest ack of a name: the core
// deletes the older one in the ack's batch). That op replaces the file by
// one rename(2), which does both at once: replaced[i] is the op that
// replaces delete i's file, -1 for none.
func (s *Store) replacedLocked(changes []change) []int {
	var replaced []int
	for i, c := range changes {
		if c.new != nil {
			continue
		}
		p := s.entryPath(c.old)
		for j := i + 1; j < len(changes); j++ {
			if n := changes[j].new; n != nil && s.entryPath(n) == p {
				if replaced == nil {
					replaced = make([]int, len(changes))
					for k := range replaced {
						replaced[k] = -1
					}
				}
				replaced[i] = j
				break
			}
		}
	}
	if replaced == nil {
		replaced = make([]int, len(changes))
		for k := range replaced {
			replaced[k] = -1
		}
	}
	return replaced
}

// replacing reports whether op i takes the file path of a delete before it.
func replacing(replaced []int, i int) bool {
	for _, j := range replaced {
		if j == i {
			return true
		}
	}
	return false
}

// steps is the number of atomic tree changes a batch makes: a delete that
// a later op replaces is part of that op's rename.
func steps(changes []change, replaced []int) int {
	n := 0
	for i := range changes {
		if replaced[i] < 0 {
			n++
		}
	}
	return n
}

// staleConflictLocked returns the gen to flush up to when the old name of
// another message's move holds a path the batch writes to, 0 when none
// does. Only the flush that makes that move durable may remove it.
func (s *Store) staleConflictLocked(changes []change) uint64 {
	for _, c := range changes {
		if c.new == nil {
			continue
		}
		to := s.entryPath(c.new)
		if st, ok := s.stale[to]; ok && st.id != c.new.id {
			return s.currentGenLocked()
		}
	}
	return 0
}

// currentGenLocked is the flusher's gen now: a flush up to it makes
// everything noted so far durable.
func (s *Store) currentGenLocked() uint64 {
	s.fl.mu.Lock()
	defer s.fl.mu.Unlock()
	return max(s.fl.gen, 1)
}

// idsChunk is how many IDs and Seqs DIR/ids reserves at a time.
const idsChunk = 1 << 16

// reserveIDsLocked makes sure DIR/ids covers every ID and Seq the batch
// gives, so that none is given twice even after its message is gone.
func (s *Store) reserveIDsLocked(changes []change) error {
	var top uint64
	for _, c := range changes {
		if c.new != nil {
			top = max(top, c.new.id, c.new.seq)
		}
	}
	if top <= s.idsMark {
		return nil
	}
	return s.writeIDsLocked(top + idsChunk)
}

// writeIDsLocked records mark in DIR/ids durably.
func (s *Store) writeIDsLocked(mark uint64) error {
	data := []byte(strconv.FormatUint(mark, 10) + "\n")
	if err := s.writeFileDurably(filepath.Join(s.dir, idsName), data, nil); err != nil {
		return fmt.Errorf("reserve IDs: %w", err)
	}
	s.idsMark = mark
	return nil
}

// writeFileDurably replaces the file p with data and the attributes fs:
// a temp file, its fsync, a rename, the directory's fsync (the syncs in
// SyncFull and SyncStrict only).
func (s *Store) writeFileDurably(p string, data []byte, fs []field) error {
	tmp := filepath.Join(filepath.Dir(p), tempPrefix+filepath.Base(p)+"."+strconv.FormatUint(s.tempGen.Add(1), 10))
	if err := s.writeBody(tmp, data, fs); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	if s.durable {
		return s.fsyncPath(filepath.Dir(p))
	}
	return nil
}

// insertLocked renames a new body's temp file into place. A spare that
// cannot be renamed into a queue (EXDEV: DIR/spare on another file
// system) turns the pool off, and the batch is tried again without it.
func (s *Store) insertLocked(e *entry, temp string, replace bool, d *opDirt) error {
	to := s.entryPath(e)
	if err := renameTo(temp, to, replace); err != nil {
		if errors.Is(err, unix.EXDEV) {
			s.spares.failed(err)
			return fmt.Errorf("insert message %d: %w: %w", e.id, errReplan, err)
		}
		return fmt.Errorf("insert message %d: %w", e.id, err)
	}
	d.dir(to)
	return nil
}

// renameTo renames from to to; unless replace, a file at to is an error
// (EEXIST) and is left alone.
func renameTo(from, to string, replace bool) error {
	flags := uint(unix.RENAME_NOREPLACE)
	if replace {
		flags = 0
	}
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, flags)
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("rename to %s: a file the store does not know is there: %w", to, queuecore.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("rename to %s: %w", to, err)
	}
	return nil
}

// deleteLocked removes a message's file, unless a later op of the batch
// replaces it (replacedBy >= 0), and its old names.
func (s *Store) deleteLocked(e *entry, replacedBy int, d *opDirt) error {
	p := s.entryPath(e)
	if replacedBy < 0 {
		if err := unix.Unlink(p); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete message %d: %w", e.id, err)
		}
		d.dir(p)
	}
	for _, sp := range s.staleOf[e.id] {
		if s.stale[sp].id == e.id {
			delete(s.stale, sp)
			if err := unix.Unlink(sp); err == nil {
				d.dir(sp)
			}
		}
	}
	delete(s.staleOf, e.id)
	delete(s.txns, e.id)
	delete(s.rewrite, e.id)
	return nil
}

// updateLocked changes a message's file: its attributes, and its name
// when the message moves. One attribute changes with one setxattr(2).
// Anything more is a txn: the txn attribute (the whole new metadata)
// written, then the file moved; the fields beside it are written, and the
// txn removed, by a flush later (finishTxns), off the commit's path.
func (s *Store) updateLocked(old, new *entry, replace bool, d *opDirt) error {
	from, to := s.entryPath(old), s.entryPath(new)
	om, nm := old.message(), new.message()
	nf := fields(&nm)
	moved := from != to
	pt, pending := s.txns[new.id]
	if !pending {
		pt.disk, pt.known = fields(&om), !s.rewrite[new.id]
	}
	set, remove := nf, otherKeys(nf)
	if pt.known {
		set, remove = fieldDiff(fields(&om), nf)
		if !pending {
			if !moved && len(set)+len(remove) == 0 {
				return nil
			}
			if !moved && len(set)+len(remove) == 1 {
				if err := applyFields(from, set, remove); err != nil {
					return fmt.Errorf("update message %d: %w", new.id, err)
				}
				d.file(new.id)
				return nil
			}
		}
	}
	if !moved && pending && len(set)+len(remove) == 0 {
		return nil
	}
	s.txnGen++
	pt.gen = s.txnGen
	t := encodeTxn(txn{from: rel(s.qdir, from), to: rel(s.qdir, to), fields: nf})
	if err := unix.Lsetxattr(from, xattrPrefix+keyTxn, t, 0); err != nil {
		return fmt.Errorf("update message %d: set its txn: %w", new.id, err)
	}
	if moved {
		if err := s.moveLocked(from, to, new.id, pt.gen, replace, d); err != nil {
			// The old metadata is the truth again: the txn says so until
			// a flush finishes it.
			back := encodeTxn(txn{from: rel(s.qdir, from), to: rel(s.qdir, from), fields: fields(&om)})
			if unix.Lsetxattr(from, xattrPrefix+keyTxn, back, 0) == nil {
				s.txns[old.id] = pt
				d.txn(old.id, pt.gen)
			}
			return fmt.Errorf("update message %d: %w", new.id, err)
		}
	}
	s.txns[new.id] = pt
	delete(s.rewrite, new.id)
	d.file(new.id)
	d.txn(new.id, pt.gen)
	return nil
}

func (d *opDirt) txn(id, gen uint64) {
	if d.txns == nil {
		d.txns = map[uint64]uint64{}
	}
	d.txns[id] = gen
}

func (d *opDirt) file(id uint64) {
	if d.files == nil {
		d.files = map[uint64]struct{}{}
	}
	d.files[id] = struct{}{}
}

// moveLocked gives a message's file its new name. In SyncFull and
// SyncStrict a move to another directory links the new name and keeps the
// old one as stale until a flush has made the new one durable: a rename
// made durable in its source directory first would leave the file under
// no name at a power cut. Within one directory, and in the other modes, it
// is a rename(2). replace: the file at to is that of a message the batch
// deletes, replaced in the same step.
func (s *Store) moveLocked(from, to string, id, gen uint64, replace bool, d *opDirt) error {
	if !s.durable || filepath.Dir(from) == filepath.Dir(to) {
		if err := renameTo(from, to, replace); err != nil {
			return err
		}
		d.dir(to)
		return nil
	}
	if st, ok := s.stale[to]; ok && st.id == id {
		// Back to a name it still has (a lease given back at once).
		s.dropStaleLocked(to)
	} else if replace {
		tmp := filepath.Join(filepath.Dir(to), tempPrefix+"link."+strconv.FormatUint(gen, 10))
		if err := unix.Link(from, tmp); err != nil {
			return fmt.Errorf("link %s: %w", to, err)
		}
		if err := unix.Rename(tmp, to); err != nil {
			unix.Unlink(tmp)
			return fmt.Errorf("rename to %s: %w", to, err)
		}
	} else if err := unix.Link(from, to); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("link %s: a file the store does not know is there: %w", to, queuecore.ErrExists)
		}
		return fmt.Errorf("link %s: %w", to, err)
	}
	d.dir(to)
	s.stale[from] = staleLink{id: id, gen: gen}
	s.staleOf[id] = append(s.staleOf[id], from)
	if d.stale == nil {
		d.stale = map[string]uint64{}
	}
	d.stale[from] = gen
	return nil
}

// dropStaleLocked forgets the old name p.
func (s *Store) dropStaleLocked(p string) {
	st, ok := s.stale[p]
	if !ok {
		return
	}
	delete(s.stale, p)
	ps := s.staleOf[st.id]
	for i, q := range ps {
		if q == p {
			ps = append(ps[:i], ps[i+1:]...)
			break
		}
	}
	if len(ps) == 0 {
		delete(s.staleOf, st.id)
	} else {
		s.staleOf[st.id] = ps
	}
}

// applyFields sets and removes attributes of the file at p.
func applyFields(p string, set []field, remove []string) error {
	for _, f := range set {
		if err := unix.Lsetxattr(p, xattrPrefix+f.key, []byte(f.val), 0); err != nil {
			return fmt.Errorf("set %s%s on %s: %w", xattrPrefix, f.key, p, err)
		}
	}
	for _, k := range remove {
		if err := unix.Lremovexattr(p, xattrPrefix+k); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("remove %s%s from %s: %w", xattrPrefix, k, p, err)
		}
	}
	return nil
}

// writeAllFields makes the attributes of the file at p exactly fs.
func writeAllFields(p string, fs []field) error {
	return applyFields(p, fs, otherKeys(fs))
}

// otherKeys are the message keys fs does not set.
func otherKeys(fs []field) []string {
	has := map[string]bool{}
	for _, f := range fs {
		has[f.key] = true
	}
	var out []string
	for _, k := range fieldKeys {
		if !has[k] {
			out = append(out, k)
		}
	}
	return out
}

// rel is p relative to base (a path under it).
func rel(base, p string) string { return p[len(base)+1:] }

// intent is the record of a batch of several messages under way: what
// Open needs to finish it (see the package comment). It is the file
// "intent" of the batch's directory DIR/intents/N, beside the bodies of
// the batch's new messages (named by ID).
type intent struct {
	Batch uint64     `json:"batch"`
	Ops   []intentOp `json:"ops"`
	End   bool       `json:"end"` // written last: an intent without it was cut short
}

type intentOp struct {
	Op     string            `json:"op"` // insert, update or delete
	ID     uint64            `json:"id"`
	From   string            `json:"from,omitempty"` // update, delete: where the file is, relative to DIR/queues
	To     string            `json:"to,omitempty"`   // insert, update: where it goes
	Fields map[string]string `json:"fields,omitempty"`
}

const intentName = "intent"

// intentOpsLocked is what the applied changes do, as intent ops.
func (s *Store) intentOpsLocked(changes []change) []intentOp {
	ops := make([]intentOp, 0, len(changes))
	for _, c := range changes {
		switch {
		case c.new == nil:
			ops = append(ops, intentOp{Op: "delete", ID: c.old.id, From: rel(s.qdir, s.entryPath(c.old))})
		case c.old == nil:
			ops = append(ops, intentOp{Op: "insert", ID: c.new.id, To: rel(s.qdir, s.entryPath(c.new))})
		default:
			m := c.new.message()
			ops = append(ops, intentOp{Op: "update", ID: c.new.id, From: rel(s.qdir, s.entryPath(c.old)), To: rel(s.qdir, s.entryPath(c.new)), Fields: fieldMap(fields(&m))})
		}
	}
	return ops
}

// sameOps reports whether two plans are the same changes of the tree.
func sameOps(a, b []intentOp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Op != b[i].Op || a[i].ID != b[i].ID || a[i].From != b[i].From || a[i].To != b[i].To || !maps.Equal(a[i].Fields, b[i].Fields) {
			return false
		}
	}
	return true
}

func fieldMap(fs []field) map[string]string {
	m := make(map[string]string, len(fs))
	for _, f := range fs {
		m[f.key] = f.val
	}
	return m
}

// batchDir is the directory of a batch with an intent: made under a temp
// name, renamed to DIR/intents/N once the intent is in it, removed once
// the batch is durable.
type batchDir struct {
	s          *Store
	n          uint64
	tmp, final string
	kept       bool
}

func (s *Store) newBatchDir() (*batchDir, error) {
	n := s.batchGen.Add(1)
	d := filepath.Join(s.dir, intentsDir)
	b := &batchDir{s: s, n: n, tmp: filepath.Join(d, tempPrefix+strconv.FormatUint(n, 10)), final: filepath.Join(d, strconv.FormatUint(n, 10))}
	if err := os.Mkdir(b.tmp, 0o700); err != nil {
		return nil, fmt.Errorf("batch directory: %w", err)
	}
	return b, nil
}

// keep hands the batch's directory over to the flusher (or to the next
// Open, after a failure).
func (b *batchDir) keep() {
	if b != nil {
		b.kept = true
	}
}

func (b *batchDir) remove() {
	if b != nil && !b.kept {
		os.RemoveAll(b.tmp)
		os.RemoveAll(b.final)
	}
}

// writeIntent writes the intent into the batch's directory and gives the
// directory its final name, durably in SyncFull and SyncStrict: with the
// bodies in it, the intent is all Open needs to finish the batch, and no
// part of the batch may be durable before it is. Outside the lock: the
// syncs see only the batch's own files and DIR/intents.
func (s *Store) writeIntent(b *batchDir, plan []intentOp) error {
	in := intent{Batch: b.n, Ops: plan, End: true}
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	p := filepath.Join(b.tmp, intentName)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("write intent: %w", err)
	}
	_, err = f.Write(append(data, '\n'))
	if err == nil && s.durable {
		err = s.fsync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && s.durable {
		err = s.fsyncPath(b.tmp)
	}
	if err == nil {
		err = os.Rename(b.tmp, b.final)
	}
	if err == nil && s.durable {
		err = s.fsyncPath(filepath.Dir(b.final))
	}
	if err != nil {
		return fmt.Errorf("write intent: %w", err)
	}
	return nil
}
