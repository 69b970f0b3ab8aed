// Package backendtest is the conformance suite every queuecore.Store must
// pass, in the manner of litestream's RunWithReplicaClient: each store's own
// tests call Run (the behaviour of every Store method, as its doc comment
// states it) and RunCrash (kill -9 of a process that is committing batches,
// then recovery), with an Opener that opens that store.
//
// The suite checks what a store promises, not how it keeps it: the orders of
// List, Due and Queues, the errors of Apply and the atomicity of its batches,
// the round trip of every Message field and body, durability across Close and
// reopen in every SyncMode, concurrent use, and the one-process lock.
package backendtest

import (
	"context"
	"testing"

	"yirangmq/queuecore"
)

// Opener opens (or reopens) a store in dir with the given sync mode.
type Opener func(ctx context.Context, dir string, sync queuecore.SyncMode) (queuecore.Store, error)

// Run runs the conformance suite against the stores open returns, one
// subtest per behaviour. Every subtest uses its own directory.
func Run(t *testing.T, open Opener) {
	t.Helper()
	suites := []struct {
		name string
		run  func(*testing.T, Opener)
	}{
		{"Empty", testEmpty},
		{"Queues", testQueues},
		{"DeleteQueue", testDeleteQueue},
		{"ApplyInsertUpdateDelete", testApplyBasics},
		{"ApplyErrors", testApplyErrors},
		{"ApplyAllowed", testApplyAllowed},
		{"UpdateMoves", testUpdateMoves},
		{"Lookup", testLookup},
		{"Body", testBody},
		{"Fields", testFields},
		{"List", testList},
		{"ListStop", testListStop},
		{"Due", testDue},
		{"Counts", testCounts},
		{"MaxID", testMaxID},
		{"Persistence", testPersistence},
		{"Concurrent", testConcurrent},
		{"ConcurrentFailure", testConcurrentFailure},
		{"Lock", testLock},
	}
	for _, s := range suites {
		t.Run(s.name, func(t *testing.T) { s.run(t, open) })
	}
}
