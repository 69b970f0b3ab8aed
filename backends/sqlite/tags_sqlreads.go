//go:build yirangmq_sqlreads && !yirangmq_novfs

package sqlite

const (
	tagNoVFS    = false
	tagSQLReads = true
)
