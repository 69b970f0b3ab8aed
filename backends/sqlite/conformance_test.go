package sqlite

import (
	"context"
	"testing"

	"yirangmq/backends"
	"yirangmq/backends/backendtest"
	"yirangmq/queuecore"
)

func openForSuite(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
	return Open(ctx, dir, backends.Options{Sync: sync})
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, openForSuite)
}

// TestCrash kills a child process that commits batches and checks the
// store it leaves (the child is this test, run again).
func TestCrash(t *testing.T) {
	backendtest.RunCrash(t, openForSuite)
}

// openFilesForSuite keeps every body of 100 bytes or more in a file, so
// that the suite's bodies, small and large, take both paths.
func openFilesForSuite(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
	return OpenTuned(ctx, dir, backends.Options{Sync: sync}, Tuning{FileBodies: 100})
}

func TestConformanceFileBodies(t *testing.T) {
	backendtest.Run(t, openFilesForSuite)
}

func TestCrashFileBodies(t *testing.T) {
	backendtest.RunCrash(t, openFilesForSuite)
}
