//go:build yirangmq_novfs

package sqlite

const tagNoVFS = true
