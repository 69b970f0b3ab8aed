// Command loopbackd serves a go-fuse loopback (passthrough) mount of a
// directory, with the mount options of yirangmq's daemon (fusefs.Mount):
// the price of FUSE itself, for `mountbench suite`. It is a binary of its
// own so that its memory and CPU are go-fuse's alone.
//
//	loopbackd [--cache-timeout 1s] [--sync-at-flush] BACKING MOUNTPOINT
//
// With --sync-at-flush a file opened for writing is fdatasynced at each
// FLUSH, before the FLUSH is answered: close(2) of a new file returns once
// its bytes are on disk, which is what yirangmq's --sync full promises a
// publisher, through the same FUSE requests (the daemon commits at
// FLUSH). A client's own fdatasync before close would add an FSYNC
// request that a publisher on the queue's mount does not send.
//
// It writes "ready\n" to the descriptor named by $YIRANGMQ_READY_FD once
// the mount serves (the daemon's handshake), and unmounts on SIGTERM or
// SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// fsName is the filesystem type, fuse.NAME in /proc/mounts; mountbench
// detaches dead mounts of this type that a killed run left behind.
const fsName = "yirangmq-bench-loopback"

// readyFDEnv is testenv.ReadyFDEnv (not imported: it would bring the
// test harness, and its memory, into this binary).
const readyFDEnv = "YIRANGMQ_READY_FD"

func main() {
	timeout := flag.Duration("cache-timeout", time.Second, "entry, attribute and negative entry timeout")
	syncAtFlush := flag.Bool("sync-at-flush", false, "fdatasync a file opened for writing at each FLUSH, before answering it")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: loopbackd [--cache-timeout 1s] [--sync-at-flush] BACKING MOUNTPOINT")
		os.Exit(2)
	}
	var root fs.InodeEmbedder
	var err error
	if *syncAtFlush {
		root, err = newSyncRoot(flag.Arg(0))
	} else {
		root, err = fs.NewLoopbackRoot(flag.Arg(0))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopbackd:", err)
		os.Exit(1)
	}
	// fusefs.Mount's options, less its panic handler.
	mo := fuse.MountOptions{
		FsName:           "loopback",
		Name:             fsName,
		DirectMount:      true,
		DirectMountFlags: syscall.MS_NODEV | syscall.MS_NOSUID | syscall.MS_NOEXEC,
		Options:          []string{"nodev", "nosuid", "noexec"},
		MaxBackground:    64,
	}
	server, err := fs.Mount(flag.Arg(1), root, &fs.Options{
		MountOptions:    mo,
		EntryTimeout:    timeout,
		AttrTimeout:     timeout,
		NegativeTimeout: timeout,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "loopbackd: mount:", err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		for range 50 {
			if err := server.Unmount(); err == nil || errors.Is(err, syscall.EINVAL) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	if s := os.Getenv(readyFDEnv); s != "" {
		if fd, err := strconv.Atoi(s); err == nil {
			f := os.NewFile(uintptr(fd), "ready")
			f.Write([]byte("ready\n"))
			f.Close()
		}
		os.Unsetenv(readyFDEnv)
	}
	server.Wait()
}

// syncNode is a loopback node whose files opened for writing sync at
// FLUSH. It wraps the nodes the loopback creates under it
// (NodeWrapChilder), so every directory and file of the mount is one.
type syncNode struct {
	fs.LoopbackNode
}

// newSyncRoot is fs.NewLoopbackRoot with a syncNode as the root.
func newSyncRoot(path string) (fs.InodeEmbedder, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return nil, err
	}
	data := &fs.LoopbackRoot{Path: path, Dev: uint64(st.Dev)}
	root := &syncNode{fs.LoopbackNode{RootData: data}}
	data.RootNode = root
	return root, nil
}

var (
	_ fs.NodeWrapChilder = (*syncNode)(nil)
	_ fs.NodeCreater     = (*syncNode)(nil)
	_ fs.NodeOpener      = (*syncNode)(nil)
)

func (n *syncNode) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if ln, ok := ops.(*fs.LoopbackNode); ok {
		return &syncNode{fs.LoopbackNode{RootData: ln.RootData}}
	}
	return ops
}

func (n *syncNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno == 0 {
		fh = wrapSync(fh)
	}
	return ch, fh, fuseFlags, errno
}

func (n *syncNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno == 0 && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		fh = wrapSync(fh)
	}
	return fh, fuseFlags, errno
}

// syncFile is a loopback file that fdatasyncs at FLUSH. Embedding the
// *fs.LoopbackFile keeps its other methods (read, write, passthrough).
type syncFile struct {
	*fs.LoopbackFile
}

func wrapSync(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &syncFile{lf}
	}
	return fh
}

var _ fs.FileFlusher = (*syncFile)(nil)

func (f *syncFile) Flush(ctx context.Context) syscall.Errno {
	// The descriptor stays open until RELEASE, which the kernel sends
	// after the last FLUSH.
	fd, ok := f.PassthroughFd()
	if !ok {
		return syscall.EBADF
	}
	if err := syscall.Fdatasync(fd); err != nil {
		return fs.ToErrno(err)
	}
	return f.LoopbackFile.Flush(ctx)
}
