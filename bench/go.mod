module yirangmq/bench

go 1.26.0

require (
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/mattn/go-sqlite3 v1.14.53
	github.com/spf13/pflag v1.1.0
	golang.org/x/sys v0.49.0
	gonum.org/v1/plot v0.17.0
	yirangmq v0.0.0
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3 // indirect
	golang.org/x/image v0.30.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// The benchmark tooling is a module of its own so that the product's
// go.mod lists only what the daemon and its tests need: the chart's
// plotting library and its fonts are required here, not there. It builds
// against the checkout it sits in.
replace yirangmq => ..

// As in the product's go.mod: go-fuse with its 32-bit splice fix
// (third_party/go-fuse/PATCHES.md). A replace in a required module does
// not carry over, so it is repeated here.
replace github.com/hanwen/go-fuse/v2 => ../third_party/go-fuse
