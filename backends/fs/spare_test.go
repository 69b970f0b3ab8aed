package fs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// spareInodes waits until DIR/spare holds n files and returns their inodes.
func spareInodes(t *testing.T, dir string, n int) []uint64 {
	t.Helper()
	p := filepath.Join(dir, spareDir)
	deadline := time.Now().Add(10 * time.Second)
	for {
		names, err := readNames(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(names) >= n {
			var inos []uint64
			for _, name := range names {
				var st unix.Stat_t
				if err := unix.Stat(p+"/"+name, &st); err != nil {
					t.Fatal(err)
				}
				if st.Size != 0 || st.Nlink != 1 {
					t.Errorf("spare %s: %d bytes, %d links; want an empty file of one link", name, st.Size, st.Nlink)
				}
				inos = append(inos, st.Ino)
			}
			return inos
		}
		if time.Now().After(deadline) {
			t.Fatalf("DIR/spare holds %d files after 10 s, want %d", len(names), n)
		}
		time.Sleep(5 * time.Millisecond)
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
			if names, err := readNames(filepath.Join(dir, spareDir)); err != nil || len(names) != 0 {
				t.Errorf("DIR/spare after Close: %v, %v; want empty", names, err)
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
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncNormal, config{spares: 2}, nil)
	mustPutQueues(t, s, "q")
	m := tmsg(1, "q", "m", queuecore.StateReady)
	mustApply(t, s, tins(m))
	crash(t, s)
	sp := filepath.Join(dir, spareDir)
	body := s.bodyPath("q", queuecore.StateReady, "m")
	if err := os.Link(body, sp+"/linked"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sp+"/half", []byte("half a body"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, queuecore.SyncNormal, config{spares: 2}, nil)
	for _, name := range []string{"linked", "half"} {
		if _, err := os.Lstat(sp + "/" + name); err == nil {
			t.Errorf("DIR/spare/%s is still there after Open", name)
		}
	}
	wantMessage(t, s, m, tbody(1))
	var st unix.Stat_t
	if err := unix.Stat(body, &st); err != nil || st.Nlink != 1 {
		t.Errorf("body file: %v, %d links; want 1", err, st.Nlink)
	}
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
	sp := filepath.Join(dir, spareDir)
	names, err := readNames(sp)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.Remove(sp + "/" + n); err != nil {
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
