module yirangmq

go 1.26.0

require (
	github.com/coreos/go-systemd/v22 v22.7.0
	github.com/google/btree v1.1.3
	github.com/google/uuid v1.6.0
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/jackc/pgx/v5 v5.12.0
	github.com/mattn/go-sqlite3 v1.14.53
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3
	github.com/spf13/pflag v1.1.0
	golang.org/x/sys v0.49.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// go-fuse v2.12.1 with its splice package fixed for 32-bit Linux (armv7):
// see third_party/go-fuse/PATCHES.md.
replace github.com/hanwen/go-fuse/v2 => ./third_party/go-fuse
