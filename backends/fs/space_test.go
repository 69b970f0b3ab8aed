package fs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
	"yirangmq/testenv"
)

// A disk filled from outside after a commit: the body file waits (the
// body is read from memory meanwhile), a checkpoint is held rather than
// failing the store, changes go on, and Reclaim finishes both once there
// is room, without a reopen. Nothing is lost across a reopen after that.
func TestFullDiskPutsOffNotFails(t *testing.T) {
	small := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(small, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", small, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID, "size=4m"); err != nil {
		t.Skipf("mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(small, 0) })
	dir := filepath.Join(small, "store")
	log := &logBuffer{}
	s := openTest(t, dir, queuecore.SyncFull, config{}, log)
	ctx := context.Background()
	mustPutQueues(t, s, "q")
	mustApply(t, s, tins(tmsg(1, "q", "one", ready)))

	filler := filepath.Join(small, "filler")
	testenv.FillDisk(t, filler)

	// The journal has room ahead; the body file has none.
	mustApply(t, s, tins(tmsg(2, "q", "two", ready)))
	if err := s.failure(); err != nil {
		t.Fatalf("the store failed on a full disk: %v", err)
	}
	path := s.bodyPath("q", ready, "two")
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("body file of two on a full disk: %v, want it put off", err)
	}
	wantMessage(t, s, tmsg(2, "q", "two", ready), tbody(2))
	// A reader of its body file gets none (it reads from memory), and
	// does not retry the stalled write: every open would take the file
	// lock and the last free bytes.
	s.mu.RLock()
	before := s.progress
	s.mu.RUnlock()
	if f, err := s.BodyFile(ctx, 2); err != nil || f != nil {
		t.Fatalf("BodyFile of two on a full disk = %v, %v; want none, without an error", f, err)
	}
	s.mu.RLock()
	retried := s.progress != before
	s.mu.RUnlock()
	if retried {
		t.Error("BodyFile retried the file operations a full disk stalled")
	}
	// Changes go on in the room the journal has ahead: a lease, an ack.
	leased := tmsg(1, "q", "one", queuecore.StateLeased)
	mustApply(t, s, tupd(leased))
	mustApply(t, s, tdel(1))
	// A checkpoint cannot finish: held, not failed.
	s.mu.Lock()
	s.ckptRunning = true
	s.mu.Unlock()
	if err := s.checkpoint(); !isNoSpace(err) {
		t.Fatalf("checkpoint on a full disk = %v, want ENOSPC", err)
	}
	if err := s.failure(); err != nil || s.held == nil {
		t.Fatalf("after a checkpoint on a full disk: failure %v, held %v", err, s.held != nil)
	}
	// The new journal has no room: a commit fails alone, changing nothing.
	if err := s.Apply(ctx, []queuecore.Op{tins(tmsg(4, "q", "four", ready))}); !isNoSpace(err) {
		t.Fatalf("Apply with no room for its record = %v, want ENOSPC", err)
	}
	wantGone(t, s, 4)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.Reclaim(ctx, false); err != nil {
		t.Fatalf("Reclaim once there is room: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != string(tbody(2)) {
		t.Errorf("body file of two after Reclaim: %q, %v", b, err)
	}
	if s.held != nil || s.ckptRunning || s.stalled {
		t.Errorf("after Reclaim: held %v, checkpoint running %v, stalled %v", s.held != nil, s.ckptRunning, s.stalled)
	}
	if _, err := os.Stat(filepath.Join(dir, oldJournalName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("journal.old after the held checkpoint finished: %v", err)
	}
	mustApply(t, s, tins(tmsg(3, "q", "three", ready)))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, queuecore.SyncFull, config{}, nil)
	wantMessage(t, s, tmsg(2, "q", "two", ready), tbody(2))
	wantMessage(t, s, tmsg(3, "q", "three", ready), tbody(3))
	wantGone(t, s, 1)
}
