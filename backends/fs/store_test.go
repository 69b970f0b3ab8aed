package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/backends"
	"yirangmq/queuecore"
	"yirangmq/testenv"
)

const (
	ready    = queuecore.StateReady
	leased   = queuecore.StateLeased
	delayed  = queuecore.StateDelayed
	dead     = queuecore.StateDead
	archived = queuecore.StateArchived
)

// TestTornTail: a record cut short by a crash or one that fails its CRC is
// ignored, and so are the zeros the journal is extended with; what came
// before is there, and the store takes commits again.
func TestTornTail(t *testing.T) {
	m1, m2, m3 := tmsg(1, "q", "one", ready), tmsg(2, "q", "two", ready), tmsg(3, "q", "three", ready)
	frame3, _ := encodeApplyRecord(4, []queuecore.Op{tins(m3)}, nil)
	cases := []struct {
		name     string
		damage   func(t *testing.T, f *os.File, end int64) // end: where the records end
		wantTorn bool
		want2    bool // m2's record survives
	}{
		{"half a record", func(t *testing.T, f *os.File, end int64) {
			writeAt(t, f, frame3[:len(frame3)/2], end)
		}, true, true},
		{"only part of a header", func(t *testing.T, f *os.File, end int64) {
			writeAt(t, f, []byte("#0000"), end)
		}, true, true},
		{"a header and no payload", func(t *testing.T, f *os.File, end int64) {
			writeAt(t, f, frame3[:frameHeaderLen], end)
		}, true, true},
		{"a whole record with a bad CRC", func(t *testing.T, f *os.File, end int64) {
			bad := bytes.Clone(frame3)
			bad[len(bad)-2] ^= 0x55 // a byte of the body
			writeAt(t, f, bad, end)
		}, true, true},
		{"the last record's body damaged", func(t *testing.T, f *os.File, end int64) {
			var b [1]byte
			if _, err := f.ReadAt(b[:], end-3); err != nil {
				t.Fatal(err)
			}
			writeAt(t, f, []byte{b[0] ^ 1}, end-3)
		}, true, false},
		{"a file that ends one byte short of a record", func(t *testing.T, f *os.File, end int64) {
			if err := f.Truncate(end); err != nil {
				t.Fatal(err)
			}
			writeAt(t, f, frame3[:len(frame3)-1], end)
		}, true, true},
		{"nothing: the zeros ahead of the records", func(t *testing.T, f *os.File, end int64) {}, false, true},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			dir := t.TempDir()
			log := &logBuffer{}
			s := openTest(t, dir, queuecore.SyncFull, config{}, log)
			mustPutQueues(t, s, "q")
			mustApply(t, s, tins(m1))
			mustApply(t, s, tins(m2))
			end := s.cur.Load().size
			crash(t, s)
			jpath := filepath.Join(dir, journalName)
			f, err := os.OpenFile(jpath, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			c.damage(t, f, end)
			f.Close()

			log.reset()
			s = openTest(t, dir, queuecore.SyncFull, config{}, log)
			if got := strings.Contains(log.String(), "torn tail"); got != c.wantTorn {
				t.Errorf("torn tail logged: %v, want %v; log:\n%s", got, c.wantTorn, log)
			}
			wantMessage(t, s, m1, tbody(1))
			if c.want2 {
				wantMessage(t, s, m2, tbody(2))
			} else {
				wantGone(t, s, 2)
				wantTree(t, dir, "q/inbox/one")
			}
			wantGone(t, s, 3)
			if n := fileSize(t, jpath); n != 0 {
				t.Errorf("journal after recovery holds %d bytes, want 0 (checkpointed)", n)
			}
			// The store goes on, and what it takes now survives too.
			mustApply(t, s, tins(m3))
			crash(t, s)
			s = openTest(t, dir, queuecore.SyncFull, config{}, nil)
			wantMessage(t, s, m3, tbody(3))
			wantMessage(t, s, m1, tbody(1))
		})
	}
}

func writeAt(t *testing.T, f *os.File, b []byte, off int64) {
	t.Helper()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileAfterCrash: a crash between a record becoming durable and
// its file operations leaves the tree behind the metadata in every way a
// crash can; Open repairs each and logs it.
func TestReconcileAfterCrash(t *testing.T) {
	dir := t.TempDir()
	q := filepath.Join(dir, queuesDir)
	s := openTest(t, dir, queuecore.SyncFull, config{}, nil)
	mustPutQueues(t, s, "a", "b")
	p1, p2, p3, p4 := tmsg(1, "a", "p1", ready), tmsg(2, "a", "p2", ready), tmsg(3, "a", "p3", dead), tmsg(4, "a", "p4", ready)
	p5 := tmsg(5, "a", "p5", ready)
	mustApply(t, s, tins(p1), tins(p2), tins(p3), tins(p4), tins(p5))
	if err := s.Close(); err != nil { // a checkpoint: p1-p5 are in the snapshot, not the journal
		t.Fatal(err)
	}

	s = openTest(t, dir, queuecore.SyncFull, config{}, nil)
	n1, n2 := tmsg(11, "a", "n1", ready), tmsg(12, "a", "n2", ready)
	mustApply(t, s, tins(n1))
	mustApply(t, s, tins(n2))
	leasedP1 := tleased(p1)
	mustApply(t, s, tupd(leasedP1))
	p2copy := filepath.Join(t.TempDir(), "p2")
	copyWithXattr(t, filepath.Join(q, "a/inbox/p2"), p2copy)
	mustApply(t, s, tdel(2))
	// p4 is archived and n5 takes its live name in one batch.
	p4copy := filepath.Join(t.TempDir(), "p4")
	copyWithXattr(t, filepath.Join(q, "a/inbox/p4"), p4copy)
	archP4 := p4
	archP4.State = archived
	n5 := tmsg(15, "a", "p4", ready)
	mustApply(t, s, tupd(archP4), tins(n5))
	// p5 moves to another queue under another name.
	movedP5 := p5
	movedP5.Queue, movedP5.Name, movedP5.State = "b", "p5-moved", dead
	mustApply(t, s, tupd(movedP5))
	crash(t, s)

	// Undo file operations as if the crash had come before them.
	rm(t, filepath.Join(q, "a/inbox/n1"))                                      // insert not written
	write(t, filepath.Join(q, "a/inbox/n2"), "garb")                           // insert torn (a power cut)
	mv(t, filepath.Join(q, "a/processing/p1"), filepath.Join(q, "a/inbox/p1")) // lease not moved
	mv(t, p2copy, filepath.Join(q, "a/inbox/p2"))                              // delete not unlinked
	rm(t, filepath.Join(q, "a/archive/p4"))                                    // archive not moved,
	mv(t, p4copy, filepath.Join(q, "a/inbox/p4"))                              // n5 not written
	mv(t, filepath.Join(q, "b/dlq/p5-moved"), filepath.Join(q, "a/inbox/p5"))  // cross-queue move not done
	// And what else a crash or a hand leaves behind.
	rm(t, filepath.Join(q, "a/dlq/p3"))                   // a body lost (a power cut in normal mode)
	write(t, filepath.Join(q, "a/inbox/.w99"), "partial") // a temp file
	write(t, filepath.Join(q, "a/inbox/stranger"), "who") // a file nothing explains
	write(t, filepath.Join(q, "ghost/inbox/x"), "boo")    // a queue nothing knows

	log := &logBuffer{}
	s = openTest(t, dir, queuecore.SyncFull, config{}, log)
	t.Logf("repair log:\n%s", log)
	wantMessage(t, s, n1, tbody(11))
	wantMessage(t, s, n2, tbody(12))
	wantMessage(t, s, leasedP1, tbody(1))
	wantGone(t, s, 2)
	wantMessage(t, s, archP4, tbody(4))
	wantMessage(t, s, n5, tbody(15))
	wantMessage(t, s, movedP5, tbody(5))
	wantGone(t, s, 3) // lost: dropped
	wantTree(t, dir, "a/inbox/n1", "a/inbox/n2", "a/processing/p1", "a/archive/p4", "a/inbox/p4", "b/dlq/p5-moved")
	for _, lf := range []string{"a/inbox/stranger", "ghost/inbox/x"} {
		if _, err := os.Stat(filepath.Join(dir, lostFoundDir, lf)); err != nil {
			t.Errorf("lost+found/%s: %v", lf, err)
		}
	}
	for _, want := range []string{"wrote a missing body", "rewrote a damaged body", "moved a body", "removed the body file",
		"message is dropped", "lost+found", "repaired the store tree"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the repair log lacks %q", want)
		}
	}
	counts, _ := s.Counts(context.Background())
	if c := counts["a"][dead]; c.N != 0 {
		t.Errorf("Counts(a, dlq) = %v after the lost message was dropped", c)
	}

	// A clean reopen repairs nothing.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	log.reset()
	s = openTest(t, dir, queuecore.SyncFull, config{}, log)
	if strings.Contains(log.String(), "repaired") {
		t.Errorf("a second open repaired again:\n%s", log)
	}
	wantMessage(t, s, n5, tbody(15))
}

func rm(t *testing.T, p string) {
	t.Helper()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
}

func mv(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// copyWithXattr copies a body file with its ID xattr.
func copyWithXattr(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
	id, ok := readOwner(from)
	if !ok {
		t.Fatalf("%s has no ID xattr", from)
	}
	if err := unix.Setxattr(to, idXattr, []byte(strconv.FormatUint(id, 10)), 0); err != nil {
		t.Fatal(err)
	}
}

// TestJournalSkipsWhatTheSnapshotHolds: a crash between writing the
// snapshot and emptying the journal leaves records the snapshot already
// holds; replay skips them instead of applying them twice.
func TestJournalSkipsWhatTheSnapshotHolds(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncFull, config{}, nil)
	mustPutQueues(t, s, "q")
	mustApply(t, s, tins(tmsg(1, "q", "one", ready)))
	mustApply(t, s, tins(tmsg(2, "q", "two", ready)), tdel(1))
	crash(t, s)
	journal, err := os.ReadFile(filepath.Join(dir, journalName))
	if err != nil {
		t.Fatal(err)
	}
	s = openTest(t, dir, queuecore.SyncFull, config{}, nil) // replays and checkpoints
	crash(t, s)
	if err := os.WriteFile(filepath.Join(dir, journalName), journal, 0o600); err != nil {
		t.Fatal(err)
	}
	log := &logBuffer{}
	s = openTest(t, dir, queuecore.SyncFull, config{}, log)
	if strings.Contains(log.String(), "does not apply") {
		t.Errorf("records held by the snapshot were applied again:\n%s", log)
	}
	wantGone(t, s, 1)
	wantMessage(t, s, tmsg(2, "q", "two", ready), tbody(2))
}

// TestRecoverBothJournals: a crash during a checkpoint leaves journal.old
// and journal; both are replayed, in order.
func TestRecoverBothJournals(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncFull, config{}, nil)
	mustPutQueues(t, s, "q")
	m := tmsg(1, "q", "one", ready)
	mustApply(t, s, tins(m))
	s.mu.Lock()
	if _, _, err := s.rotateLocked(filepath.Join(dir, journalName), filepath.Join(dir, oldJournalName), true); err != nil {
		t.Fatal(err)
	}
	s.mu.Unlock()
	m.State, m.Deadline = leased, epoch.Add(time.Hour)
	mustApply(t, s, tupd(m), tins(tmsg(2, "q", "two", ready)))
	crash(t, s)
	if _, err := os.Stat(filepath.Join(dir, oldJournalName)); err != nil {
		t.Fatalf("no journal.old: %v", err)
	}

	s = openTest(t, dir, queuecore.SyncFull, config{}, nil)
	wantMessage(t, s, m, tbody(1))
	wantMessage(t, s, tmsg(2, "q", "two", ready), tbody(2))
	if _, err := os.Stat(filepath.Join(dir, oldJournalName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("journal.old after recovery: %v", err)
	}
	wantTree(t, dir, "q/processing/one", "q/inbox/two")
}

// TestGroupCommit: concurrent commits in SyncFull share fsyncs. Each
// fdatasync is made to last at least 2 ms, as on a slow disk, so that the
// other writers are sure to queue behind it however busy the machine is
// (on a fast disk and a loaded machine they may not: the test then
// measured scheduling, not group commit).
func TestGroupCommit(t *testing.T) {
	slow := func(fd int) error {
		time.Sleep(2 * time.Millisecond) // a slow disk, simulated
		return unix.Fdatasync(fd)
	}
	s := openTest(t, t.TempDir(), queuecore.SyncFull, config{fdatasync: slow}, nil)
	mustPutQueues(t, s, "q")
	const workers, each = 8, 40
	var wg sync.WaitGroup
	start := make(chan struct{})
	before := s.fsyncs.Load()
	for w := range workers {
		wg.Go(func() {
			<-start
			for i := range each {
				id := uint64(w*1000 + i + 1)
				if err := s.Apply(context.Background(), []queuecore.Op{tins(tmsg(id, "q", fmt.Sprint("m", id), ready))}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	n := s.fsyncs.Load() - before
	t.Logf("%d commits from %d goroutines took %d fdatasyncs (%.1f commits per fsync)", workers*each, workers, n, float64(workers*each)/float64(n))
	if n >= workers*each*3/4 {
		t.Errorf("%d commits took %d fdatasyncs: commits do not share them", workers*each, n)
	}
	if n == 0 {
		t.Error("no fdatasync in SyncFull")
	}
}

// TestNoFsyncInNormal: SyncNormal and SyncOff commits do not fsync.
func TestNoFsyncInNormal(t *testing.T) {
	for _, mode := range []queuecore.SyncMode{queuecore.SyncNormal, queuecore.SyncOff} {
		s := openTest(t, t.TempDir(), mode, config{}, nil)
		mustPutQueues(t, s, "q")
		for id := uint64(1); id <= 10; id++ {
			mustApply(t, s, tins(tmsg(id, "q", fmt.Sprint("m", id), ready)))
		}
		if n := s.fsyncs.Load(); n != 0 {
			t.Errorf("%s: %d fdatasyncs for 10 commits", mode, n)
		}
	}
}

// TestFailedBatchChangesNothing: a batch that fails validation leaves the
// index, the journal, the tree and MaxID as they were.
func TestFailedBatchChangesNothing(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncFull, config{}, nil)
	mustPutQueues(t, s, "q")
	mustApply(t, s, tins(tmsg(1, "q", "taken", leased)), tins(tmsg(2, "q", "other", ready)))
	jsize, lsn, maxID := s.cur.Load().size, s.lsn, s.ix.maxID
	before := treeFiles(t, dir)

	fresh := tmsg(500, "q", "fresh", ready)
	moved := tmsg(2, "q", "other", dead)
	err := s.Apply(context.Background(), []queuecore.Op{tins(fresh), tupd(moved), tdel(1), tins(tmsg(501, "q", "other", ready))})
	if !errors.Is(err, queuecore.ErrExists) {
		t.Fatalf("Apply = %v, want ErrExists", err)
	}
	if s.cur.Load().size != jsize || s.lsn != lsn || s.ix.maxID != maxID {
		t.Errorf("a failed batch changed journal size %d->%d, lsn %d->%d, maxID %d->%d",
			jsize, s.cur.Load().size, lsn, s.lsn, maxID, s.ix.maxID)
	}
	wantTree(t, dir, before...)
	wantGone(t, s, 500)
	wantMessage(t, s, tmsg(1, "q", "taken", leased), tbody(1))
	wantMessage(t, s, tmsg(2, "q", "other", ready), tbody(2))
	if len(s.unwritten) != 0 || len(s.busy) != 0 || len(s.pending) != 0 {
		t.Errorf("a failed batch left pending work: %d unwritten, %d busy, %d pending", len(s.unwritten), len(s.busy), len(s.pending))
	}
	// Bad names never reach the disk.
	for _, name := range []string{"", ".hidden", "a/b", "..", "nul\x00", strings.Repeat("x", 256)} {
		err := s.Apply(context.Background(), []queuecore.Op{tins(tmsg(600, "q", name, ready))})
		if !errors.Is(err, queuecore.ErrInvalidName) {
			t.Errorf("insert named %q = %v, want ErrInvalidName", name, err)
		}
	}
	for _, name := range []string{"", ".q", "a/b", "sp ace", strings.Repeat("q", 129)} {
		if err := s.PutQueue(context.Background(), queuecore.QueueInfo{Name: name}); !errors.Is(err, queuecore.ErrInvalidName) {
			t.Errorf("PutQueue(%q) = %v, want ErrInvalidName", name, err)
		}
	}
	wantTree(t, dir, before...)
}

// TestLocked: a second Open fails at once with ErrLocked naming the holder;
// a failed Open releases the lock.
func TestLocked(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncFull, config{}, nil)
	_, err := Open(context.Background(), dir, backends.Options{})
	if !errors.Is(err, queuecore.ErrLocked) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("second Open = %v, want ErrLocked naming pid %d", err, os.Getpid())
	}
	if !strings.Contains(err.Error(), "TestLocked") {
		t.Errorf("second Open = %v, want the holder's description", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// A damaged snapshot fails Open, which then lets go of the lock.
	write(t, filepath.Join(dir, snapshotName), `{"snapshot":1,"lsn":1,"queues":1,"messages":0}`+"\n"+"garbage\n")
	if _, err := Open(context.Background(), dir, backends.Options{}); !errors.Is(err, errBadSnapshot) {
		t.Errorf("Open with a damaged snapshot = %v, want errBadSnapshot", err)
	}
	l, err := backends.LockStore(dir, "after")
	if err != nil {
		t.Fatalf("lock after a failed Open: %v", err)
	}
	l.Unlock()
}

// TestFsyncFailure: once an fdatasync fails the store refuses changes (it
// does not pretend), and the next Open recovers what was durable.
func TestFsyncFailure(t *testing.T) {
	dir := t.TempDir()
	var fail sync.Map
	cfg := config{fdatasync: func(fd int) error {
		if _, ok := fail.Load("yes"); ok {
			return syscall.EIO
		}
		return unix.Fdatasync(fd)
	}}
	s := openTest(t, dir, queuecore.SyncFull, cfg, nil)
	mustPutQueues(t, s, "q")
	mustApply(t, s, tins(tmsg(1, "q", "one", ready)))
	fail.Store("yes", true)
	if err := s.Apply(context.Background(), []queuecore.Op{tins(tmsg(2, "q", "two", ready))}); !errors.Is(err, syscall.EIO) {
		t.Errorf("Apply when fdatasync fails = %v, want EIO", err)
	}
	fail.Delete("yes")
	if err := s.Apply(context.Background(), []queuecore.Op{tins(tmsg(3, "q", "three", ready))}); err == nil {
		t.Error("Apply after a failed fdatasync succeeded")
	}
	if err := s.PutQueue(context.Background(), queuecore.QueueInfo{Name: "r"}); err == nil {
		t.Error("PutQueue after a failed fdatasync succeeded")
	}
	if err := s.Close(); err == nil {
		t.Error("Close of a failed store reported no error")
	}
	s = openTest(t, dir, queuecore.SyncFull, config{}, nil)
	wantMessage(t, s, tmsg(1, "q", "one", ready), tbody(1))
	wantGone(t, s, 3)
	mustApply(t, s, tins(tmsg(4, "q", "four", ready)))
}

// TestCheckpointsUnderLoad: with a tiny checkpoint threshold, checkpoints
// run all the time under concurrent commits and body reads; everything is
// there after a crash and after a clean close.
func TestCheckpointsUnderLoad(t *testing.T) {
	for _, mode := range []queuecore.SyncMode{queuecore.SyncFull, queuecore.SyncNormal} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			s := openTest(t, dir, mode, config{checkpointBytes: 2048}, nil)
			mustPutQueues(t, s, "a", "b")
			model := runWorkload(t, s, 6, 60)
			s.bg.Wait() // no commits now: the last checkpoint started is the last one
			if _, err := os.Stat(filepath.Join(dir, snapshotName)); err != nil {
				t.Fatalf("no snapshot after %d KiB of journal: %v", 6*60, err)
			}
			checkModel(t, s, model)
			crash(t, s)
			s = openTest(t, dir, mode, config{checkpointBytes: 2048}, nil)
			checkModel(t, s, model)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openTest(t, dir, mode, config{}, nil)
			checkModel(t, s, model)
		})
	}
}

// runWorkload runs workers that insert, move and delete their own messages
// while checking bodies, and returns the final messages.
func runWorkload(t *testing.T, s *Store, workers, rounds int) map[uint64]queuecore.Message {
	var (
		mu    sync.Mutex
		model = map[uint64]queuecore.Message{}
		wg    sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			own := map[uint64]queuecore.Message{}
			ctx := context.Background()
			for i := range rounds {
				id := uint64(w*100000 + i + 1)
				m := tmsg(id, []string{"a", "b"}[r.IntN(2)], fmt.Sprintf("w%d-%d", w, i), ready)
				if err := s.Apply(ctx, []queuecore.Op{tins(m)}); err != nil {
					t.Error(err)
					return
				}
				own[id] = m
				for oid, o := range own {
					switch r.IntN(4) {
					case 0:
						if err := s.Apply(ctx, []queuecore.Op{tdel(oid)}); err != nil {
							t.Error(err)
							return
						}
						delete(own, oid)
					case 1:
						o.State = queuecore.States[r.IntN(5)]
						o.Queue = []string{"a", "b"}[r.IntN(2)]
						o.Deadline = time.Time{}
						if o.State == leased || o.State == delayed {
							o.Deadline = epoch.Add(time.Duration(r.IntN(1000)) * time.Second)
						}
						if err := s.Apply(ctx, []queuecore.Op{tupd(o)}); err != nil {
							t.Error(err)
							return
						}
						own[oid] = o
					default:
						b, err := s.Body(ctx, oid)
						if err != nil || !bytes.Equal(b, tbody(oid)) {
							t.Errorf("Body(%d) = %q, %v", oid, b, err)
							return
						}
					}
					break
				}
			}
			mu.Lock()
			for id, m := range own {
				model[id] = m
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return model
}

// checkModel checks that s holds exactly model, bodies included.
func checkModel(t *testing.T, s *Store, model map[uint64]queuecore.Message) {
	t.Helper()
	n := 0
	for _, q := range []string{"a", "b"} {
		for _, st := range queuecore.States {
			_ = s.List(context.Background(), q, st, func(m queuecore.Message) bool {
				n++
				want, ok := model[m.ID]
				if !ok || want.Queue != m.Queue || want.State != m.State || want.Name != m.Name {
					t.Errorf("List(%s, %s) has message %d (%s/%s), want %+v", q, st, m.ID, m.Queue, m.Name, want)
				}
				return true
			})
		}
	}
	if n != len(model) {
		t.Errorf("the store holds %d messages, want %d", n, len(model))
	}
	for id, m := range model {
		wantMessage(t, s, m, tbody(id))
	}
}

// TestBodyWhileMoving: Body never returns a wrong or partial body while
// its message moves between states, queues and names, and other messages
// take the names it leaves.
func TestBodyWhileMoving(t *testing.T) {
	s := openTest(t, t.TempDir(), queuecore.SyncFull, config{}, nil)
	mustPutQueues(t, s, "a", "b")
	const n = 8
	for id := uint64(1); id <= n; id++ {
		mustApply(t, s, tins(tmsg(id, "a", fmt.Sprint("m", id), ready)))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := uint64(1 + (w*7+i)%n)
				b, err := s.Body(context.Background(), id)
				if err != nil || !bytes.Equal(b, tbody(id)) {
					t.Errorf("Body(%d) = %q, %v", id, b, err)
					return
				}
			}
		})
	}
	r := rand.New(rand.NewPCG(1, 2))
	next := uint64(1000)
	for range 300 {
		id := uint64(1 + r.IntN(n))
		m, err := s.Lookup(context.Background(), "a", fmt.Sprint("m", id), false)
		if err != nil {
			m, err = s.Lookup(context.Background(), "b", fmt.Sprint("m", id), false)
		}
		if err != nil {
			t.Fatal(err)
		}
		// Move it, and put a newcomer under the name it leaves, in one batch.
		old := m
		m.Queue = []string{"a", "b"}[r.IntN(2)]
		m.State = []queuecore.State{ready, dead}[r.IntN(2)]
		ops := []queuecore.Op{tupd(m)}
		if m.Queue != old.Queue {
			next++
			ops = append(ops, tins(tmsg(next, old.Queue, old.Name, old.State)))
		}
		mustApply(t, s, ops...)
		if len(ops) == 2 {
			mustApply(t, s, tdel(next))
		}
	}
	close(stop)
	wg.Wait()
}

// TestDeleteQueueOnDisk: a deleted queue's tree leaves queues/ at once and
// is removed; a crash before that is repaired at Open.
func TestDeleteQueueOnDisk(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncFull, config{}, nil)
	mustPutQueues(t, s, "a", "b")
	mustApply(t, s, tins(tmsg(1, "a", "x", ready)), tins(tmsg(2, "b", "x", ready)))
	if err := s.DeleteQueue(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	wantTree(t, dir, "b/inbox/x")
	crash(t, s)
	// As if the crash came before the tree was moved to the trash.
	write(t, filepath.Join(dir, queuesDir, "a/inbox/x"), "body of message 1\n")
	openTest(t, dir, queuecore.SyncFull, config{}, nil)
	wantTree(t, dir, "b/inbox/x")
	if _, err := os.Stat(filepath.Join(dir, trashDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("trash after Open: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, lostFoundDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a deleted queue's tree went to lost+found: %v", err)
	}
}

// TestCodecRoundTrip: the packed entry and the JSON form keep every field,
// odd bytes and extreme values included.
func TestCodecRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	randString := func() string {
		b := make([]byte, r.IntN(12))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return string(b)
	}
	randTime := func() time.Time {
		switch r.IntN(4) {
		case 0:
			return time.Time{}
		case 1:
			return time.Unix(0, 0)
		case 2:
			return time.Unix(0, r.Int64()-r.Int64())
		}
		return epoch.Add(time.Duration(r.Int64N(1e15)))
	}
	q := newQueue(queuecore.QueueInfo{Name: "q"})
	for i := range 2000 {
		m := queuecore.Message{
			ID: r.Uint64(), Queue: "q", Name: "n" + randString(), State: queuecore.States[r.IntN(5)], Seq: r.Uint64(),
			Priority: int(int32(r.Uint32())), Size: r.Int64(), MessageID: randString(),
			PublishedAt: randTime(), FirstAt: randTime(), StateAt: randTime(), Deadline: randTime(),
			Attempts: r.IntN(1 << 20), Redrives: r.IntN(100), Reason: randString(), ReasonMessage: randString() + "\n\"\\",
			FailedAt: randTime(), Consumer: randString(), DedupKey: randString(), UID: r.Uint32(), GID: r.Uint32(),
		}
		got := newEntry(&m, q).message()
		if d := messageDiff(m, got); d != "" {
			t.Fatalf("case %d: packed round trip: %s", i, d)
		}
		js := appendMessageJSON(nil, &m)
		got, err := decodeMessageJSON(&jsonReader{b: js})
		if err != nil {
			t.Fatalf("case %d: decode %s: %v", i, js, err)
		}
		if d := messageDiff(m, got); d != "" {
			t.Fatalf("case %d: JSON round trip of %s: %s", i, js, d)
		}
		if bytes.IndexByte(js, '\n') >= 0 {
			t.Fatalf("case %d: JSON has a newline: %s", i, js)
		}
	}
}

func messageDiff(a, b queuecore.Message) string {
	ta := []time.Time{a.PublishedAt, a.FirstAt, a.StateAt, a.Deadline, a.FailedAt}
	tb := []time.Time{b.PublishedAt, b.FirstAt, b.StateAt, b.Deadline, b.FailedAt}
	for i := range ta {
		if !ta[i].Equal(tb[i]) || ta[i].IsZero() != tb[i].IsZero() {
			return fmt.Sprintf("time %d: %v != %v", i, ta[i], tb[i])
		}
	}
	a.PublishedAt, a.FirstAt, a.StateAt, a.Deadline, a.FailedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}
	b.PublishedAt, b.FirstAt, b.StateAt, b.Deadline, b.FailedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if a != b {
		return fmt.Sprintf("%+v != %+v", a, b)
	}
	return ""
}

// TestReconcileWithoutXattrs: on a file system without user xattrs, a
// body whose cross-queue move a crash cut off is found by the paths the
// journal says its message had.
func TestReconcileWithoutXattrs(t *testing.T) {
	dir := t.TempDir()
	q := filepath.Join(dir, queuesDir)
	s := openTest(t, dir, queuecore.SyncFull, config{}, nil)
	s.noXattr.Store(true)
	mustPutQueues(t, s, "a", "b")
	m := tmsg(1, "a", "m", ready)
	mustApply(t, s, tins(m))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := readOwner(filepath.Join(q, "a/inbox/m")); ok {
		t.Fatal("a body file has an ID xattr though xattrs are off")
	}
	s = openTest(t, dir, queuecore.SyncFull, config{}, nil)
	s.noXattr.Store(true)
	m1 := m
	m1.State = dead
	m2 := m1
	m2.Queue, m2.Name = "b", "renamed"
	mustApply(t, s, tupd(m1))
	mustApply(t, s, tupd(m2))
	crash(t, s)
	mv(t, filepath.Join(q, "b/dlq/renamed"), filepath.Join(q, "a/dlq/m")) // the second move undone

	log := &logBuffer{}
	s = openTest(t, dir, queuecore.SyncFull, config{}, log)
	wantMessage(t, s, m2, tbody(1))
	wantTree(t, dir, "b/dlq/renamed")
	if !strings.Contains(log.String(), "moved a body") {
		t.Errorf("no move logged:\n%s", log)
	}
}

// A checkpoint's rotation of the journal must not hold the store's mutex
// across a sync: every commit of every queue waits on it. With the sync
// blocked (a disk that stalls), a lease commits (it does not wait for its
// sync) and a message is read while the checkpoint waits for its sync, and
// a publish made then returns only after that sync, with the old journal's
// tail and the directory synced before it.
func TestRotationSyncsOutsideTheLock(t *testing.T) {
	var (
		block   atomic.Bool
		entered = make(chan struct{}, 1)
		release = make(chan struct{})
	)
	hook := func(fd int) error {
		if block.Load() {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
		}
		return unix.Fdatasync(fd)
	}
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncFull, config{fdatasync: hook}, nil)
	mustPutQueues(t, s, "q")
	ctx := context.Background()
	for id := uint64(1); id <= 3; id++ {
		if err := s.Apply(ctx, []queuecore.Op{tins(tmsg(id, "q", fmt.Sprint("m", id), ready))}); err != nil {
			t.Fatal(err)
		}
	}
	// A lease written but not synced: the old journal's tail.
	m1, err := s.Lookup(ctx, "q", "m1", false)
	if err != nil {
		t.Fatal(err)
	}
	m1.State = queuecore.StateLeased
	m1.Deadline = time.Now().Add(time.Minute)
	if err := s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: m1, NoSync: true}}); err != nil {
		t.Fatal(err)
	}

	block.Store(true)
	ckpt := make(chan error, 1)
	go func() { ckpt <- s.checkpoint() }()
	select {
	case <-entered:
	case err := <-ckpt:
		t.Fatalf("checkpoint ended without a sync: %v", err)
	}
	// The checkpoint waits in a sync now. Before the change it held the
	// store's mutex there, and these never returned until the release.
	done := make(chan error, 2)
	go func() {
		m2, err := s.Lookup(ctx, "q", "m2", false)
		if err == nil {
			m2.State = queuecore.StateLeased
			m2.Deadline = time.Now().Add(time.Minute)
			err = s.Apply(ctx, []queuecore.Op{{Kind: queuecore.OpUpdate, Msg: m2, NoSync: true}})
		}
		done <- err
	}()
	go func() {
		_, err := s.Body(ctx, 3)
		done <- err
	}()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second): // a deadlock detector, not a speed check
			close(release)
			t.Fatal("a lease or a read waited for the checkpoint's sync")
		}
	}
	published := make(chan error, 1)
	go func() {
		published <- s.Apply(ctx, []queuecore.Op{tins(tmsg(4, "q", "m4", ready))})
	}()
	select {
	case err := <-published:
		close(release)
		t.Fatalf("a publish returned before any sync covered it (err %v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	block.Store(false)
	close(release)
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	if err := <-ckpt; err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Everything is there after a reopen: the lease of m1 in the old
	// journal, the lease of m2 and the publish of m4 in the new one.
	s2 := openTest(t, dir, queuecore.SyncFull, config{}, nil)
	for name, want := range map[string]queuecore.State{"m1": queuecore.StateLeased, "m2": queuecore.StateLeased, "m3": ready, "m4": ready} {
		m, err := s2.Lookup(ctx, "q", name, false)
		if err != nil {
			t.Fatalf("%s after reopen: %v", name, err)
		}
		if m.State != want {
			t.Errorf("%s after reopen: state %v, want %v", name, m.State, want)
		}
	}
}

// The checkpoint syncs a move's target directory before its source, and
// in a cycle breaks the tie somewhere: the moves there are linked at their
// old paths for the sync instead.
func TestSyncOrderTargetsFirst(t *testing.T) {
	moves := map[string]string{
		"q/processing/a": "q/inbox/a",      // a lease
		"q/archive/b":    "q/processing/b", // an ack kept in the archive
		"q/dlq/c":        "q/processing/c",
	}
	o := syncOrder(map[string]struct{}{"q/inbox": {}, "q/processing": {}, "other": {}}, moves)
	for _, e := range [][2]string{{"q/processing", "q/inbox"}, {"q/archive", "q/processing"}, {"q/dlq", "q/processing"}} {
		if o[e[0]] >= o[e[1]] {
			t.Errorf("order %v: %s not before %s", o, e[0], e[1])
		}
	}
	if _, ok := o["other"]; !ok || len(o) != 5 {
		t.Errorf("order %v: want every directory numbered once", o)
	}
	// A nack makes a cycle: one of the two moves has its source first.
	moves["q/inbox/d"] = "q/processing/d"
	o = syncOrder(nil, moves)
	if (o["q/inbox"] > o["q/processing"]) == (o["q/processing"] > o["q/inbox"]) {
		t.Errorf("order %v: inbox and processing tie", o)
	}
	if o["q/archive"] >= o["q/processing"] || o["q/dlq"] >= o["q/processing"] {
		t.Errorf("order %v: the sinks are not first", o)
	}
}

// Past maxDirtyMoves kept moves (here 1,000) a checkpoint starts whatever
// the journal's size, and its sync takes the moves: the map stays bounded.
func TestManyMovesStartACheckpoint(t *testing.T) {
	const maxMoves = 1000
	dir := t.TempDir()
	s := openTest(t, dir, queuecore.SyncNormal, config{checkpointBytes: 1 << 40, maxDirtyMoves: maxMoves}, nil)
	mustPutQueues(t, s, "q")
	ctx := context.Background()
	n := uint64(maxMoves + 100)
	const batch = 500
	apply := func(what string, op func(id uint64) queuecore.Op) {
		t.Helper()
		for first := uint64(1); first <= n; first += batch {
			var ops []queuecore.Op
			for id := first; id < first+batch && id <= n; id++ {
				ops = append(ops, op(id))
			}
			if err := s.Apply(ctx, ops); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	apply("insert", func(id uint64) queuecore.Op { return tins(tmsg(id, "q", fmt.Sprint("m", id), ready)) })
	// A checkpoint now: the bodies are then in files only, so their moves
	// are kept.
	if err := s.checkpoint(); err != nil {
		t.Fatal(err)
	}
	if s.dirty.manyMoves.Load() {
		t.Fatal("many moves before any move")
	}
	apply("lease", func(id uint64) queuecore.Op {
		m := tmsg(id, "q", fmt.Sprint("m", id), leased)
		m.Deadline = epoch.Add(time.Hour)
		return tupd(m)
	})
	// A commit looks at the count before its file operations run: the
	// next one starts the checkpoint.
	if err := s.Apply(ctx, []queuecore.Op{tins(tmsg(n+1, "q", "after", ready))}); err != nil {
		t.Fatal(err)
	}
	if !testenv.RetryUntil(30*time.Second, func() bool {
		s.dirty.mu.Lock()
		defer s.dirty.mu.Unlock()
		return len(s.dirty.moves) < maxMoves && !s.dirty.manyMoves.Load()
	}) {
		s.dirty.mu.Lock()
		defer s.dirty.mu.Unlock()
		t.Fatalf("%d moves kept, many %v: no checkpoint took them (journal threshold 1 TiB)", len(s.dirty.moves), s.dirty.manyMoves.Load())
	}
}
