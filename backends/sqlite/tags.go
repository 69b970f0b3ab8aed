//go:build !yirangmq_novfs && !yirangmq_sqlreads

package sqlite

// The store's own VFS (vfs.go) and readers (reader.go) are measured
// against SQLite's unix VFS and database/sql's pool by building with the
// tags yirangmq_novfs and yirangmq_sqlreads, which change what Open uses
// (defaultTuning), daemon and in-process benchmarks alike.
const (
	tagNoVFS    = false
	tagSQLReads = false
)
