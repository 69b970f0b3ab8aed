package powercut

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func writeFile(t *testing.T, path string, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func syncDir(t *testing.T, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", dir, err)
	}
}

func wantContent(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s = %q, want %q", path, got, want)
	}
}

func wantMissing(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after the cut: %v, want it gone", path, err)
	}
}

// TestModel: what each kind of sync makes survive a cut.
func TestModel(t *testing.T) {
	f := Mount(t, t.TempDir())
	d := f.Dir()
	// A durable directory to work in.
	if err := os.Mkdir(filepath.Join(d, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(d, "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	syncDir(t, d)
	a, b := filepath.Join(d, "a"), filepath.Join(d, "b")

	// Durable name and content, to be changed without sync.
	writeFile(t, filepath.Join(a, "old"), []byte("old content"), true)
	syncDir(t, a)

	writeFile(t, filepath.Join(a, "nosync"), []byte("volatile"), false)       // name and data volatile
	writeFile(t, filepath.Join(a, "fileonly"), []byte("data synced"), true)   // data durable, name not
	writeFile(t, filepath.Join(a, "empty"), []byte("data not synced"), false) // name durable, data not
	writeFile(t, filepath.Join(a, "both"), []byte("synced twice"), true)      // both durable
	writeFile(t, filepath.Join(a, "moved"), []byte("moved content"), true)    // renamed, target synced
	writeFile(t, filepath.Join(a, "moved2"), []byte("moved2 content"), true)  // renamed, no dir sync
	if err := unix.Setxattr(filepath.Join(a, "both"), "user.yirangmq.id", []byte("42"), 0); err != nil {
		t.Fatal(err)
	}
	f2, err := os.OpenFile(filepath.Join(a, "both"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f2.Sync(); err != nil {
		t.Fatal(err)
	}
	f2.Close()
	syncDir(t, a) // names: old, nosync, fileonly, empty, both, moved, moved2
	writeFile(t, filepath.Join(a, "old"), []byte("new content, not synced"), false)
	if err := os.Rename(filepath.Join(a, "moved"), filepath.Join(b, "moved")); err != nil {
		t.Fatal(err)
	}
	syncDir(t, b)
	if err := os.Rename(filepath.Join(a, "moved2"), filepath.Join(a, "moved2-new")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(a, "late"), []byte("late"), true) // data durable, name not
	if err := os.Remove(filepath.Join(a, "nosync")); err != nil {
		t.Fatal(err)
	}

	st := f.Stats()
	if st.VolatileFiles == 0 || st.VolatileDirs == 0 {
		t.Errorf("stats before the cut: %+v; want volatile files and directories", st)
	}
	t.Logf("before the cut: %+v", st)
	f.Cut()
	t.Logf("after the cut: %+v", f.Stats())

	wantContent(t, filepath.Join(a, "old"), []byte("old content"))
	wantContent(t, filepath.Join(a, "nosync"), nil) // the unlink was not synced; its data never was
	wantContent(t, filepath.Join(a, "fileonly"), []byte("data synced"))
	wantContent(t, filepath.Join(a, "empty"), nil)
	wantContent(t, filepath.Join(a, "both"), []byte("synced twice"))
	buf := make([]byte, 16)
	if n, err := unix.Getxattr(filepath.Join(a, "both"), "user.yirangmq.id", buf); err != nil || string(buf[:n]) != "42" {
		t.Errorf("xattr after the cut: %q, %v", buf[:n], err)
	}
	// Renamed into b, b synced, a not: both names (POSIX allows it; ext4
	// would commit the whole rename).
	wantContent(t, filepath.Join(b, "moved"), []byte("moved content"))
	wantContent(t, filepath.Join(a, "moved"), []byte("moved content"))
	wantContent(t, filepath.Join(a, "moved2"), []byte("moved2 content"))
	wantMissing(t, filepath.Join(a, "moved2-new"))
	wantMissing(t, filepath.Join(a, "late"))

	// The backing directory shows the same.
	wantContent(t, filepath.Join(f.backing, "a", "fileonly"), []byte("data synced"))
}

// TestSpec: the four cases of the issue, one by one.
func TestSpec(t *testing.T) {
	f := Mount(t, t.TempDir())
	d := f.Dir()
	p := filepath.Join(d, "x")

	writeFile(t, p, []byte("no fsync"), false)
	syncDir(t, d)
	f.Cut()
	wantContent(t, p, nil) // write+close without fsync: data gone

	writeFile(t, p, []byte("fsynced"), true)
	f.Cut()
	wantContent(t, p, []byte("fsynced")) // write+fsync: data there

	q := filepath.Join(d, "new")
	writeFile(t, q, []byte("new file"), true)
	f.Cut()
	wantMissing(t, q) // create+fsync(file) without fsync(dir): entry gone

	writeFile(t, q, []byte("renamed"), true)
	if err := os.Rename(q, filepath.Join(d, "renamed")); err != nil {
		t.Fatal(err)
	}
	syncDir(t, d)
	f.Cut()
	wantContent(t, filepath.Join(d, "renamed"), []byte("renamed")) // rename+fsync(dir): new name durable
	wantMissing(t, q)
}

// TestSyncfsDoesNotReachDaemon: syncfs(2) and sync(2) on a FUSE mount make
// nothing durable here, because the kernel does not send them to the
// daemon (FUSE_SYNCFS is for virtiofs only). If this fails, the kernel
// has started to: model it.
func TestSyncfsDoesNotReachDaemon(t *testing.T) {
	f := Mount(t, t.TempDir())
	p := filepath.Join(f.Dir(), "x")
	writeFile(t, p, []byte("data"), false)
	fd, err := unix.Open(f.Dir(), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	unix.Sync()
	if st := f.Stats(); st.VolatileFiles != 1 || st.VolatileDirs != 1 {
		t.Errorf("after syncfs and sync: %+v, want 1 volatile file and directory", st)
	}
	f.Cut()
	wantMissing(t, p)

	writeFile(t, p, []byte("data"), false)
	f.Sync()
	f.Cut()
	wantContent(t, p, []byte("data"))
}

// TestLoad: the backing directory's tree is there, durable.
func TestLoad(t *testing.T) {
	back := t.TempDir()
	if err := os.MkdirAll(filepath.Join(back, "d", "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(back, "d", "e", "f"), []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := Mount(t, back)
	f.Cut()
	wantContent(t, filepath.Join(f.Dir(), "d", "e", "f"), []byte("f"))
}

// TestGlobalFsync: with the option, one fsync makes everything durable.
func TestGlobalFsync(t *testing.T) {
	f := MountWith(t, t.TempDir(), Options{GlobalFsync: true})
	writeFile(t, filepath.Join(f.Dir(), "a"), []byte("a"), false)
	writeFile(t, filepath.Join(f.Dir(), "b"), []byte("b"), true)
	f.Cut()
	wantContent(t, filepath.Join(f.Dir(), "a"), []byte("a"))
}
