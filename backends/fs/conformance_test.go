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

// openTinyCheckpoints opens a store that checkpoints after about every
// commit, so that the suites also run across journal rotations.
func openTinyCheckpoints(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
	return open(ctx, dir, backends.Options{Sync: sync}, config{checkpointBytes: 1})
}

func TestConformanceTinyCheckpoints(t *testing.T) {
	backendtest.Run(t, openTinyCheckpoints)
}

func TestCrashTinyCheckpoints(t *testing.T) {
	backendtest.RunCrash(t, openTinyCheckpoints)
}

// openTinySpill opens a store whose queues spill past 2 ready messages and
// that checkpoints after about every commit, so that the suites run with
// most ready messages in spill files, across journal rotations.
func openTinySpill(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
	return open(ctx, dir, backends.Options{Sync: sync}, config{checkpointBytes: 1, spillAt: 2})
}

func TestConformanceTinySpill(t *testing.T) {
	backendtest.Run(t, openTinySpill)
}

func TestCrashTinySpill(t *testing.T) {
	backendtest.RunCrash(t, openTinySpill)
}

// openStageAll opens a store that stages every body of a byte or more
// (staged.go) and checkpoints after about every commit, so that the suites
// run with bodies placed from DIR/staged, across journal rotations (in
// SyncFull and SyncStrict; the other modes do not stage).
func openStageAll(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
	return open(ctx, dir, backends.Options{Sync: sync}, config{checkpointBytes: 1, stageAt: 1})
}

func TestConformanceStageAll(t *testing.T) {
	backendtest.Run(t, openStageAll)
}

func TestCrashStageAll(t *testing.T) {
	backendtest.RunCrash(t, openStageAll)
}
