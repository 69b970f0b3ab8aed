package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dirtyPages maps path and counts its pages that are in the page cache
// and those of them that are dirty (PG_dirty: written, not yet on the
// disk), from /proc/self/pagemap and /proc/kpageflags (root only).
func dirtyPages(t *testing.T, path string) (resident, dirty int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(data)
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Fatal(err)
	}
	defer pagemap.Close()
	kpageflags, err := os.Open("/proc/kpageflags")
	if err != nil {
		t.Fatal(err)
	}
	defer kpageflags.Close()
	const kpfDirty = 4 // include/uapi/linux/kernel-page-flags.h
	page := os.Getpagesize()
	var e [8]byte
	var sum byte
	for off := 0; off < len(data); off += page {
		sum += data[off] // map the page (it is in the page cache: just written)
		addr := uint64(uintptr(unsafe.Pointer(&data[off])))
		if _, err := pagemap.ReadAt(e[:], int64(addr/uint64(page)*8)); err != nil {
			t.Fatal(err)
		}
		v := binary.LittleEndian.Uint64(e[:])
		if v>>63 == 0 {
			continue
		}
		pfn := v & (1<<55 - 1)
		if pfn == 0 {
			t.Skip("/proc/self/pagemap hides page frames (not root)")
		}
		if _, err := kpageflags.ReadAt(e[:], int64(pfn*8)); err != nil {
			t.Fatal(err)
		}
		resident++
		if binary.LittleEndian.Uint64(e[:])>>kpfDirty&1 == 1 {
			dirty++
		}
	}
	pageSink = sum
	return resident, dirty
}

// pageSink keeps dirtyPages' reads of the mapping, which fault its pages
// in, from being compiled away.
var pageSink byte

// TestLoopbackSyncAtFlush: the loopback the --sync full publishes are
// compared with (loopbackd --sync-at-flush) has the published bytes on
// the disk when close(2) returns, with no fsync of the client's; the
// plain loopback leaves them dirty in the page cache. Both take a lease
// (rename) and an ack (unlink) and read the bytes back.
func TestLoopbackSyncAtFlush(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a FUSE mount, and page frames in /proc/self/pagemap")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin, err := buildLoopback(context.Background(), root, dir)
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB, 16 pages
	for _, sync := range []bool{true, false} {
		sub := filepath.Join(dir, fmt.Sprintf("sync-%v", sync))
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		d, err := startLoopback(bin, sub, time.Second, sync)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.stop() })
		q := queueDirs{inbox: filepath.Join(d.mnt, "inbox"), processing: filepath.Join(d.mnt, "processing")}
		for _, p := range []string{q.inbox, q.processing} {
			if err := unix.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		var resident, dirty int
		for i := range 5 {
			name := msgName("s", 0, i)
			if err := q.do(opPublish, name, body, -1, -1); err != nil {
				t.Fatalf("sync %v: publish: %v", sync, err)
			}
			r, dt := dirtyPages(t, filepath.Join(d.store, "inbox", name))
			resident += r
			dirty += dt
			if err := q.do(opLease, name, nil, -1, -1); err != nil {
				t.Fatalf("sync %v: lease: %v", sync, err)
			}
			buf := make([]byte, len(body))
			if err := readBack(filepath.Join(q.processing, name), buf, body); err != nil {
				t.Fatalf("sync %v: read back: %v", sync, err)
			}
			if err := q.do(opAck, name, nil, -1, -1); err != nil {
				t.Fatalf("sync %v: ack: %v", sync, err)
			}
		}
		if left, _ := os.ReadDir(filepath.Join(d.store, "processing")); len(left) != 0 {
			t.Errorf("sync %v: %d files left in processing/ after the acks", sync, len(left))
		}
		if resident == 0 {
			t.Fatalf("sync %v: no page of the published files in the page cache", sync)
		}
		switch {
		case sync && dirty > 0:
			t.Errorf("--sync-at-flush: %d of %d pages of the published files still dirty after close(2)", dirty, resident)
		case !sync && dirty == 0:
			// The control: without the flag close(2) does not wait for
			// the disk. Somebody's sync(2) in between can clean them.
			t.Logf("plain loopback: no dirty page after close(2) (%d resident): written back meanwhile", resident)
		}
		t.Logf("sync-at-flush %v: %d of %d pages dirty after close(2)", sync, dirty, resident)
		if err := d.stop(); err != nil {
			t.Fatal(err)
		}
	}
}
