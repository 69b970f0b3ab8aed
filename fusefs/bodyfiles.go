package fusefs

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// bodyFileCount bounds the store body files that opens of messages hold
// (readHandle.file): each is a descriptor of the daemon for as long as the
// client keeps its file open, and a client that opens many messages must
// not leave the store without descriptors for its own files (a failed
// body file write fails the fs store until a restart). Past the bound an
// open gets a copy of the body, as every open did before body files were
// read in place.
type bodyFileCount struct {
	n    atomic.Int64
	once sync.Once
	max  int64
}

// maxBodyFilesCap caps the bound on a daemon whose descriptor limit is
// very high.
const maxBodyFilesCap = 16384

// take reserves a place for one body file; false when all are taken.
func (c *bodyFileCount) take() bool {
	c.once.Do(func() {
		// A quarter of the descriptor limit: the rest is for the store,
		// the FUSE device and the files a store opens for a moment.
		var rl unix.Rlimit
		c.max = 256
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur != unix.RLIM_INFINITY {
			c.max = min(int64(rl.Cur/4), maxBodyFilesCap)
		} else if rl.Cur == unix.RLIM_INFINITY {
			c.max = maxBodyFilesCap
		}
	})
	if c.n.Add(1) > c.max {
		c.n.Add(-1)
		return false
	}
	return true
}

// give returns a place taken.
func (c *bodyFileCount) give() { c.n.Add(-1) }
