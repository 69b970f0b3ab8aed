package backendtest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"yirangmq/queuecore"
)

func openMemStore(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
	return openMem(ctx, dir, sync, memOptions{})
}

// TestMemStore runs the suite against the reference store, which tests the
// suite: a check that fails here is wrong, not the store.
func TestMemStore(t *testing.T) { Run(t, openMemStore) }

func TestMemStoreCrash(t *testing.T) { RunCrash(t, openMemStore) }

// TestCrashDetectsLostCommits runs the crash test end to end against a
// store that loses its last commits at every reopen after a kill, and
// expects the checker to notice.
func TestCrashDetectsLostCommits(t *testing.T) {
	var opens atomic.Int32
	lossy := func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error) {
		opt := memOptions{}
		if opens.Add(1) > 1 { // not the set-up open
			opt.dropTail = 2 * crashWorkers
		}
		return openMem(ctx, dir, sync, opt)
	}
	if spec, ok := crashChild(t); ok {
		runCrashChild(t, openMemStore, spec)
		return
	}
	cfg := crashConfig{kills: 1, minBatches: 50, minRun: 10 * time.Millisecond, maxRun: 20 * time.Millisecond}
	problems := crashRounds(t, lossy, t.Name(), queuecore.SyncNormal, cfg, uint64(time.Now().UnixNano()))
	if len(problems) == 0 {
		t.Fatal("the crash test did not notice a store that lost its last 8 commits")
	}
	found := false
	for _, p := range problems {
		if strings.Contains(p, "is lost") || strings.Contains(p, "should not exist") ||
			strings.Contains(p, "is not as") || strings.Contains(p, "MaxID") {
			found = true
		}
	}
	if !found {
		t.Errorf("the crash test found problems, but not the lost commits:\n%s", strings.Join(problems, "\n"))
	}
	t.Logf("found, as it should:\n%s", strings.Join(problems[:min(len(problems), 5)], "\n"))
}
