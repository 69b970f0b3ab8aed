package fusefs

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"yirangmq/queuecore"
)

// FuzzErrnoOf: whatever a store or the core wraps, and however deep, an
// error never reaches the kernel as 0 (success), a sentinel keeps its
// errno through %w chains, and the errno of the store's filesystem (a full
// disk) is what close(2) returns when nothing more specific is in the chain;
// any other errno (a database socket's ENOENT) is EIO, never passed on.
func FuzzErrnoOf(f *testing.F) {
	f.Add(uint8(0), uint8(1), uint16(28))
	f.Add(uint8(12), uint8(3), uint16(5))
	f.Add(uint8(13), uint8(0), uint16(0))
	type cause struct {
		err  error
		want syscall.Errno // 0: the errno of the fuzzed syscall.Errno
	}
	var causes []cause
	for _, s := range coreSentinels() {
		causes = append(causes, cause{s.err, s.want})
	}
	causes = append(causes, []cause{
		{errDraftsFull, syscall.EDQUOT},
		{errMemoryFull, syscall.ENOSPC},
		{&queuecore.InputError{Field: "name", Msg: "bad", Err: queuecore.ErrInvalidName}, syscall.EINVAL},
		{&queuecore.ValidationError{Queue: "q", Name: "m", Reason: "not JSON", Kept: true}, syscall.EINVAL},
		{context.Canceled, syscall.EINTR},
		{context.DeadlineExceeded, syscall.EIO}, // a store's timeout
		{fmt.Errorf("dial unix /tmp/.s.PGSQL.5432: %w", syscall.ENOENT), syscall.EIO},
		{nil, 0}, // a bare syscall.Errno
		{errors.New("opaque"), syscall.EIO},
	}...)
	f.Fuzz(func(t *testing.T, which, depth uint8, errno uint16) {
		c := causes[int(which)%len(causes)]
		err := c.err
		want := c.want
		if err == nil {
			e := syscall.Errno(errno)
			if e == 0 {
				e = syscall.ENOSPC
			}
			err, want = e, syscall.EIO
			if storeErrno(e) {
				want = e // a full disk, a read-only store: what close(2) says
			}
		}
		for i := 0; i < int(depth%8); i++ {
			if i%2 == 0 {
				err = fmt.Errorf("layer %d: %w", i, err)
			} else {
				err = &fmtWrapped{err}
			}
		}
		got := errnoOf(err)
		if got == 0 {
			t.Fatalf("errnoOf(%v) = 0: an error answered as success", err)
		}
		if got != want {
			t.Fatalf("errnoOf(%v) = %v, want %v", err, got, want)
		}
		if errnoOf(nil) != 0 {
			t.Fatal("errnoOf(nil) != 0")
		}
	})
}

// fmtWrapped is a store's own error type around a cause.
type fmtWrapped struct{ err error }

func (e *fmtWrapped) Error() string { return "store: " + e.err.Error() }
func (e *fmtWrapped) Unwrap() error { return e.err }

// FuzzNameTooLong: the Lookup guard agrees with NAME_MAX and with the
// core's own limit on message names.
func FuzzNameTooLong(f *testing.F) {
	f.Add(254)
	f.Add(255)
	f.Add(256)
	f.Fuzz(func(t *testing.T, n int) {
		n = min(max(n, 0), 1<<16)
		name := string(make([]byte, n))
		if nameTooLong(name) != (n > 255) {
			t.Fatalf("nameTooLong of %d bytes = %v", n, nameTooLong(name))
		}
		if n > queuecore.MaxMessageName && !nameTooLong(name) {
			t.Fatalf("a name of %d bytes passes Lookup but no message can have it", n)
		}
	})
}

// coreSentinels is every sentinel error of queuecore/errors.go, by name,
// with the errno a mount answers for it.
func coreSentinels() map[string]struct {
	err  error
	want syscall.Errno
} {
	return map[string]struct {
		err  error
		want syscall.Errno
	}{
		"ErrNotFound":     {queuecore.ErrNotFound, syscall.ENOENT},
		"ErrExists":       {queuecore.ErrExists, syscall.EEXIST},
		"ErrImmutable":    {queuecore.ErrImmutable, syscall.EPERM},
		"ErrNotAllowed":   {queuecore.ErrNotAllowed, syscall.EPERM},
		"ErrNotEmpty":     {queuecore.ErrNotEmpty, syscall.ENOTEMPTY},
		"ErrQueueFull":    {queuecore.ErrQueueFull, syscall.EDQUOT},
		"ErrTooLarge":     {queuecore.ErrTooLarge, syscall.EFBIG},
		"ErrPaused":       {queuecore.ErrPaused, syscall.EAGAIN},
		"ErrEmpty":        {queuecore.ErrEmpty, syscall.EAGAIN},
		"ErrLocked":       {queuecore.ErrLocked, syscall.EBUSY},
		"ErrClosed":       {queuecore.ErrClosed, syscall.EIO},
		"ErrInvalidName":  {queuecore.ErrInvalidName, syscall.EINVAL},
		"ErrDiskLow":      {queuecore.ErrDiskLow, syscall.ENOSPC},
		"ErrPolicyBroken": {queuecore.ErrPolicyBroken, syscall.EIO},
		"ErrStoreFull":    {queuecore.ErrStoreFull, syscall.EDQUOT},
	}
}

// TestErrnoOfEverySentinel: each sentinel declared in queuecore/errors.go
// is in coreSentinels (so FuzzErrnoOf wraps it), and errnoOf gives it the
// errno that its declaration's comment names. A sentinel added to the core
// without a row here fails this test.
func TestErrnoOfEverySentinel(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join("..", "queuecore", "errors.go"), nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	known := coreSentinels()
	seen := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for _, id := range vs.Names {
				if !strings.HasPrefix(id.Name, "Err") {
					continue
				}
				seen++
				s, ok := known[id.Name]
				if !ok {
					t.Errorf("queuecore.%s has no row in coreSentinels", id.Name)
					continue
				}
				if got := errnoOf(s.err); got != s.want {
					t.Errorf("errnoOf(%s) = %v, want %v", id.Name, got, s.want)
				}
				if got := errnoOf(fmt.Errorf("wrapped: %w", s.err)); got != s.want {
					t.Errorf("errnoOf(wrapped %s) = %v, want %v", id.Name, got, s.want)
				}
				if vs.Comment == nil {
					t.Errorf("queuecore.%s: no errno in its comment", id.Name)
					continue
				}
				doc := strings.Fields(vs.Comment.Text())
				if len(doc) == 0 || strings.TrimRight(doc[0], ":,.") != errnoName(s.want) {
					t.Errorf("queuecore.%s: its comment says %q, errnoOf gives %s", id.Name, vs.Comment.Text(), errnoName(s.want))
				}
			}
		}
	}
	if seen != len(known) {
		t.Errorf("errors.go declares %d sentinels, coreSentinels has %d", seen, len(known))
	}
}

// errnoName is the C name of an errno (EPERM), as errors.go's comments
// write it.
func errnoName(e syscall.Errno) string {
	for _, n := range []struct {
		e syscall.Errno
		s string
	}{
		{syscall.ENOENT, "ENOENT"}, {syscall.EEXIST, "EEXIST"}, {syscall.EPERM, "EPERM"},
		{syscall.ENOTEMPTY, "ENOTEMPTY"}, {syscall.EDQUOT, "EDQUOT"}, {syscall.EFBIG, "EFBIG"},
		{syscall.EAGAIN, "EAGAIN"}, {syscall.EBUSY, "EBUSY"}, {syscall.EIO, "EIO"},
		{syscall.EINVAL, "EINVAL"}, {syscall.ENOSPC, "ENOSPC"},
	} {
		if n.e == e {
			return n.s
		}
	}
	return e.Error()
}
