package fs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"yirangmq/queuecore"
)

// stagedNames lists DIR/staged.
func stagedNames(t *testing.T, dir string) []string {
	t.Helper()
	names, err := readNames(filepath.Join(dir, stagedDir))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// journalHolds says whether the journal files of dir hold b.
func journalHolds(t *testing.T, dir string, b []byte) bool {
	t.Helper()
	for _, name := range []string{journalName, oldJournalName} {
		j, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if bytes.Contains(j, b) {
			return true
		}
	}
	return false
}

// TestStagedBodies: in SyncFull a body of stageAt bytes or more is synced
// to DIR/staged before its record, which holds its size and CRC instead of
// its bytes, and is then renamed where its message is; in SyncNormal it
// goes through the journal as before.
func TestStagedBodies(t *testing.T) {
	ctx := context.Background()
	cfg := config{stageAt: 8} // tbody's bodies are 18 bytes or more
	for _, mode := range []queuecore.SyncMode{queuecore.SyncFull, queuecore.SyncStrict, queuecore.SyncNormal} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			s := openTest(t, dir, mode, cfg, nil)
			mustPutQueues(t, s, "q")
			m := tmsg(1, "q", "m", ready)
			synced := s.fsyncs.Load()
			mustApply(t, s, tins(m))
			wantMessage(t, s, m, tbody(1))
			if got, err := os.ReadFile(s.bodyPath("q", ready, "m")); err != nil || !bytes.Equal(got, tbody(1)) {
				t.Fatalf("inbox/m holds %q (%v)", got, err)
			}
			if id, ok := readOwner(s.bodyPath("q", ready, "m")); !ok || id != 1 {
				t.Errorf("inbox/m's ID xattr = %d, %v; want 1", id, ok)
			}
			staged := mode.Durable()
			// The staged name stays, a second link to the body, until a
			// checkpoint has synced inbox/.
			wantStaged := []string{}
			if staged {
				wantStaged = []string{"1"}
				var a, b unix.Stat_t
				if err := unix.Stat(s.bodyPath("q", ready, "m"), &a); err != nil {
					t.Fatal(err)
				}
				if err := unix.Stat(s.stagedPath(1), &b); err != nil || a.Ino != b.Ino || a.Nlink != 2 {
					t.Errorf("staged/1 is not a second link to inbox/m: %v, inodes %d and %d, %d links", err, a.Ino, b.Ino, a.Nlink)
				}
			}
			if n := stagedNames(t, dir); !slices.Equal(n, wantStaged) {
				t.Errorf("DIR/staged holds %v after the commit, want %v", n, wantStaged)
			}
			if inJournal := journalHolds(t, dir, tbody(1)); inJournal == staged {
				t.Errorf("the journal holds the body: %v; want %v (staged: %v)", inJournal, !staged, staged)
			}
			// File, directory, journal: three syncs, against one.
			wantSyncs := int64(1)
			if staged {
				wantSyncs = 2 // the file's fsync and the journal's (the directory's is not counted)
			}
			if mode == queuecore.SyncNormal {
				wantSyncs = 0
			}
			if got := s.fsyncs.Load() - synced; got != wantSyncs {
				t.Errorf("syncs counted for one publish = %d, want %d", got, wantSyncs)
			}
			// A batch that fails stages nothing it leaves behind.
			if err := s.Apply(ctx, []queuecore.Op{tins(tmsg(2, "q", "m", ready))}); !errors.Is(err, queuecore.ErrExists) {
				t.Fatalf("insert of a taken name = %v, want ErrExists", err)
			}
			if n := stagedNames(t, dir); !slices.Equal(n, wantStaged) {
				t.Errorf("DIR/staged holds %v after a failed commit, want %v", n, wantStaged)
			}
			// Small bodies still go through the journal.
			small := queuecore.Op{Kind: queuecore.OpInsert, Msg: tmsg(3, "q", "small", ready), Body: []byte("tiny")}
			small.Msg.Size = 4
			mustApply(t, s, small)
			if !journalHolds(t, dir, []byte("tiny")) {
				t.Errorf("the journal lacks a body smaller than stageAt")
			}
			if err := s.Close(); err != nil { // a checkpoint
				t.Fatal(err)
			}
			if n := stagedNames(t, dir); len(n) != 0 {
				t.Errorf("DIR/staged holds %v after a checkpoint", n)
			}
			s = openTest(t, dir, mode, cfg, nil)
			wantMessage(t, s, m, tbody(1))
		})
	}
}

// TestStagedBodiesAfterCrash: what a crash leaves of staged bodies is put
// right at Open: a body still in DIR/staged goes where its message is, a
// damaged file of the message is replaced by its staged copy, a move after
// the placement that the crash cut off is redone, a record whose staged
// body is not there (its name was not durable at a power cut) ends the
// replay with everything after it, and what is left in DIR/staged is
// removed once that is durable.
func TestStagedBodiesAfterCrash(t *testing.T) {
	dir := t.TempDir()
	q := filepath.Join(dir, queuesDir)
	staged := filepath.Join(dir, stagedDir)
	cfg := config{stageAt: 8}
	s := openTest(t, dir, queuecore.SyncFull, cfg, nil)
	mustPutQueues(t, s, "a")
	n1, n2, n3, n4 := tmsg(11, "a", "n1", ready), tmsg(12, "a", "n2", ready), tmsg(13, "a", "n3", ready), tmsg(14, "a", "n4", ready)
	n5, n6 := tmsg(15, "a", "n5", ready), tmsg(16, "a", "n6", ready)
	mustApply(t, s, tins(n1), tins(n5), tins(n6))
	mustApply(t, s, tins(n3))
	mustApply(t, s, tins(n4))
	leasedN3 := tleased(n3)
	mustApply(t, s, tupd(leasedN3))
	n4copy := filepath.Join(t.TempDir(), "n4")
	copyWithXattr(t, filepath.Join(q, "a/inbox/n4"), n4copy)
	leasedN5 := tleased(n5)
	mustApply(t, s, tins(n2), tupd(leasedN5)) // the last batch
	mustApply(t, s, tdel(11))                 // and one after it
	crash(t, s)

	// inbox/n1 is gone (its delete ran): the cut undoes the delete, and
	// its body is still staged.
	mv(t, filepath.Join(q, "a/processing/n3"), filepath.Join(q, "a/inbox/n3")) // lease not moved
	mv(t, n4copy, filepath.Join(staged, "14"))                                 // a staged copy of its own,
	write(t, filepath.Join(q, "a/inbox/n4"), "garbage")                        // and the placed file damaged (keeps its xattr)
	rm(t, filepath.Join(staged, "16"))                                         // a hand: n6 is in place all the same
	rm(t, filepath.Join(staged, "12"))                                         // n2's staged name not durable, so its commit
	rm(t, filepath.Join(q, "a/inbox/n2"))                                      // never returned: nor was it placed
	write(t, filepath.Join(staged, "999"), "staged, never committed")

	log := &logBuffer{}
	s = openTest(t, dir, queuecore.SyncFull, cfg, log)
	t.Logf("repair log:\n%s", log)
	wantMessage(t, s, n1, tbody(11)) // its delete came after the cut
	wantGone(t, s, 12)
	wantMessage(t, s, leasedN3, tbody(13))
	wantMessage(t, s, n4, tbody(14))
	wantMessage(t, s, n5, tbody(15)) // its lease was in the batch cut short
	wantMessage(t, s, n6, tbody(16)) // its record is not taken for a cut
	wantTree(t, dir, "a/inbox/n1", "a/processing/n3", "a/inbox/n4", "a/inbox/n5", "a/inbox/n6")
	if n := stagedNames(t, dir); len(n) != 0 {
		t.Errorf("DIR/staged holds %v after Open", n)
	}
	for _, want := range []string{"linked a staged body", "cut short", "moved a body", "emptied the staged bodies"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the repair log lacks %q", want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	log.reset()
	s = openTest(t, dir, queuecore.SyncFull, cfg, log)
	if strings.Contains(log.String(), "repaired") || strings.Contains(log.String(), "staged") {
		t.Errorf("a second open repaired again:\n%s", log)
	}
	wantMessage(t, s, n1, tbody(11))
}

// TestStagedBodyRead: until its placement, a staged body is read from
// DIR/staged, by Body and by BodyFile.
func TestStagedBodyRead(t *testing.T) {
	ctx := context.Background()
	hold := make(chan struct{})
	held := make(chan struct{})
	first := true
	cfg := config{stageAt: 8, beforeFileOps: func() {
		if first {
			first = false
			close(held)
			<-hold
		}
	}}
	s := openTest(t, t.TempDir(), queuecore.SyncFull, cfg, nil)
	first = false
	mustPutQueues(t, s, "q")
	first = true
	done := make(chan error, 1)
	go func() { done <- s.Apply(ctx, []queuecore.Op{tins(tmsg(1, "q", "m", ready))}) }()
	<-held
	if _, err := os.Stat(s.stagedPath(1)); err != nil {
		t.Errorf("the staged file before its placement: %v", err)
	}
	b, err := s.Body(ctx, 1)
	if err != nil || !bytes.Equal(b, tbody(1)) {
		t.Errorf("Body before the placement = %q, %v", b, err)
	}
	f, err := s.BodyFile(ctx, 1)
	if err != nil || f == nil {
		close(hold)
		t.Fatalf("BodyFile before the placement = %v, %v", f, err)
	}
	if got := readAllFile(t, f); !bytes.Equal(got, tbody(1)) {
		t.Errorf("BodyFile before the placement reads %q", got)
	}
	f.Close()
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wantMessage(t, s, tmsg(1, "q", "m", ready), tbody(1))
}

// TestStagedCutInOldJournal: a record of journal.old whose staged body is
// nowhere ends the replay there, and the newer journal's records, all
// written after it, go with it.
func TestStagedCutInOldJournal(t *testing.T) {
	dir := t.TempDir()
	cfg := config{stageAt: 8}
	s := openTest(t, dir, queuecore.SyncFull, cfg, nil)
	mustPutQueues(t, s, "a")
	a, b := tmsg(1, "a", "a", ready), tmsg(2, "a", "b", ready)
	mustApply(t, s, tins(a))
	mustApply(t, s, tins(b))
	lsn := s.lsn
	crash(t, s)
	// As a rotation leaves it: journal.old, and a newer journal with one
	// more record (c, not staged).
	mv(t, filepath.Join(dir, journalName), filepath.Join(dir, oldJournalName))
	c := queuecore.Op{Kind: queuecore.OpInsert, Msg: tmsg(3, "a", "c", ready), Body: []byte("c")}
	c.Msg.Size = 1
	frame, _ := encodeApplyRecord(lsn+1, []queuecore.Op{c}, nil)
	write(t, filepath.Join(dir, journalName), string(frame))
	// b's staged name and its placed file are not there: b's commit was
	// cut short, and so was everything after it.
	rm(t, filepath.Join(dir, stagedDir, "2"))
	rm(t, filepath.Join(dir, queuesDir, "a/inbox/b"))

	log := &logBuffer{}
	s = openTest(t, dir, queuecore.SyncFull, cfg, log)
	wantMessage(t, s, a, tbody(1))
	wantGone(t, s, 2)
	wantGone(t, s, 3)
	wantTree(t, dir, "a/inbox/a")
	for _, want := range []string{"cut short", "emptied the journal after a commit cut short"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the open's log lacks %q:\n%s", want, log)
		}
	}
}
