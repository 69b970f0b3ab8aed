package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentPages maps path and counts its pages in the page cache.
func residentPages(t *testing.T, path string) (resident, total int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	// x/sys/unix of this module has no Mincore.
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	for _, v := range vec {
		if v&1 != 0 {
			resident++
		}
	}
	return resident, len(vec)
}

// A binary copied for a run is read from the disk by the daemons, not
// found in the page cache as the copy left it.
func TestEvictCached(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(src, data, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "bin")
	if err := copyFile(src, dst); err != nil {
		t.Fatal(err)
	}
	if r, n := residentPages(t, dst); r < n/2 {
		t.Skipf("only %d of %d pages of a file just written are in the page cache: nothing to evict here", r, n)
	}
	if err := evictCached(dst); err != nil {
		t.Fatal(err)
	}
	if r, n := residentPages(t, dst); r > n/16 {
		t.Fatalf("%d of %d pages still in the page cache after evictCached, want (nearly) none", r, n)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the file's bytes changed")
	}
}
