package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"yirangmq/backends"
	"yirangmq/backends/fs"
	"yirangmq/backends/sqlite"
	"yirangmq/queuecore"
)

// defaultStore is where a store lives when --store is not given: the
// system's state directory for root, the user's data directory otherwise.
func defaultStore() string {
	if os.Getuid() == 0 {
		return "/var/lib/yirangmq"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "yirangmq")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "yirangmq")
	}
	return "yirangmq-store"
}

// storeSpec is the store a mount opens, from its flags.
type storeSpec struct {
	backend, dir string
	sync         queuecore.SyncMode
	// sqliteFileBodies is the body size from which the sqlite store keeps
	// a body in a file (0: its default, -1: never).
	sqliteFileBodies int64
	// fsMaxMessages is the messages the fs store holds at most (0: its
	// default); fsSpares its spare files (0: its default, -1: none).
	fsMaxMessages, fsSpares int
}

// openStore opens the store of a backend; this is the one place where the
// command line meets the backends.
func openStore(ctx context.Context, spec storeSpec, holder string, log *slog.Logger) (queuecore.Store, error) {
	opts := backends.Options{Sync: spec.sync, Holder: holder, Logger: log}
	switch spec.backend {
	case "sqlite":
		return sqlite.OpenTuned(ctx, spec.dir, opts, sqlite.Tuning{FileBodies: spec.sqliteFileBodies})
	case "fs":
		return fs.OpenTuned(ctx, spec.dir, opts, fs.Tuning{MaxMessages: spec.fsMaxMessages, Spares: spec.fsSpares})
	case "postgres":
		if !isPostgresURL(spec.dir) {
			return nil, fmt.Errorf("--backend postgres needs --store postgres://USER@HOST/DB (or a key=value connection string), not %q", spec.dir)
		}
		return openPostgres(ctx, spec.dir, opts)
	}
	return nil, fmt.Errorf("unknown backend %q: use sqlite, fs or postgres", spec.backend)
}

// isPostgresURL reports whether s looks like a PostgreSQL connection string.
func isPostgresURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") || strings.Contains(s, "=")
}

// displayStore is the store as it may be shown in /proc/mounts, .stats and
// logs: a connection string loses its password.
func displayStore(backend, store string) string {
	if backend != "postgres" {
		return store
	}
	return redactPostgres(store)
}

// newLogger makes the daemon's logger: text (default) or json on out,
// with repeated lines of one kind rate-limited (logging.go).
func newLogger(out io.Writer, format string, debug bool) (*slog.Logger, error) {
	level := slog.LevelInfo
	if debug {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(newThrottleHandler(slog.NewTextHandler(out, opts), time.Now)), nil
	case "json":
		return slog.New(newThrottleHandler(slog.NewJSONHandler(out, opts), time.Now)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, not %q", format)
}
