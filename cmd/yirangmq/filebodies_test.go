package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"yirangmq/testenv"
)

// -o sqlite_file_bodies= (and --sqlite-file-bodies) sets the size from
// which the sqlite store keeps a body in STORE/bodies/; 0 keeps every body
// in the database; a bad size fails the mount with a clear message.
func TestSqliteFileBodiesOption(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		opt   string
		files int // of the two messages below, 4 KiB and 16 KiB
	}{
		{"sqlite_file_bodies=8K", 1},
		{"sqlite_file_bodies=4096", 2},
		{"sqlite_file_bodies=0", 0},
	} {
		store, mp := filepath.Join(dir, tc.opt, "store"), filepath.Join(dir, tc.opt, "mnt")
		if err := os.MkdirAll(mp, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { testenv.Unmount(mp) })
		out, err := exec.Command(testenv.Binary(t), store, mp, "-o", "backend=sqlite,"+tc.opt).CombinedOutput()
		if err != nil {
			t.Fatalf("helper call: %v\n%s", err, out)
		}
		if err := os.Mkdir(filepath.Join(mp, "q"), 0o755); err != nil {
			t.Fatal(err)
		}
		bodies := map[string][]byte{"small": bytes.Repeat([]byte("s"), 4<<10), "big": bytes.Repeat([]byte("b"), 16<<10)}
		for name, body := range bodies {
			if err := os.WriteFile(filepath.Join(mp, "q", "inbox", name), body, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ents, err := os.ReadDir(filepath.Join(store, "bodies"))
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != tc.files {
			t.Errorf("%s: %d body files, want %d", tc.opt, len(ents), tc.files)
		}
		for name, body := range bodies {
			if got, err := os.ReadFile(filepath.Join(mp, "q", "inbox", name)); err != nil || !bytes.Equal(got, body) {
				t.Errorf("%s: read %s: %d bytes, %v", tc.opt, name, len(got), err)
			}
		}
		if err := syscall.Unmount(mp, 0); err != nil {
			t.Fatal(err)
		}
		waitStopped(t, filepath.Join(store, "yirangmq.log"))
	}
	r := cli(t, "", "mount", "--store", filepath.Join(dir, "bad"), "-o", "sqlite_file_bodies=big", filepath.Join(dir, "badmnt"))
	if r.code == 0 || !strings.Contains(r.stderr, "--sqlite-file-bodies") {
		t.Errorf("sqlite_file_bodies=big: exit %d, %q", r.code, r.stderr)
	}
}

// -o fs_stage_bodies= (and --fs-stage-bodies) sets the size from which
// the fs store writes a body to a file of its own before its commit
// instead of into its journal; 0 sends every body through the journal; a
// bad size fails the mount with a clear message.
func TestFsStageBodiesOption(t *testing.T) {
	dir := t.TempDir()
	small, big := bytes.Repeat([]byte("s"), 4<<10), bytes.Repeat([]byte("b"), 16<<10)
	for _, tc := range []struct {
		opt                string
		smallJ, bigJ, none bool // in the journal: the small body, the big one; no option
	}{
		{opt: "fs_stage_bodies=8K", smallJ: true},
		{opt: "fs_stage_bodies=4096"},
		{opt: "fs_stage_bodies=0", smallJ: true, bigJ: true},
		{opt: "default", smallJ: true, bigJ: true, none: true}, // 256K
	} {
		store, mp := filepath.Join(dir, tc.opt, "store"), filepath.Join(dir, tc.opt, "mnt")
		if err := os.MkdirAll(mp, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { testenv.Unmount(mp) })
		opts := "backend=fs,sync=full"
		if !tc.none {
			opts += "," + tc.opt
		}
		out, err := exec.Command(testenv.Binary(t), store, mp, "-o", opts).CombinedOutput()
		if err != nil {
			t.Fatalf("helper call: %v\n%s", err, out)
		}
		if err := os.Mkdir(filepath.Join(mp, "q"), 0o755); err != nil {
			t.Fatal(err)
		}
		bodies := map[string][]byte{"small": small, "big": big}
		for name, body := range bodies {
			if err := os.WriteFile(filepath.Join(mp, "q", "inbox", name), body, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		j, err := os.ReadFile(filepath.Join(store, "journal"))
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Contains(j, small); got != tc.smallJ {
			t.Errorf("%s: the journal holds the 4 KiB body: %v, want %v", tc.opt, got, tc.smallJ)
		}
		if got := bytes.Contains(j, big); got != tc.bigJ {
			t.Errorf("%s: the journal holds the 16 KiB body: %v, want %v", tc.opt, got, tc.bigJ)
		}
		for name, body := range bodies {
			if got, err := os.ReadFile(filepath.Join(mp, "q", "inbox", name)); err != nil || !bytes.Equal(got, body) {
				t.Errorf("%s: read %s: %d bytes, %v", tc.opt, name, len(got), err)
			}
			if got, err := os.ReadFile(filepath.Join(store, "queues", "q", "inbox", name)); err != nil || !bytes.Equal(got, body) {
				t.Errorf("%s: the store's file of %s: %d bytes, %v", tc.opt, name, len(got), err)
			}
		}
		if err := syscall.Unmount(mp, 0); err != nil {
			t.Fatal(err)
		}
		waitStopped(t, filepath.Join(store, "yirangmq.log"))
	}
	r := cli(t, "", "mount", "--store", filepath.Join(dir, "bad"), "--backend", "fs", "-o", "fs_stage_bodies=big", filepath.Join(dir, "badmnt"))
	if r.code == 0 || !strings.Contains(r.stderr, "--fs-stage-bodies") {
		t.Errorf("fs_stage_bodies=big: exit %d, %q", r.code, r.stderr)
	}
}
