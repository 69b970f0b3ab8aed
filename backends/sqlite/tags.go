//go:build !yirangmq_novfs

package sqlite

// The store's own VFS (vfs.go) is measured against SQLite's unix VFS by
// building with the tag yirangmq_novfs, which makes Open use the plain
// VFS (defaultTuning): the daemon and the in-process benchmarks alike.
const tagNoVFS = false
