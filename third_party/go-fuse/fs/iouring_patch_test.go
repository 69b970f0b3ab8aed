package fs

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The io_uring transport (patch 4 of PATCHES.md). These tests mount real
// filesystems; they need root and a kernel that offers FUSE over io_uring
// (/sys/module/fuse/parameters/enable_uring set to Y). Without one they
// skip, or fail when GOFUSE_REQUIRE_IOURING is set.

func requireIoUring(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root"
	} else if b, err := os.ReadFile("/sys/module/fuse/parameters/enable_uring"); err != nil || strings.TrimSpace(string(b)) != "Y" {
		why = fmt.Sprintf("the kernel does not offer FUSE over io_uring (enable_uring %q, %v)", b, err)
	}
	if why == "" {
		return
	}
	if os.Getenv("GOFUSE_REQUIRE_IOURING") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}

func mountIoUring(t *testing.T, root InodeEmbedder, maxWrite, maxWorkers int) (*fuse.Server, string) {
	t.Helper()
	requireIoUring(t)
	dir := t.TempDir()
	server, err := Mount(dir, root, &Options{MountOptions: fuse.MountOptions{
		Transport:      fuse.TransportIoUring,
		DirectMount:    true,
		MaxWrite:       maxWrite,
		MaxRingWorkers: maxWorkers,
	}})
	if err != nil {
		t.Fatalf("mount with the io_uring transport: %v", err)
	}
	t.Cleanup(func() {
		if err := server.Unmount(); err != nil {
			// The test has failed (requests left unanswered).
			// Its own threads are the clients, stuck in the
			// kernel until the connection ends: abort it, so that
			// this process can exit and report.
			t.Errorf("unmount: %v", err)
			abortMount(t, dir)
		}
	})
	info := server.TransportInfo()
	if info.Transport != fuse.TransportIoUring || info.Queues < 1 {
		t.Fatalf("transport %+v, want io_uring", info)
	}
	return server, dir
}

// abortMount aborts the FUSE connection mounted at dir and detaches it.
func abortMount(t *testing.T, dir string) {
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Log(err)
		return
	}
	for _, line := range strings.Split(string(info), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			_, minor, _ := strings.Cut(f[2], ":")
			if err := os.WriteFile("/sys/fs/fuse/connections/"+minor+"/abort", []byte("1"), 0o200); err != nil {
				t.Log(err)
			}
		}
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		t.Log(err)
	}
}

// TestIoUringLoopback runs everyday operations through a loopback mount
// served over io_uring, checks every byte, and that the requests came
// through the rings.
func TestIoUringLoopback(t *testing.T) {
	backing := t.TempDir()
	root, err := NewLoopbackRoot(backing)
	if err != nil {
		t.Fatal(err)
	}
	server, mnt := mountIoUring(t, root, 1<<20, 0)

	// A file bigger than max_write, written and read back in pieces of
	// various sizes.
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	big := filepath.Join(mnt, "big")
	if err := os.WriteFile(big, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(big)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(data))
	}
	if onDisk, _ := os.ReadFile(filepath.Join(backing, "big")); !bytes.Equal(onDisk, data) {
		t.Fatal("backing file differs from what was written")
	}

	// Names: create, list, rename, unlink, symlink.
	sub := filepath.Join(mnt, "d")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := 0; i < 50; i++ {
		name := fmt.Sprintf("f%02d", i)
		want = append(want, name)
		if err := os.WriteFile(filepath.Join(sub, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(sub)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("listing %v, want %v", names, want)
	}
	if err := os.Rename(filepath.Join(sub, "f00"), filepath.Join(sub, "renamed")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(sub, "renamed")); err != nil || string(b) != "f00" {
		t.Fatalf("renamed file: %q %v", b, err)
	}
	if err := os.Remove(filepath.Join(sub, "f01")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(sub, "f01")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a removed file: %v, want ENOENT", err)
	}
	if err := os.Symlink("renamed", filepath.Join(sub, "link")); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(sub, "link")); err != nil || target != "renamed" {
		t.Fatalf("readlink: %q %v", target, err)
	}

	// An extended attribute: its name comes in the payload and its value
	// goes back in it.
	f02 := filepath.Join(sub, "f02")
	if err := unix.Setxattr(f02, "user.k", []byte("value"), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
		t.Fatal(err)
	} else if err == nil {
		buf := make([]byte, 64)
		n, err := unix.Getxattr(f02, "user.k", buf)
		if err != nil || string(buf[:n]) != "value" {
			t.Fatalf("getxattr: %q %v", buf[:n], err)
		}
	}

	// Notifications still go through /dev/fuse.
	rootInode := root.EmbeddedInode()
	if errno := rootInode.NotifyContent(0, 0); errno != 0 {
		t.Errorf("inode notification: %v", errno)
	}
	if errno := rootInode.NotifyEntry("nonexistent"); errno != 0 && errno != syscall.ENOENT {
		t.Errorf("entry notification: %v", errno)
	}

	if info := server.TransportInfo(); info.RingRequests < 100 {
		t.Errorf("%d requests came through the rings, want most of the hundreds made: %+v", info.RingRequests, info)
	}
}

// blockingFile answers every READ only when its caller gives up (EINTR) or
// release is closed, like a read of a queue that waits for a message.
type blockingFile struct {
	Inode
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	eintr   int
}

var _ = (NodeOpener)((*blockingFile)(nil))
var _ = (NodeReader)((*blockingFile)(nil))

func (f *blockingFile) Open(ctx context.Context, flags uint32) (FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (f *blockingFile) Read(ctx context.Context, fh FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.entered <- struct{}{}
	select {
	case <-ctx.Done():
		f.mu.Lock()
		f.eintr++
		f.mu.Unlock()
		return nil, syscall.EINTR
	case <-f.release:
		return fuse.ReadResultData([]byte("released")), 0
	}
}

// onCPU0 runs f on a thread pinned to CPU 0, so that its requests all
// go to the kernel's queue 0, and returns the thread's id once f started.
func onCPU0(t *testing.T, f func()) (tid int) {
	t.Helper()
	tids := make(chan int)
	go func() {
		runtime.LockOSThread() // the thread ends with the goroutine: its affinity goes with it
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			t.Errorf("pin to CPU 0: %v", err)
		}
		tids <- unix.Gettid()
		f()
	}()
	return <-tids
}

// TestIoUringBlockedReads: reads that wait in the handler take a ring
// entry each, and requests from the same CPU behind them are still
// served (the queue gets more entries); a signal to a waiting reader
// interrupts its read (EINTR), also when the request came through a ring.
func TestIoUringBlockedReads(t *testing.T) {
	block := &blockingFile{entered: make(chan struct{}, 16), release: make(chan struct{})}
	plain := &MemRegularFile{Data: []byte("plain")}
	server, mnt := mountIoUring(t, &testRoot{build: func(ctx context.Context, root *Inode) {
		root.AddChild("block", root.NewPersistentInode(ctx, block, StableAttr{}), false)
		root.AddChild("plain", root.NewPersistentInode(ctx, plain, StableAttr{}), false)
	}}, 128<<10, 0)
	t.Cleanup(func() { close(block.release) }) // before the unmount, which cleans up later

	const readers = 6
	type result struct {
		n   int
		err error
	}
	results := make(chan result, readers)
	var tids []int
	for i := 0; i < readers; i++ {
		tids = append(tids, onCPU0(t, func() {
			fd, err := syscall.Open(filepath.Join(mnt, "block"), syscall.O_RDONLY, 0)
			if err != nil {
				results <- result{err: err}
				return
			}
			defer syscall.Close(fd)
			buf := make([]byte, 64)
			n, err := syscall.Read(fd, buf)
			results <- result{n, err}
		}))
		select {
		case <-block.entered:
		case r := <-results:
			t.Fatalf("read %d returned before it was released: %+v", i, r)
		case <-time.After(20 * time.Second):
			t.Fatalf("read %d never reached the handler (%d readers waiting before it)", i, i)
		}
	}
	// Another request from the same CPU is answered while every reader
	// holds its entry.
	done := make(chan error, 1)
	onCPU0(t, func() {
		b, err := os.ReadFile(filepath.Join(mnt, "plain"))
		if err == nil && string(b) != "plain" {
			err = fmt.Errorf("read %q", b)
		}
		done <- err
	})
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("a read of another file waited behind %d blocked reads: %+v", readers, server.TransportInfo())
	}
	if info := server.TransportInfo(); info.RingWorkers < readers+1 {
		t.Errorf("%d ring entries for %d blocked reads and one more: %+v", info.RingWorkers, readers, info)
	}

	// A signal to each waiting reader's thread: its read ends with EINTR.
	for _, tid := range tids {
		if err := unix.Tgkill(os.Getpid(), tid, unix.SIGURG); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < readers; i++ {
		select {
		case r := <-results:
			if !errors.Is(r.err, syscall.EINTR) {
				t.Errorf("interrupted read: %d bytes, %v; want EINTR", r.n, r.err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d blocked reads did not end after a signal", readers-i, readers)
		}
	}
	block.mu.Lock()
	defer block.mu.Unlock()
	if block.eintr != readers {
		t.Errorf("%d handlers saw their request cancelled, want %d", block.eintr, readers)
	}
}

// testRoot builds its children when the tree is mounted.
type testRoot struct {
	Inode
	build func(ctx context.Context, root *Inode)
}

var _ = (NodeOnAdder)((*testRoot)(nil))

func (r *testRoot) OnAdd(ctx context.Context) { r.build(ctx, &r.Inode) }

// sizeFile records the size of every WRITE and READ it gets.
type sizeFile struct {
	Inode
	mu            sync.Mutex
	data          []byte
	writes, reads []int
}

var _ = (NodeOpener)((*sizeFile)(nil))
var _ = (NodeWriter)((*sizeFile)(nil))
var _ = (NodeReader)((*sizeFile)(nil))
var _ = (NodeGetattrer)((*sizeFile)(nil))

func (f *sizeFile) Open(ctx context.Context, flags uint32) (FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (f *sizeFile) Getattr(ctx context.Context, fh FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	out.Mode = syscall.S_IFREG | 0o644
	out.Size = uint64(len(f.data))
	return 0
}

func (f *sizeFile) Write(ctx context.Context, fh FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, len(data))
	if end := int(off) + len(data); end > len(f.data) {
		f.data = append(f.data, make([]byte, end-len(f.data))...)
	}
	copy(f.data[off:], data)
	return uint32(len(data)), 0
}

func (f *sizeFile) Read(ctx context.Context, fh FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads = append(f.reads, len(dest))
	end := min(int(off)+len(dest), len(f.data))
	if int(off) >= end {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(bytes.Clone(f.data[off:end])), 0
}

// TestIoUringMaxWrite: with max_write 1 MiB a 1 MiB pwrite is one WRITE
// and a 1 MiB pread one READ, through ring entries sized for them.
func TestIoUringMaxWrite(t *testing.T) {
	file := &sizeFile{}
	_, mnt := mountIoUring(t, &testRoot{build: func(ctx context.Context, root *Inode) {
		root.AddChild("f", root.NewPersistentInode(ctx, file, StableAttr{}), false)
	}}, 1<<20, 0)
	data := make([]byte, 1<<20)
	rand.Read(data)
	fd, err := syscall.Open(filepath.Join(mnt, "f"), syscall.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if n, err := syscall.Pwrite(fd, data, 0); err != nil || n != len(data) {
		t.Fatalf("pwrite: %d %v", n, err)
	}
	got := make([]byte, len(data))
	if n, err := syscall.Pread(fd, got, 0); err != nil || n != len(data) || !bytes.Equal(got, data) {
		t.Fatalf("pread: %d bytes, %v, equal %v", n, err, bytes.Equal(got, data))
	}
	file.mu.Lock()
	defer file.mu.Unlock()
	if len(file.writes) != 1 || file.writes[0] != 1<<20 {
		t.Errorf("WRITEs of %v bytes, want one of 1 MiB", file.writes)
	}
	if len(file.reads) != 1 || file.reads[0] != 1<<20 {
		t.Errorf("READs of %v bytes, want one of 1 MiB", file.reads)
	}
}

// TestIoUringBurstOfBlockedReads: many reads that wait, all at once from
// one CPU. The kernel holds back the requests that come while the queue
// has no entry free and hands them only to an entry that commits; the
// transport must get every one of them to a handler all the same.
func TestIoUringBurstOfBlockedReads(t *testing.T) {
	const readers = 40
	block := &blockingFile{entered: make(chan struct{}, readers), release: make(chan struct{})}
	server, mnt := mountIoUring(t, &testRoot{build: func(ctx context.Context, root *Inode) {
		root.AddChild("block", root.NewPersistentInode(ctx, block, StableAttr{}), false)
	}}, 128<<10, 2*readers)
	t.Cleanup(func() {
		select {
		case <-block.release:
		default:
			close(block.release) // a failed test: let the readers go before the unmount
		}
	})
	results := make(chan error, readers)
	start := make(chan struct{})
	for i := 0; i < readers; i++ {
		onCPU0(t, func() {
			<-start
			fd, err := syscall.Open(filepath.Join(mnt, "block"), syscall.O_RDONLY, 0)
			if err != nil {
				results <- err
				return
			}
			defer syscall.Close(fd)
			buf := make([]byte, 64)
			n, err := syscall.Read(fd, buf)
			if err == nil && string(buf[:n]) != "released" {
				err = fmt.Errorf("read %q", buf[:n])
			}
			results <- err
		})
	}
	close(start)
	deadline := time.After(30 * time.Second)
	for i := 0; i < readers; i++ {
		select {
		case <-block.entered:
		case err := <-results:
			t.Fatalf("a read returned before it was released: %v", err)
		case <-deadline:
			t.Fatalf("%d of %d reads reached the handler: %+v", i, readers, server.TransportInfo())
		}
	}
	close(block.release)
	for i := 0; i < readers; i++ {
		select {
		case err := <-results:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d released reads did not return", readers-i, readers)
		}
	}
}
