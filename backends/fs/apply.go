package fs

import (
	"context"
	"errors"
	"fmt"
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
		_, err := s.ix.CheckPlace(&op.Msg)
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
	f, ok := s.spares.Take()
	if !ok {
		return "", false
	}
	err := writeAll(f.FD, body)
	for _, fl := range fs {
		if err != nil {
			break
		}
		err = unix.Fsetxattr(f.FD, xattrPrefix+fl.key, []byte(fl.val), 0)
	}
	if err == nil && s.durable {
		if s.cfg.fsync != nil {
			err = s.cfg.fsync(os.NewFile(uintptr(f.FD), f.Path))
		} else {
			err = unix.Fsync(f.FD)
		}
	}
	if err != nil {
		s.spares.Discard(f)
		if !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EDQUOT) {
			s.spares.Failed(err)
		}
		return "", false
	}
	unix.Close(f.FD)
	return f.Path, true
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
		if c.Old == nil && temps[i] == "" {
			s.ix.undo(changes) // cannot happen: prepare checked the place
			return 0, 0, fmt.Errorf("insert message %d: no body file written: %w", c.New.ID, errBadOp)
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
		case c.New == nil:
			err = s.deleteLocked(c.Old, replaced[i], &d)
		case c.Old == nil:
			err = s.insertLocked(c.New, temps[i], replacing(replaced, i), &d)
			if err == nil {
				temps[i] = ""
			}
		default:
			err = s.updateLocked(c.Old, c.New, replacing(replaced, i), &d)
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
		if c.Old == nil {
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
		if c.New != nil {
			continue
		}
		p := s.entryPath(c.Old)
		for j := i + 1; j < len(changes); j++ {
			if n := changes[j].New; n != nil && s.entryPath(n) == p {
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
		if c.New == nil {
			continue
		}
		to := s.entryPath(c.New)
		if st, ok := s.stale[to]; ok && st.id != c.New.ID {
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
		if c.New != nil {
			top = max(top, c.New.ID, c.New.Seq)
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
