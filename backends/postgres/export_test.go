package postgres

import (
	"context"

	"yirangmq/backends"
)

// openPlain opens a store without revision checks: updates and deletes
// apply whatever the stored revision, and an update stores Msg.Rev as
// given. That is the plain queuecore.Store contract, which the conformance
// suite (backendtest.Run, RunCrash) tests: its updates carry no revision.
func openPlain(ctx context.Context, url string, opts backends.Options) (*Store, error) {
	s, err := Open(ctx, url, opts)
	if err != nil {
		return nil, err
	}
	s.plain = true
	s.txSettings += keepSeq
	return s, nil
}
