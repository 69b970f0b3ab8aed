package membound

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"yirangmq/testenv"
)

// TestFSSpillThroughMount runs the fs store with a spill threshold of 8
// ready messages, so that most of a small backlog lives in the queue's
// spill file, and works on spilled messages through the mount with shell
// tools and syscalls: ls, cat, a publish onto a taken name, a rename in
// inbox/, a lease and an ack; then after a kill -9 and a restart the
// backlog is all there, in order, and drains.
func TestFSSpillThroughMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts)")
	}
	d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: "fs", Sync: "normal", Args: []string{"--fs-spill-at", "8"}})
	t.Cleanup(func() { _ = d.Stop() })
	if err := os.Mkdir(d.Path("q"), 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 200
	var want []string
	for i := range n {
		name := fmt.Sprintf("m%04d", i)
		if err := os.WriteFile(d.Path("q", "inbox", name), []byte("body "+name+"\n"), 0o644); err != nil {
			t.Fatalf("publish %s: %v", name, err)
		}
		want = append(want, name)
	}
	spills, _ := os.ReadDir(d.Store + "/spill")
	if len(spills) != 1 {
		t.Fatalf("the store's spill directory holds %d files after %d publishes past a threshold of 8, want 1", len(spills), n)
	}
	ls := func() []string {
		t.Helper()
		out, err := exec.Command("ls", "-U", d.Path("q", "inbox")).CombinedOutput()
		if err != nil {
			t.Fatalf("ls inbox: %v: %s", err, out)
		}
		names := strings.Fields(string(out))
		slices.Sort(names)
		return names
	}
	if got := ls(); !slices.Equal(got, want) {
		t.Fatalf("ls inbox: %d names %v..., want %d", len(got), got[:min(5, len(got))], n)
	}
	out, err := exec.Command("cat", d.Path("q", "inbox", "m0150")).CombinedOutput()
	if err != nil || string(out) != "body m0150\n" {
		t.Fatalf("cat a spilled message: %q, %v", out, err)
	}
	// A publish onto a spilled name fails with EEXIST.
	f, err := os.OpenFile(d.Path("q", "inbox", "m0151"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err == nil {
		_, err = f.Write([]byte("again\n"))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if !errors.Is(err, syscall.EEXIST) {
		t.Errorf("publish onto a spilled name: %v, want EEXIST", err)
	}
	// Rename in inbox/, lease and ack spilled messages.
	if out, err := exec.Command("mv", d.Path("q", "inbox", "m0152"), d.Path("q", "inbox", "renamed")).CombinedOutput(); err != nil {
		t.Fatalf("mv inbox/m0152 inbox/renamed: %v: %s", err, out)
	}
	if err := os.Rename(d.Path("q", "inbox", "m0153"), d.Path("q", "processing", "m0153")); err != nil {
		t.Fatalf("lease a spilled message: %v", err)
	}
	if out, err := exec.Command("rm", d.Path("q", "processing", "m0153")).CombinedOutput(); err != nil {
		t.Fatalf("ack: %v: %s", err, out)
	}
	want = slices.DeleteFunc(want, func(s string) bool { return s == "m0152" || s == "m0153" })
	want = append(want, "renamed")
	slices.Sort(want)
	if got := ls(); !slices.Equal(got, want) {
		t.Fatalf("ls inbox after rename and ack: %d names, want %d", len(got), len(want))
	}

	// kill -9, restart: the spill is rebuilt from the journal.
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	d.Restart(t)
	if got := ls(); !slices.Equal(got, want) {
		t.Fatalf("ls inbox after kill -9 and restart: %d names, want %d", len(got), len(want))
	}
	if got := stat(t, d)["ready"]; got != int64(len(want)) {
		t.Errorf(".stats ready = %d, want %d", got, len(want))
	}
	// Drain: read, lease and ack every message by name.
	for _, name := range want {
		b, err := os.ReadFile(d.Path("q", "inbox", name))
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		body := "body " + name + "\n"
		if name == "renamed" {
			body = "body m0152\n"
		}
		if string(b) != body {
			t.Errorf("%s holds %q, want %q", name, b, body)
		}
		if err := os.Rename(d.Path("q", "inbox", name), d.Path("q", "processing", name)); err != nil {
			t.Fatalf("lease %s: %v", name, err)
		}
		if err := os.Remove(d.Path("q", "processing", name)); err != nil {
			t.Fatalf("ack %s: %v", name, err)
		}
	}
	if got := ls(); len(got) != 0 {
		t.Errorf("inbox after the drain: %v", got)
	}
	if spills, _ := os.ReadDir(d.Store + "/spill"); len(spills) != 0 {
		t.Errorf("spill files left after the drain: %d", len(spills))
	}
}
