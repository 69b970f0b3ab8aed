//go:build nopostgres

package main

import (
	"context"
	"errors"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// withPostgres is false in a binary built with -tags nopostgres: the
// postgres store and its driver (pgx) are left out, some 6 MB of a
// release binary (docs/operations.md).
const withPostgres = false

func openPostgres(context.Context, string, backends.Options) (queuecore.Store, error) {
	return nil, errors.New("this yirangmq was built without the postgres store (-tags nopostgres): use sqlite or fs, or a build with it")
}

// redactPostgres hides the whole string: without the postgres store there
// is no parser to tell the password from the rest, and no store is opened
// with it.
func redactPostgres(string) string { return "postgres" }
