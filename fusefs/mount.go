package fusefs

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// maxWrite is the largest WRITE the kernel sends us, and max_read the
// largest READ it asks for: 1 MiB (256 pages, the kernel's default
// max_pages_limit; go-fuse lowers it to that limit where it is lower).
// A 1 MiB message is then one WRITE instead of eight, each a round trip
// through the daemon, which makes publishing big messages markedly faster
// (docs/performance-history.md, "Big messages"). go-fuse's request buffers are this size,
// one per request being read or served (GOMAXPROCS readers waiting, at
// least 2); their pages are resident only once a big request used them,
// and a WRITE's bytes go to the draft as before, so a client holds no
// more than it did.
const maxWrite = 1 << 20

// Under a memory budget of less than smallBudget (a small device: the
// budget is 3/4 of the cgroup's limit by default), WRITEs and READs are
// 128 KiB at most. The 1 MiB buffers cost RSS that a backlog needs (what
// it gives: docs/performance.md, "Memory"); a 1 MiB message then takes
// eight WRITEs.
const (
	smallBudget   = 128 << 20
	smallMaxWrite = 128 << 10
)

// maxWriteFor is the max_write (and max_read) of a mount with budget
// (bytes of RSS, 0: none).
func maxWriteFor(budget int64) int {
	if smallBudgetFor(budget) {
		return smallMaxWrite
	}
	return maxWrite
}

// smallBudgetFor reports whether a budget is a small device's, whose
// requests are at most smallMaxWrite.
func smallBudgetFor(budget int64) bool { return budget > 0 && budget < smallBudget }

// Server is a mount being served.
type Server struct {
	*fuse.Server
	mountpoint string
}

// Unmount unmounts the filesystem, retrying for a moment while it is busy;
// the server's loops end once the kernel lets go (Wait).
func (s *Server) Unmount() error {
	var err error
	delay := 5 * time.Millisecond
	for try := 0; try < 6; try++ {
		if err = unix.Unmount(s.mountpoint, 0); err == nil || errors.Is(err, unix.EINVAL) {
			return nil // EINVAL: not mounted any more
		}
		time.Sleep(delay)
		delay *= 2
	}
	return fmt.Errorf("unmount %s: %w", s.mountpoint, err)
}

// mountServer mounts root at mountpoint itself and serves it with go-fuse
// through the descriptor ("/dev/fd/N"), then calls started.
//
// Why not fs.Mount: once the mount is up, go-fuse opens and polls a file
// in it from the mounting goroutine (its "poll hack"). That is a system
// call of the daemon into its own mount, and a daemon killed while that
// call waits for its answer can never exit: a FUSE request already read
// by a server thread is waited for uninterruptibly, the waiting thread
// keeps /dev/fuse open, and the kernel aborts the connection only once
// every descriptor of it is closed. The hack exists for servers that open
// files of their own mount through Go's poller; this daemon never touches
// its mount. Serving a descriptor we mounted ourselves skips it.
func mountServer(mountpoint string, root fs.InodeEmbedder, mo fuse.MountOptions, opts *fs.Options, started func()) (*Server, error) {
	var st unix.Stat_t
	if err := unix.Stat(mountpoint, &st); err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("mount %s: open /dev/fuse: %w", mountpoint, err)
	}
	data := []string{
		fmt.Sprintf("fd=%d", fd),
		fmt.Sprintf("rootmode=%o", st.Mode&unix.S_IFMT),
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		fmt.Sprintf("max_read=%d", mo.MaxWrite),
	}
	if mo.AllowOther {
		// The kernel checks permissions (and only then) against the
		// modes and owners we report.
		data = append(data, "allow_other", "default_permissions")
	}
	source := mo.FsName
	if source == "" {
		source = mo.Name
	}
	flags := uintptr(unix.MS_NODEV | unix.MS_NOSUID | unix.MS_NOEXEC)
	if err := unix.Mount(source, mountpoint, "fuse."+mo.Name, flags, strings.Join(data, ",")); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	// go-fuse must not mount, unmount or call into the mount itself.
	mo.DirectMount, mo.DirectMountStrict = false, false
	opts.MountOptions = mo
	raw := uncachedCreates{fs.NewNodeFS(root, opts)}
	server, err := fuse.NewServer(raw, fmt.Sprintf("/dev/fd/%d", fd), &opts.MountOptions)
	if err != nil {
		_ = unix.Unmount(mountpoint, unix.MNT_DETACH)
		unix.Close(fd)
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		_ = unix.Unmount(mountpoint, unix.MNT_DETACH)
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	started()
	return &Server{Server: server, mountpoint: mountpoint}, nil
}

// uncachedCreates answers a CREATE or a LOOKUP that asks for it with
// uncachedEntry with an entry the kernel may not keep, and every CREATE
// with attributes it may not keep.
//
// Where inbox/NAME ends up once its file is closed is decided at the
// commit (it may wait in delayed/, be kept in dlq/, be dropped as a
// duplicate or refused), and the daemon never tells the kernel afterwards
// (see Options.EntryTimeout). Most land in inbox/ under their name, so the
// CREATE of a message lets the kernel keep the name for the entry timeout:
// the lease that follows (`mv inbox/NAME processing/`) then costs no
// LOOKUP of its source. When the commit put it elsewhere or nowhere, the
// kept name is checked like any name the kernel kept from a LOOKUP before
// the message moved: a rename or an unlink names the message by its name
// and state and gets ENOENT; a stat of a refused file gets ENOENT (its
// attributes were not cached); an open gets ESTALE, after which the
// kernel looks the name up again and retries, so that a new publish under
// that name creates a new file. Drafts and editors' temporary files are
// not published at their close: their names are not kept.
type uncachedCreates struct{ fuse.RawFileSystem }

// uncachedEntry is the entry timeout a Lookup sets to be answered with 0
// (go-fuse replaces a 0 with the default timeout).
const uncachedEntry = time.Nanosecond

func (u uncachedCreates) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	st := u.RawFileSystem.Lookup(cancel, h, name, out)
	if st == fuse.OK && out.EntryValid == 0 && out.EntryValidNsec == uint32(uncachedEntry) {
		out.EntryValidNsec = 0
	}
	if st == fuse.OK && out.AttrValid == 0 && out.AttrValidNsec == uint32(uncachedEntry) {
		out.AttrValidNsec = 0
	}
	return st
}

// GetAttr and SetAttr answer attributes that ask for it with uncachedEntry
// (a file being written: its size changes, and where it will be is
// decided at its commit) with a validity of 0.
func (u uncachedCreates) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	st := u.RawFileSystem.GetAttr(cancel, in, out)
	if st == fuse.OK && out.AttrValid == 0 && out.AttrValidNsec == uint32(uncachedEntry) {
		out.AttrValidNsec = 0
	}
	return st
}

func (u uncachedCreates) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	st := u.RawFileSystem.SetAttr(cancel, in, out)
	if st == fuse.OK && out.AttrValid == 0 && out.AttrValidNsec == uint32(uncachedEntry) {
		out.AttrValidNsec = 0
	}
	return st
}

func (u uncachedCreates) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	st := u.RawFileSystem.Create(cancel, in, name, out)
	if st == fuse.OK {
		if out.EntryValid == 0 && out.EntryValidNsec == uint32(uncachedEntry) {
			out.EntryValidNsec = 0
		}
		out.AttrValid, out.AttrValidNsec = 0, 0
	}
	return st
}
