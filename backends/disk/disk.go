// Package disk is the host's side of the free-space floor that queuecore
// keeps under a store (queuecore.Disk): the statfs(2) of the store's file
// system and the reserve file, preallocated while there is room and given
// back when the disk is short. queuecore decides when space is short;
// this package only does the system calls.
package disk

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// ReserveName is the preallocated file in the store's directory that is
// given back when the disk is short.
const ReserveName = "space.reserve"

// Disk is the file system of a store directory.
type Disk struct {
	dir     string
	reserve string
}

// New watches the file system of dir; the reserve file is dir/space.reserve.
func New(dir string) *Disk {
	return &Disk{dir: dir, reserve: filepath.Join(dir, ReserveName)}
}

// Path is the store directory.
func (d *Disk) Path() string { return d.dir }

// ReservePath is the reserve file.
func (d *Disk) ReservePath() string { return d.reserve }

// Free returns the bytes free to an unprivileged writer and the file
// system's size.
func (d *Disk) Free() (free, total int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.dir, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), int64(st.Blocks) * int64(st.Bsize), nil
}

// Reserve gives the reserve file size bytes of real blocks: fallocate(2),
// or zeros where the file system has no fallocate. On failure the file is
// left empty.
func (d *Disk) Reserve(size int64) error {
	f, err := os.OpenFile(d.reserve, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := fallocate(f, size); err != nil {
		_ = f.Truncate(0)
		return err
	}
	return nil
}

// Release gives the reserve's blocks back to the file system.
func (d *Disk) Release() error {
	if err := os.Truncate(d.reserve, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Reserved is how many bytes of real blocks the reserve file holds (one
// an earlier run made, say).
func (d *Disk) Reserved() int64 {
	fi, err := os.Stat(d.reserve)
	if err != nil || !fi.Mode().IsRegular() {
		return 0
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0
	}
	return min(fi.Size(), st.Blocks*512)
}

func fallocate(f *os.File, size int64) error {
	err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if err == nil || !(errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS)) {
		return err
	}
	buf := make([]byte, 64<<10)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.WriteAt(buf[:min(int64(len(buf)), size-off)], off); err != nil {
			return err
		}
	}
	return f.Sync()
}
