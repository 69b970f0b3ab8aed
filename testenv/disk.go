package testenv

import (
	"testing"

	"golang.org/x/sys/unix"
)

// FillDisk writes a file at path until its filesystem is full (the last
// write fails, usually with ENOSPC), to play something outside the store
// filling the disk; remove the file to give the space back.
func FillDisk(t testing.TB, path string) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// Large chunks first, then small ones for what is left.
	for _, size := range []int{64 << 10, 4 << 10} {
		chunk := make([]byte, size)
		for {
			if _, err := unix.Write(fd, chunk); err != nil {
				break
			}
		}
	}
}
