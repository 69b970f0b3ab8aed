package backendtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// crashChildEnv, when set, makes RunCrash the child: its value is a JSON
// crashChildSpec.
const crashChildEnv = "YIRANGMQ_CRASH_CHILD"

// crashChildSpec tells the child which test it is, where the store is and
// how to open it.
type crashChildSpec struct {
	Test string `json:"test"` // t.Name() of the test that calls RunCrash
	Dir  string `json:"dir"`
	Sync string `json:"sync"`
	Seed uint64 `json:"seed"`
}

// crashWorkers is the number of goroutines of the child that change the
// store. Worker w owns the messages whose ID is w modulo crashWorkers. The
// last one is the queue worker: it creates queues named crashTmpPrefix+ID,
// fills them, deletes them with their messages, and replaces the policies
// of crashQueues; the others only move messages among crashQueues.
const crashWorkers = 5

// crashQueues are created by the parent and never deleted.
var crashQueues = []string{"crash-a", "crash-b", "crash-c"}

const crashTmpPrefix = "crash-tmp-"

// crashConfig is how hard the crash test works.
type crashConfig struct {
	kills      int           // child processes killed per sync mode
	minBatches int           // committed batches a child reports before it may be killed
	minRun     time.Duration // the kill comes between minRun and maxRun after the first commit
	maxRun     time.Duration
}

var defaultCrashConfig = crashConfig{kills: 5, minBatches: 20, minRun: 10 * time.Millisecond, maxRun: 120 * time.Millisecond}

// crashModes are the sync modes RunCrash kills in, with their kill counts:
// every mode promises that a commit survives kill -9; off gets fewer rounds.
var crashModes = []struct {
	mode  queuecore.SyncMode
	kills int
}{{queuecore.SyncFull, 5}, {queuecore.SyncNormal, 5}, {queuecore.SyncOff, 3}}

// RunCrash is the kill -9 test. The test that calls it is run again, in a
// child process (os.Args[0] -test.run=^Name$), with crashChildEnv set;
// there RunCrash opens the store and, from several goroutines, forever
// commits batches (publishes, leases, nacks, acks to the archive,
// dead-letters, redrives, ack-and-forwards, deletes), creates and deletes
// queues and replaces policies, reporting each change on stdout before and
// after. The parent kills the child with SIGKILL at a random moment,
// reopens the store and checks that every change reported committed is
// there, that every change in flight is there whole or not at all, and that
// the store is consistent (one place per message, unique names, whole and
// right bodies, Counts equal to List, Lookup, Due and NextDue agreeing with
// List, deleted messages' bodies gone). It does that several times per sync
// mode on the same directory, so that recovery of a recovered store is
// exercised too. It takes a few seconds; -short skips it.
//
// RunCrash must be called from the test's own goroutine, before the test
// changes anything that the child would need unchanged.
func RunCrash(t *testing.T, open Opener) {
	t.Helper()
	if spec, ok := crashChild(t); ok {
		runCrashChild(t, open, spec)
		return
	}
	if testing.Short() {
		t.Skip("kill -9 test skipped in -short mode")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("crash test seed %d", seed)
	childTest := t.Name() // the child runs this test, which calls RunCrash
	for i, m := range crashModes {
		t.Run(m.mode.String(), func(t *testing.T) {
			cfg := defaultCrashConfig
			cfg.kills = m.kills
			for _, p := range crashRounds(t, open, childTest, m.mode, cfg, seed+uint64(i)) {
				t.Error(p)
			}
		})
	}
}

// crashChild reports whether this process is a crash child meant for t.
func crashChild(t *testing.T) (crashChildSpec, bool) {
	v := os.Getenv(crashChildEnv)
	if v == "" {
		return crashChildSpec{}, false
	}
	var spec crashChildSpec
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		fmt.Print(crashLine{Err: fmt.Sprintf("bad %s: %v", crashChildEnv, err)}.encode())
		os.Exit(2)
	}
	if spec.Test != t.Name() {
		t.Skipf("crash child for %s, not %s", spec.Test, t.Name())
	}
	return spec, true
}

// crashRounds runs cfg.kills children on one store directory and returns
// the problems it found. It fails t itself only when the test cannot run
// (a child that does not start, or stops reporting); store bugs, including
// errors the child got from the store, are returned, so that a test of the
// checker can expect them. childTest is the
// test whose function calls RunCrash (or runCrashChild) first thing.
func crashRounds(t *testing.T, open Opener, childTest string, mode queuecore.SyncMode, cfg crashConfig, seed uint64) []string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	s, err := open(ctx, dir, mode)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	for _, q := range crashQueues {
		if err := s.PutQueue(ctx, queueInfo(q)); err != nil {
			t.Fatalf("PutQueue(%s): %v", q, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close store: %v", err)
	}

	r := rand.New(rand.NewPCG(seed, 1))
	state, maxGiven := crashModel{}, uint64(0)
	var queues []queuecore.QueueInfo
	for _, q := range crashQueues {
		queues = append(queues, queueInfo(q))
	}
	for round := range cfg.kills {
		spec := crashChildSpec{Test: childTest, Dir: dir, Sync: mode.String(), Seed: seed + uint64(round)}
		runFor := cfg.minRun + time.Duration(r.Int64N(int64(cfg.maxRun-cfg.minRun)+1))
		h := newCrashHistory(state, queues, maxGiven)
		stderr, err := runAndKill(t, spec, h, cfg.minBatches, runFor)
		if err != nil {
			t.Fatalf("round %d: %v\nchild stderr:\n%s", round, err, stderr)
		}
		if strings.Contains(stderr, "DATA RACE") {
			return []string{fmt.Sprintf("round %d: the child found a data race:\n%s", round, stderr)}
		}
		if len(h.childErrs) > 0 {
			return append([]string{fmt.Sprintf("round %d: Apply failed in the child (a batch the store should take):", round)}, h.childErrs...)
		}

		s, err := open(ctx, dir, mode)
		if err != nil {
			return []string{fmt.Sprintf("round %d: reopen after kill -9: %v", round, err)}
		}
		snap, err := readSnapshot(ctx, s)
		var problems []string
		if err != nil {
			problems = append(problems, fmt.Sprintf("read the recovered store: %v", err))
		} else {
			problems = append(problems, h.check(snap)...)
			problems = append(problems, checkQueries(ctx, s, snap)...)
			for _, id := range h.gone() {
				if b, err := s.Body(ctx, id); !errors.Is(err, queuecore.ErrNotFound) {
					problems = append(problems, fmt.Sprintf("Body(%d) of a message deleted by a change reported committed = %s, %v; want ErrNotFound", id, abbrev(b), err))
				}
			}
		}
		if err := s.Close(); err != nil {
			problems = append(problems, fmt.Sprintf("close the recovered store: %v", err))
		}
		if len(problems) > 0 {
			for i, p := range problems {
				problems[i] = fmt.Sprintf("round %d (killed after %d committed batches): %s", round, h.committed, p)
			}
			return problems
		}
		t.Logf("round %d: killed after %d committed changes (%d of queues), %d in flight; recovered %d messages in %d queues",
			round, h.committed, h.queueOps, len(h.inFlight), len(snap.messages()), len(snap.Queues))
		state, queues, maxGiven = snap.messages(), snap.Queues, max(h.maxGiven, snap.MaxID)
	}
	return nil
}

// runAndKill starts a child, feeds its reports to h, and kills it with
// SIGKILL once it has reported minBatches commits and runFor has passed
// since its first. It returns the child's stderr.
func runAndKill(t *testing.T, spec crashChildSpec, h *crashHistory, minBatches int, runFor time.Duration) (string, error) {
	t.Helper()
	env, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	cmd := SelfCommand("-test.run="+runPattern(spec.Test), "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+string(env))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe() // closed by our death: the child then exits
	if err != nil {
		return "", err
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}

	var (
		mu       sync.Mutex
		firstAt  time.Time
		feedErr  error
		readDone = make(chan struct{})
	)
	go func() {
		defer close(readDone)
		br := bufio.NewReaderSize(stdout, 64<<10)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				// A line cut by the kill was never a whole report.
				return
			}
			mu.Lock()
			if err := h.feed(line); err != nil && feedErr == nil {
				feedErr = err
			}
			if h.committed == 1 && firstAt.IsZero() {
				firstAt = time.Now()
			}
			mu.Unlock()
		}
	}()

	kill := func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-readDone     // every line the child wrote, up to EOF
		_ = cmd.Wait() // only now: Wait closes stdout
	}
	deadline := time.Now().Add(30 * time.Second)
	ticker := time.NewTicker(time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case <-readDone:
			err := cmd.Wait()
			if feedErr != nil {
				return stderr.String(), feedErr
			}
			if len(h.childErrs) > 0 {
				return stderr.String(), nil // the caller reports them
			}
			return stderr.String(), fmt.Errorf("the child stopped by itself (%v) after %d committed batches", err, h.committed)
		case <-ticker.C:
		}
		mu.Lock()
		done := h.committed >= minBatches && time.Since(firstAt) >= runFor
		broken := feedErr != nil || len(h.childErrs) > 0
		n := h.committed
		mu.Unlock()
		if broken || done {
			kill()
			if feedErr != nil {
				return stderr.String(), feedErr
			}
			return stderr.String(), nil
		}
		if time.Now().After(deadline) {
			kill()
			return stderr.String(), fmt.Errorf("the child reported only %d committed batches in 30s", n)
		}
	}
}

// runPattern is a -test.run pattern matching exactly the test named name
// (subtests included, level by level).
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// checkQueries checks the answers of Lookup, Due and NextDue on a recovered
// store against its lists: indexes rebuilt or recovered apart from the data
// must agree with it.
func checkQueries(ctx context.Context, s queuecore.Store, snap *snapshot) []string {
	var problems []string
	var timed []queuecore.Message
	for _, k := range slices.SortedFunc(maps.Keys(snap.Lists), func(a, b listKey) int {
		return strings.Compare(a.String(), b.String())
	}) {
		for _, m := range snap.Lists[k] {
			got, err := s.Lookup(ctx, m.Queue, m.Name, m.State == archived)
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("Lookup(%s, %q) of message %d: %v", m.Queue, m.Name, m.ID, err))
			case got.ID != m.ID:
				problems = append(problems, fmt.Sprintf("Lookup(%s, %q) = message %d, List has %d", m.Queue, m.Name, got.ID, m.ID))
			}
			if m.State == leased || m.State == delayed {
				timed = append(timed, m)
			}
		}
	}
	slices.SortFunc(timed, func(a, b queuecore.Message) int { return a.Deadline.Compare(b.Deadline) })
	next, ok, err := s.NextDue(ctx)
	switch {
	case err != nil:
		problems = append(problems, fmt.Sprintf("NextDue: %v", err))
	case ok != (len(timed) > 0) || ok && !next.Equal(timed[0].Deadline):
		problems = append(problems, fmt.Sprintf("NextDue = %v, %v; List gives %d leased and delayed messages", next, ok, len(timed)))
	}
	if len(timed) > 0 {
		due, err := s.Due(ctx, timed[len(timed)-1].Deadline, len(timed)+1)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("Due: %v", err))
		case len(due) != len(timed):
			problems = append(problems, fmt.Sprintf("Due returns %d messages, List gives %d leased and delayed", len(due), len(timed)))
		}
	}
	return problems
}
