package fs

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// insertLocked renames a new body's temp file into place. A spare that
// cannot be renamed into a queue (EXDEV: DIR/spare on another file
// system) turns the pool off, and the batch is tried again without it.
func (s *Store) insertLocked(e *entry, temp string, replace bool, d *opDirt) error {
	to := s.entryPath(e)
	if err := renameTo(temp, to, replace); err != nil {
		if errors.Is(err, unix.EXDEV) {
			s.spares.Failed(err)
			return fmt.Errorf("insert message %d: %w: %w", e.ID, errReplan, err)
		}
		return fmt.Errorf("insert message %d: %w", e.ID, err)
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
			return fmt.Errorf("delete message %d: %w", e.ID, err)
		}
		d.dir(p)
	}
	for _, sp := range s.staleOf[e.ID] {
		if s.stale[sp].id == e.ID {
			delete(s.stale, sp)
			if err := unix.Unlink(sp); err == nil {
				d.dir(sp)
			}
		}
	}
	delete(s.staleOf, e.ID)
	delete(s.txns, e.ID)
	delete(s.rewrite, e.ID)
	return nil
}

// updateLocked changes a message's file: its attributes, and its name
// when the message moves. One attribute changes with one setxattr(2).
// Anything more is a txn: the txn attribute (the whole new metadata)
// written, then the file moved; the fields beside it are written, and the
// txn removed, by a flush later (finishTxns), off the commit's path.
func (s *Store) updateLocked(old, new *entry, replace bool, d *opDirt) error {
	from, to := s.entryPath(old), s.entryPath(new)
	om, nm := old.Message(), new.Message()
	nf := fields(&nm)
	moved := from != to
	pt, pending := s.txns[new.ID]
	if !pending {
		pt.disk, pt.known = fields(&om), !s.rewrite[new.ID]
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
					return fmt.Errorf("update message %d: %w", new.ID, err)
				}
				d.file(new.ID)
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
		return fmt.Errorf("update message %d: set its txn: %w", new.ID, err)
	}
	if moved {
		if err := s.moveLocked(from, to, new.ID, pt.gen, replace, d); err != nil {
			// The old metadata is the truth again: the txn says so until
			// a flush finishes it.
			back := encodeTxn(txn{from: rel(s.qdir, from), to: rel(s.qdir, from), fields: fields(&om)})
			if unix.Lsetxattr(from, xattrPrefix+keyTxn, back, 0) == nil {
				s.txns[old.ID] = pt
				d.txn(old.ID, pt.gen)
			}
			return fmt.Errorf("update message %d: %w", new.ID, err)
		}
	}
	s.txns[new.ID] = pt
	delete(s.rewrite, new.ID)
	d.file(new.ID)
	d.txn(new.ID, pt.gen)
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
