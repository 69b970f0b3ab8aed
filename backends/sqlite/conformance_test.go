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
