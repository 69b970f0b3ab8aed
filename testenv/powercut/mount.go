package powercut

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Options change the model; the zero value is the strict one.
type Options struct {
	// GlobalFsync makes every fsync and fdatasync make the whole file
	// system durable, as FS.Sync does.
	GlobalFsync bool
}

// FS is a mounted power-cut file system.
type FS struct {
	t       testing.TB
	dir     string // mountpoint
	backing string
	m       *model
	server  *fuse.Server
}

// Mount mounts a power-cut file system on a fresh directory and returns
// it. The tree starts as a copy of backingDir, all of it durable (regular
// files, directories and user.* xattrs; backingDir may be empty). Each Cut
// and the unmount at the end of the test write the durable tree back to
// backingDir, so that it shows what a disk would hold after the cut.
func Mount(t testing.TB, backingDir string) *FS {
	t.Helper()
	return MountWith(t, backingDir, Options{})
}

// MountWith is Mount with options.
func MountWith(t testing.TB, backingDir string, opts Options) *FS {
	t.Helper()
	m := newModel(opts.GlobalFsync)
	if err := load(m, backingDir); err != nil {
		t.Fatalf("powercut: load %s: %v", backingDir, err)
	}
	f := &FS{t: t, dir: t.TempDir(), backing: backingDir, m: m}
	if err := f.mount(); err != nil {
		t.Fatalf("powercut: %v", err)
	}
	t.Cleanup(func() {
		if f.server == nil {
			return
		}
		if err := f.unmount(); err != nil {
			t.Errorf("powercut: %v", err)
		}
		if err := f.materialize(); err != nil {
			t.Errorf("powercut: %v", err)
		}
	})
	return f
}

// Dir is the mountpoint.
func (f *FS) Dir() string { return f.dir }

func (f *FS) mount() error {
	sec := time.Second
	opts := &gofs.Options{
		EntryTimeout: &sec,
		AttrTimeout:  &sec,
		MountOptions: fuse.MountOptions{
			FsName: "powercut",
			Name:   "powercut",
			// The kernel then asks for security.capability on every
			// write; there is none.
			IgnoreSecurityLabels: true,
			// Locks stay in the kernel (no EnableLocks): every user of
			// the mount runs on this machine.
		},
	}
	root := &node{m: f.m, in: f.m.root}
	server, err := gofs.Mount(f.dir, root, opts)
	if err != nil {
		return fmt.Errorf("mount on %s: %w", f.dir, err)
	}
	f.server = server
	return nil
}

// unmount retries while the mount is busy, then detaches it.
func (f *FS) unmount() error {
	deadline := time.Now().Add(5 * time.Second)
	var err error
	for {
		if err = f.server.Unmount(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			if derr := unix.Unmount(f.dir, unix.MNT_DETACH); derr != nil {
				return fmt.Errorf("unmount %s: %w; lazy unmount: %w", f.dir, err, derr)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.server.Wait()
	f.server = nil
	if err != nil {
		return fmt.Errorf("unmount %s: busy, detached lazily: %w", f.dir, err)
	}
	return nil
}

// Cut is the power cut: it unmounts the file system, drops every change
// that is not durable, writes the durable tree to the backing directory
// and mounts it again at the same place. Every process using the mount
// must be gone (killed) and every file on it closed, or the unmount fails
// the test.
func (f *FS) Cut() {
	f.t.Helper()
	if err := f.unmount(); err != nil {
		f.t.Fatalf("powercut: cut: %v", err)
	}
	f.m.mu.Lock()
	f.m.cut()
	f.m.mu.Unlock()
	if err := f.materialize(); err != nil {
		f.t.Fatalf("powercut: cut: %v", err)
	}
	if err := f.mount(); err != nil {
		f.t.Fatalf("powercut: cut: %v", err)
	}
}

// Sync makes everything durable: what sync(2) or syncfs(2) would do if
// they reached a FUSE daemon.
func (f *FS) Sync() {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	f.m.stats.Syncs++
	f.m.syncAll()
}

// Stats returns the counters and what a cut would drop now.
func (f *FS) Stats() Stats {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	st := f.m.stats
	f.m.volatile(&st)
	return st
}

// load adds the tree at dir, durable, to an empty model. A file with
// several names (hard links) is one inode, as on a disk.
func load(m *model, dir string) error {
	dirs := map[string]*inode{".": m.root}
	files := map[uint64]*inode{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		parent := dirs[filepath.Dir(rel)]
		var in *inode
		switch {
		case d.IsDir():
			in, _ = m.create(parent, d.Name(), syscall.S_IFDIR|uint32(info.Mode().Perm()))
			dirs[rel] = in
		case d.Type().IsRegular():
			st, _ := info.Sys().(*syscall.Stat_t)
			if st != nil && files[st.Ino] != nil {
				m.link(parent, d.Name(), files[st.Ino])
				return nil
			}
			in, _ = m.create(parent, d.Name(), syscall.S_IFREG|uint32(info.Mode().Perm()))
			if st != nil {
				files[st.Ino] = in
			}
			if in.data, err = os.ReadFile(p); err != nil {
				return err
			}
			in.xattr = readXattrs(p)
		default:
			return nil // not modelled
		}
		in.mtime = info.ModTime()
		return nil
	})
	if err != nil {
		return err
	}
	m.syncAll()
	return nil
}

func readXattrs(p string) map[string][]byte {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n == 0 {
		return nil
	}
	out := map[string][]byte{}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		v := make([]byte, 64<<10)
		if k, err := unix.Lgetxattr(p, name, v); err == nil {
			out[name] = v[:k]
		}
	}
	return out
}

// materialize replaces the backing directory's content with the durable
// tree. An inode the durable tree names twice gets hard links, as on a
// disk.
func (f *FS) materialize() error {
	if f.backing == "" {
		return nil
	}
	old, err := os.ReadDir(f.backing)
	if err != nil {
		return fmt.Errorf("materialize: %w", err)
	}
	for _, e := range old {
		if err := os.RemoveAll(filepath.Join(f.backing, e.Name())); err != nil {
			return fmt.Errorf("materialize: %w", err)
		}
	}
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	var errs []error
	written := map[*inode]string{}
	var write func(dir string, in *inode, seen map[*inode]bool)
	write = func(dir string, in *inode, seen map[*inode]bool) {
		for _, name := range slices.Sorted(maps.Keys(in.durEntries)) {
			c := in.durEntries[name]
			p := filepath.Join(dir, name)
			if c.isDir() {
				if seen[c] {
					continue
				}
				seen[c] = true
				errs = append(errs, os.Mkdir(p, fs.FileMode(c.durMode&0o777)|0o700))
				write(p, c, seen)
				continue
			}
			if first, ok := written[c]; ok {
				errs = append(errs, os.Link(first, p))
				continue
			}
			written[c] = p
			errs = append(errs, os.WriteFile(p, c.durData, fs.FileMode(c.durMode&0o777)|0o600))
			for k, v := range c.durXattr {
				if err := unix.Lsetxattr(p, k, v, 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
					errs = append(errs, err)
				}
			}
		}
	}
	write(f.backing, f.m.root, map[*inode]bool{f.m.root: true})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("materialize: %w", err)
	}
	return nil
}
