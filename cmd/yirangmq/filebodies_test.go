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

// -o fs_max_messages= (and --fs-max-messages) bounds the messages of an fs
// store: past it a publish fails with EDQUOT and one line in the log; a
// consumer's ack makes room again. The settings of the store's format 1
// (fs_stage_bodies, --fs-spill-at) still mount, with a warning. A bad
// number fails the mount with a clear message.
func TestFsMaxMessagesOption(t *testing.T) {
	dir := t.TempDir()
	store, mp := filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	if err := os.MkdirAll(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.Unmount(mp) })
	t.Setenv("TMPDIR", t.TempDir())
	out, err := exec.Command(testenv.Binary(t), store, mp, "-o", "backend=fs,sync=full,fs_max_messages=3,fs_stage_bodies=8K").CombinedOutput()
	if err != nil {
		t.Fatalf("helper call: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "fs_stage_bodies is ignored") {
		t.Errorf("the old option is not said to be ignored: %q", out)
	}
	// cp reports the error of close(2), where the commit fails.
	r := testenv.Sh(t, mp, `mkdir q
		printf x > "$TMPDIR/x"
		for i in 1 2 3; do cp "$TMPDIR/x" q/inbox/m$i; done
		cp "$TMPDIR/x" q/inbox/m4 2>"$TMPDIR/err" || { cat "$TMPDIR/err"; exit 9; }`)
	if r.Code != 9 || !strings.Contains(r.Stdout, "Disk quota exceeded") {
		t.Errorf("the publish past the limit: exit %d, %q %q (want EDQUOT)", r.Code, r.Stdout, r.Stderr)
	}
	testenv.MustSh(t, mp, `mv q/inbox/m1 q/processing/ && rm q/processing/m1 && printf '{"archive":{"enabled":false}}' > q/.policy
		mv q/inbox/m2 q/processing/ && rm q/processing/m2
		printf y > q/inbox/m5`)
	if err := syscall.Unmount(mp, 0); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, filepath.Join(store, "yirangmq.log"))
	b, _ := os.ReadFile(filepath.Join(store, "yirangmq.log"))
	log := string(b)
	if n := strings.Count(log, "fs store full"); n != 1 {
		t.Errorf("%d lines about the full store, want 1:\n%s", n, log)
	}
	r2 := cli(t, "", "mount", "--store", filepath.Join(dir, "bad"), "--backend", "fs", "-o", "fs_max_messages=x", filepath.Join(dir, "badmnt"))
	if r2.code == 0 || !strings.Contains(r2.stderr, "fs_max_messages") {
		t.Errorf("fs_max_messages=x: exit %d, %q", r2.code, r2.stderr)
	}
}
