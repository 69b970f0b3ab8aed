package postgres

import (
	"testing"

	"yirangmq/backends/backendtest"
	"yirangmq/testenv/pgtest"
)

func TestConformance(t *testing.T) {
	srv := pgtest.Start(t)
	backendtest.Run(t, suiteOpener(srv))
}

func TestShared(t *testing.T) {
	srv := pgtest.Start(t)
	backendtest.RunShared(t, sharedOpener(srv))
}

// TestCrash kills a child process that commits batches and checks the
// store it leaves (the child is this test, run again, on this test's
// server through pgtest.Export). Over PostgreSQL, kill -9 of a client
// is the loss of a connection: the server rolls back what was not
// committed; the suite checks that nothing committed is lost and nothing
// half done is left.
func TestCrash(t *testing.T) {
	srv := pgtest.Start(t) // in the child: the parent's server
	srv.Export(t)
	backendtest.RunCrash(t, suiteOpener(srv))
}
