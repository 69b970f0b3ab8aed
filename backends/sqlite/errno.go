package sqlite

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/mattn/go-sqlite3"
)

// withErrno adds to a failed write the errno a filesystem would give, so
// that errors.As finds it (fusefs makes it what close(2) returns; docs/contract.md
// §2 promises ENOSPC for a full disk). sqlite3.Error has no Unwrap, and
// SQLite reports ENOSPC and EDQUOT from write(2) as SQLITE_FULL with no
// system errno: without this a full disk was a bare EIO.
func withErrno(err error) error {
	if err == nil {
		return nil // before se, which escapes: no allocation per commit
	}
	var se sqlite3.Error
	if !errors.As(err, &se) {
		return err
	}
	switch {
	case se.Code == sqlite3.ErrFull:
		return fmt.Errorf("%w (%w)", err, syscall.ENOSPC)
	case se.Code == sqlite3.ErrIoErr && (se.SystemErrno == syscall.ENOSPC || se.SystemErrno == syscall.EDQUOT):
		return fmt.Errorf("%w (%w)", err, se.SystemErrno)
	}
	return err
}
