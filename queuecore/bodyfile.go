package queuecore

import (
	"context"
	"os"
)

// BodyFiler is implemented by a store that keeps bodies in files of their
// own (every body in the fs store, the big ones in the sqlite store), so
// that a reader can read a body in place instead of a copy in memory: the
// daemon hands the file to the kernel (FUSE passthrough) or splices from
// it.
type BodyFiler interface {
	// BodyFile opens the file that holds the body of message id,
	// read-only, and checks that it is that message's. It returns nil (and
	// no error) when the body is not in its file at the moment (a commit
	// that has not written it yet): Body has it then. ErrNotFound if there
	// is no such message. The file's bytes never change while it is open:
	// a store replaces a body file by a new one, never in place.
	BodyFile(ctx context.Context, id uint64) (*os.File, error)
}

// BodyFileMinner is implemented by a BodyFiler that keeps only the bodies
// of at least BodyFileMin bytes in files (the sqlite store): a smaller
// body is always in the store, so a reader may keep it in the page cache.
type BodyFileMinner interface {
	BodyFileMin() int64
}

// BodyFile opens the file of m's body for reading in place, when the store
// keeps bodies in files (inFiles). f is nil when it does not, or when m's
// body is not in its file yet; Body has it then. The caller closes f.
func (c *Core) BodyFile(ctx context.Context, m Message) (f *os.File, inFiles bool, err error) {
	s, ok := c.store.(BodyFiler)
	if !ok {
		return nil, false, nil
	}
	if mm, ok := s.(BodyFileMinner); ok && m.Size < mm.BodyFileMin() {
		return nil, false, nil
	}
	f, err = s.BodyFile(ctx, m.ID)
	return f, true, err
}
