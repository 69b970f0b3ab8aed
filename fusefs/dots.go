package fusefs

import (
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// dots are the "." and ".." entries of a directory listing, so that ls -a
// shows them as on any filesystem. go-fuse passes them to the kernel and
// skips its lookups for them (the kernel ignores their attributes).
func dots(self, parent uint64) []fuse.DirEntry {
	return []fuse.DirEntry{
		{Name: ".", Mode: syscall.S_IFDIR, Ino: self},
		{Name: "..", Mode: syscall.S_IFDIR, Ino: parent},
	}
}
