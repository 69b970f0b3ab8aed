//go:build !nopostgres

package main

import (
	"context"

	"yirangmq/backends"
	"yirangmq/backends/postgres"
	"yirangmq/queuecore"
)

// withPostgres is false in a binary built with -tags nopostgres.
const withPostgres = true

func openPostgres(ctx context.Context, dsn string, opts backends.Options) (queuecore.Store, error) {
	return postgres.Open(ctx, dsn, opts)
}

// redactPostgres hides the password of a connection string in every form
// pgx accepts.
func redactPostgres(dsn string) string { return postgres.Redact(dsn) }
