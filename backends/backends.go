// Package backends holds what every store shares: the options a store is
// opened with and the advisory lock that keeps one process per store. The
// stores themselves live in backends/fs and backends/sqlite and implement
// queuecore.Store; backends/backendtest is the conformance suite both pass.
package backends

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"yirangmq/queuecore"
)

// Options are given to every store's Open.
type Options struct {
	Sync queuecore.SyncMode
	// Holder describes the opener in the lock file, e.g. "mount /mnt/mq";
	// a second opener's error quotes it with the holder's pid.
	Holder string
	Logger *slog.Logger // nil: discard
}

// Log returns the logger to use, never nil.
func (o Options) Log() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}

// LockFileName is the advisory lock file inside a store directory.
const LockFileName = "LOCK"

// Lock is a held advisory lock on a store directory.
type Lock struct{ f *os.File }

// LockStore creates dir if needed and takes an exclusive flock(2) on
// dir/LOCK without waiting. The lock file records the holder's pid and
// description; if another process (or another open in this process) holds
// it, the error wraps queuecore.ErrLocked and names that holder.
func LockStore(dir, holder string) (*Lock, error) {
	if err := createDurably(dir); err != nil {
		return nil, fmt.Errorf("create store directory: %w", err)
	}
	path := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	f.Chmod(0o600) // also one made before by another umask or version
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			who, _ := os.ReadFile(path)
			desc := strings.TrimSpace(string(who))
			if desc == "" {
				desc = "unknown holder"
			}
			return nil, fmt.Errorf("store %s: %w (%s)", dir, queuecore.ErrLocked, desc)
		}
		return nil, fmt.Errorf("lock store %s: %w", dir, err)
	}
	desc := fmt.Sprintf("pid %d", os.Getpid())
	if holder != "" {
		desc += ", " + holder
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(desc+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Unlock releases the lock. The lock file stays (removing it would race
// with a new holder).
func (l *Lock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	_ = l.f.Truncate(0)
	err := l.f.Close() // closing the last descriptor drops the flock
	l.f = nil
	return err
}

// createDurably creates dir (and missing parents) and, for each directory
// it created, fsyncs its parent: a new directory's entry is only durable
// once its parent is synced, and a store whose directory vanishes at a
// power cut has lost everything committed in it.
func createDurably(dir string) error {
	dir = filepath.Clean(dir)
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := createDurably(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return SyncDir(parent)
}

// SyncDir fsyncs a directory, making its entries durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
