package fs

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

// TestCrash kills a process committing batches with SIGKILL and checks the
// recovered store (the child process runs this same test).
func TestCrash(t *testing.T) {
	backendtest.RunCrash(t, openForSuite)
}
