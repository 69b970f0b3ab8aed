//go:build yirangmq_novfs && yirangmq_sqlreads

package sqlite

const (
	tagNoVFS    = true
	tagSQLReads = true
)
