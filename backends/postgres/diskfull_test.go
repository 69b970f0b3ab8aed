package postgres

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A write the server refused for lack of disk (SQLSTATE 53100) reaches
// the caller as ENOSPC, with one log line; other errors pass unchanged.
func TestDiskFullIsENOSPC(t *testing.T) {
	var log bytes.Buffer
	s := &Store{log: slog.New(slog.NewTextHandler(&log, nil))}
	full := fmt.Errorf("apply: insert q/m: %w", &pgconn.PgError{Code: "53100", Message: `could not extend file "base/16384/16385": No space left on device`})
	err := s.diskFull(full)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("disk_full: %v, want ENOSPC", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "53100" {
		t.Errorf("disk_full: the server's error is lost: %v", err)
	}
	if n := strings.Count(log.String(), "disk is full"); n != 1 {
		t.Errorf("log has %d lines about the full disk, want 1:\n%s", n, log.String())
	}
	other := &pgconn.PgError{Code: codeUnique}
	if err := s.diskFull(other); err != error(other) || errors.Is(err, syscall.ENOSPC) {
		t.Errorf("unique violation became %v", err)
	}
	if s.diskFull(nil) != nil {
		t.Error("nil became an error")
	}
}
