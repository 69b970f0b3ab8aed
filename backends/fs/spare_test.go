package fs

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// spareFiles lists the files of DIR/spare/K (and fails on anything else:
// a file in DIR/spare itself, a directory that is not a number, or more
// than spareDirs of them).
func spareFiles(t *testing.T, dir string) []string {
	t.Helper()
	p := filepath.Join(dir, spareDir)
	subs, err := readNames(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(subs) > spareDirs {
		t.Fatalf("DIR/spare holds %d directories, want at most %d", len(subs), spareDirs)
	}
	var files []string
	for _, sub := range subs {
		fi, err := os.Lstat(p + "/" + sub)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := strconv.ParseUint(sub, 10, 32); err != nil || !fi.IsDir() {
			t.Fatalf("DIR/spare holds %s (%s); want only numbered directories", sub, fi.Mode().Type())
		}
		names, err := readNames(p + "/" + sub)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			files = append(files, p+"/"+sub+"/"+name)
		}
	}
	return files
}

// spareInodes waits until DIR/spare holds n files and returns their inodes.
func spareInodes(t *testing.T, dir string, n int) []uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		files := spareFiles(t, dir)
		if len(files) >= n {
			var inos []uint64
			for _, f := range files {
				var st unix.Stat_t
				if err := unix.Stat(f, &st); err != nil {
					t.Fatal(err)
				}
				if st.Size != 0 || st.Nlink != 1 {
					t.Errorf("spare %s: %d bytes, %d links; want an empty file of one link", f, st.Size, st.Nlink)
				}
				inos = append(inos, st.Ino)
			}
			return inos
		}
		if time.Now().After(deadline) {
			t.Fatalf("DIR/spare holds %d files after 10 s, want %d", len(files), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// crashedWithMessage opens a store with a pool of 2 spares, commits one
// message and crashes it, as kill -9 would (its spares stay).
func crashedWithMessage(t *testing.T) (dir string, s *Store, m queuecore.Message, body string) {
	t.Helper()
	dir = t.TempDir()
	s = openTest(t, dir, queuecore.SyncNormal, config{spares: 2}, nil)
	mustPutQueues(t, s, "q")
	m = tmsg(1, "q", "m", queuecore.StateReady)
	mustApply(t, s, tins(m))
	crash(t, s)
	return dir, s, m, s.bodyPath("q", queuecore.StateReady, "m")
}

// wantWholeBody checks that m (crashedWithMessage's) reads back whole and
// that its body file has one link: what Open removed was only a name.
func wantWholeBody(t *testing.T, s *Store, m queuecore.Message, body string) {
	t.Helper()
	wantMessage(t, s, m, tbody(1))
	var st unix.Stat_t
	if err := unix.Stat(body, &st); err != nil || st.Nlink != 1 {
		t.Errorf("body file: %v, %d links; want 1", err, st.Nlink)
	}
}

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// A new body goes into a spare file made ahead, which leaves DIR/spare; the
// pool fills up again, and Close removes what is left.
func TestSparesUsedForBodies(t *testing.T) {
	for _, sync := range []queuecore.SyncMode{queuecore.SyncNormal, queuecore.SyncFull} {
		t.Run(sync.String(), func(t *testing.T) {
			dir := t.TempDir()
			s := openTest(t, dir, sync, config{spares: 4}, nil)
			mustPutQueues(t, s, "q")
			spares := spareInodes(t, dir, 4)
			var bodies []uint64
			for id := uint64(1); id <= 3; id++ {
				m := tmsg(id, "q", "m"+string(rune('0'+id)), queuecore.StateReady)
				mustApply(t, s, tins(m))
				wantMessage(t, s, m, tbody(id))
				p := s.bodyPath("q", queuecore.StateReady, m.Name)
				got, err := os.ReadFile(p)
				if err != nil || string(got) != string(tbody(id)) {
					t.Fatalf("body file %s = %q, %v; want %q", p, got, err, tbody(id))
				}
				bodies = append(bodies, ino(t, p))
				if id == 1 {
					// The spare's old name goes with the next
					// checkpoint's sync of its directory.
					s.dirty.mu.Lock()
					var noted []string
					for _, sub := range s.spares.subs {
						if _, ok := s.dirty.dirs[sub]; ok {
							noted = append(noted, sub)
						}
					}
					s.dirty.mu.Unlock()
					if len(noted) != 1 {
						t.Errorf("spare directories noted for the checkpoint's sync after one body: %v, want one", noted)
					}
				}
			}
			for _, b := range bodies {
				if !slices.Contains(spares, b) {
					t.Errorf("body file inode %d is not one of the spares %v", b, spares)
				}
			}
			for _, n := range spareInodes(t, dir, 4) {
				if slices.Contains(bodies, n) {
					t.Errorf("inode %d is a body and a spare", n)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if files := spareFiles(t, dir); len(files) != 0 {
				t.Errorf("DIR/spare after Close: %v; want no files", files)
			}
		})
	}
}

// Without a pool (or with it empty) a body file is created in place, as
// before.
func TestSparesNone(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncNormal, config{spares: -1}, nil)
	mustPutQueues(t, s, "q")
	m := tmsg(1, "q", "m", queuecore.StateReady)
	mustApply(t, s, tins(m))
	wantMessage(t, s, m, tbody(1))
	wantTree(t, dir, "q/inbox/m")
	if _, err := os.Lstat(filepath.Join(dir, spareDir)); err == nil {
		t.Error("DIR/spare exists without a pool")
	}
}

// What a killed process left in DIR/spare is removed at Open, name by
// name: a spare renamed into place whose old name a power cut kept is a
// second link to the body, which stays whole.
func TestSparesLeftAtOpen(t *testing.T) {
	dir, s, m, body := crashedWithMessage(t)
	subs := s.spares.subs
	sp := filepath.Join(dir, spareDir)
	// A second link kept by a power cut, a half-written spare, and a
	// spare of a version that kept them in DIR/spare itself.
	left := []string{subs[3] + "/linked", subs[5] + "/half", sp + "/7"}
	if err := os.Link(body, left[0]); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(left[1], []byte("half a body"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(left[2], nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, queuecore.SyncNormal, config{spares: 2}, nil)
	for _, p := range left {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s is still there after Open", p)
		}
	}
	got, want := s.spares.subs, subs
	slices.Sort(got[:])
	slices.Sort(want[:])
	if got != want {
		t.Errorf("spare directories after Open %v, want those of the last run %v", got, want)
	}
	wantWholeBody(t, s, m, body)
	spareInodes(t, dir, 2)
}

// A spare that cannot become a body for a reason other than space (here:
// removed by hand) turns the pool off; the body is written in place.
func TestSparesFailedFallsBack(t *testing.T) {
	dir := t.TempDir()
	var log logBuffer
	s := openTest(t, dir, queuecore.SyncNormal, config{spares: 2}, &log)
	mustPutQueues(t, s, "q")
	spareInodes(t, dir, 2)
	for _, f := range spareFiles(t, dir) {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	for id := uint64(1); id <= 3; id++ {
		m := tmsg(id, "q", "m"+string(rune('0'+id)), queuecore.StateReady)
		mustApply(t, s, tins(m))
		wantMessage(t, s, m, tbody(id))
	}
	wantTree(t, dir, "q/inbox/m1", "q/inbox/m2", "q/inbox/m3")
	if !strings.Contains(log.String(), "spare body files turned off") {
		t.Errorf("no log line about the pool turned off:\n%s", log.String())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// The spares are spread over DIR/spare/K in turn, and on ext4
// DIR/spare is marked so that the kernel places those directories in
// block groups apart (chattr +T), where the inodes that acks free are
// looked at by later creates.
func TestSparesSpread(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncNormal, config{spares: spareDirs}, nil)
	mustPutQueues(t, s, "q")
	spareInodes(t, dir, spareDirs)
	used := map[string]bool{}
	for _, f := range spareFiles(t, dir) {
		used[filepath.Base(filepath.Dir(f))] = true
	}
	if len(used) != spareDirs {
		t.Errorf("%d spares in %d directories, want one in each of %d", spareDirs, len(used), spareDirs)
	}
	var fsst unix.Statfs_t
	if err := unix.Statfs(dir, &fsst); err != nil {
		t.Fatal(err)
	}
	if fsst.Type != unix.EXT4_SUPER_MAGIC {
		t.Logf("%s is not on ext4 (magic %#x): the directory's flag is not checked", dir, fsst.Type)
		return
	}
	fd, err := unix.Open(filepath.Join(dir, spareDir), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatal(err)
	}
	if flags&fsTopdirFL == 0 {
		t.Errorf("DIR/spare flags %#x: no FS_TOPDIR_FL", flags)
	}
}

// The layout of the version before spare directories (spare/N files) is
// removed at Open, a second link to a body by unlink only; directories
// made by hand stay with what they hold.
func TestSparesOldLayout(t *testing.T) {
	dir, _, m, body := crashedWithMessage(t)
	sp := filepath.Join(dir, spareDir)
	if err := os.RemoveAll(sp); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{sp, sp + "/mine", sp + "/123/456"} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(body, sp+"/7"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{sp + "/12", sp + "/mine/keep"} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := openTest(t, dir, queuecore.SyncNormal, config{spares: 2}, nil)
	for _, p := range []string{sp + "/7", sp + "/12"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s is still there after Open", p)
		}
	}
	for _, p := range []string{sp + "/mine/keep", sp + "/123/456"} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s made by hand: %v; want it left alone", p, err)
		}
	}
	wantWholeBody(t, s, m, body)
	var subs int
	for _, sub := range s.spares.subs {
		if fi, err := os.Lstat(sub); err == nil && fi.IsDir() {
			subs++
		}
	}
	if subs != spareDirs {
		t.Errorf("%d spare directories after Open, want %d", subs, spareDirs)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
