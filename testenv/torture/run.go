package torture

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// Run tortures one store through a real mount: it starts the daemon,
// creates the queue, runs producers and consumers while it kills the
// daemon opts.Kills times at random moments and restarts it, then stops
// the producers, drains the queue, kills and restarts once more, reads
// the final state and checks the history against it. Problems of the
// harness (a daemon that does not come back, a wedged mount) fail t;
// the check's verdict is in the result, for the caller to judge.
func Run(t *testing.T, opts Options) *Result {
	t.Helper()
	opts.defaults()
	began := time.Now()
	t.Logf("torture %s --sync %s: %d kills, %d producers, %d consumers, seed %d",
		opts.Backend, opts.Sync, opts.Kills, opts.Producers, opts.Consumers, opts.Seed)
	daemons := make([]*testenv.Daemon, opts.Daemons)
	for i := range daemons {
		daemons[i] = testenv.StartDaemon(t, testenv.DaemonOptions{Backend: opts.Backend, Sync: opts.Sync, Store: opts.Store,
			Args: append([]string{"--max-message-inodes", strconv.Itoa(opts.MaxMessageInodes)}, opts.DaemonArgs...)})
	}
	d := daemons[0]
	qdir := d.Path(QueueName)
	if err := os.Mkdir(qdir, 0o755); err != nil {
		t.Fatalf("mkdir queue: %v", err)
	}
	if err := writePolicy(filepath.Join(qdir, ".policy"), Policy); err != nil {
		t.Fatalf("write policy: %v", err)
	}
	qdirs := make([]string, len(daemons))
	for i, dd := range daemons {
		qdirs[i] = dd.Path(QueueName)
		if !testenv.RetryUntil(10*time.Second, func() bool {
			b, err := os.ReadFile(filepath.Join(qdirs[i], ".policy"))
			return err == nil && strings.Contains(string(b), `"visibilityTimeoutSec": 2`)
		}) {
			t.Fatalf("daemon %d does not see the queue and its policy", i)
		}
	}

	h := NewHistory()
	wd := newWatchdog()
	var stuckMu sync.Mutex
	ms := make([]*mountState, len(daemons))
	for i := range ms {
		ms[i] = newMountState()
		ms[i].quit = ms[0].quit
	}
	m := ms[0]
	res := &Result{DaemonErrors: map[string]int{}}
	rnd := rand.New(rand.NewPCG(opts.Seed, 0))

	var producers, consumers sync.WaitGroup
	stopProducing := make(chan struct{})
	var draining, drainOver atomic.Bool
	// The watchdog: a client call blocked past StuckAfter fails the run;
	// then, and only then, the mounts are aborted so that it can end.
	watchDone, watchExited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchExited)
		seen := map[string]bool{}
		for {
			select {
			case <-watchDone:
				return
			case <-time.After(500 * time.Millisecond):
			}
			stuck := wd.stuck(StuckAfter)
			if len(stuck) == 0 {
				continue
			}
			stuckMu.Lock()
			for _, s := range stuck {
				if key, _, _ := strings.Cut(s, ", thread"); !seen[key] {
					seen[key] = true
					res.StuckClients = append(res.StuckClients, s)
				}
			}
			stuckMu.Unlock()
			for _, dd := range daemons {
				abortMount(dd.Mountpoint)
			}
		}
	}()
	defer func() {
		// However Run ends, no client outlives it: a .next read blocked
		// in a live daemon is released by killing the daemon.
		close(m.quit)
		done := make(chan struct{})
		go func() {
			producers.Wait()
			consumers.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(time.Second):
			for i, dd := range daemons {
				ms[i].down()
				if _, err := killDaemon(dd); err != nil {
					t.Errorf("at the end of the run: %v", err)
					abortMount(dd.Mountpoint)
				}
			}
			<-done
		}
		close(watchDone)
		<-watchExited
	}()
	for i := 0; i < opts.Producers; i++ {
		k := i % len(daemons)
		c := &client{name: fmt.Sprintf("p%d", i), queue: qdirs[k], h: h, m: ms[k]}
		wd.add(c)
		r := rand.New(rand.NewPCG(opts.Seed, uint64(100+i)))
		producers.Add(1)
		go func() {
			defer producers.Done()
			c.pin()
			defer c.unpin()
			produce(c, r, stopProducing)
		}()
	}
	for i := 0; i < opts.Consumers; i++ {
		k := (i + 1) % len(daemons)
		c := &client{name: fmt.Sprintf("c%d", i), queue: qdirs[k], h: h, m: ms[k]}
		wd.add(c)
		r := rand.New(rand.NewPCG(opts.Seed, uint64(200+i)))
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			c.pin()
			defer c.unpin()
			consume(c, r, &draining, &drainOver)
		}()
	}

	killAndRestart := func(i int, between func()) {
		t.Helper()
		d, m, qdir := daemons[i], ms[i], qdirs[i]
		k := Event{Kind: KindKill, Client: "runner", Start: h.Now()}
		m.down()
		wd.killed(m)
		killedAt := time.Now()
		took, err := killDaemon(d)
		res.Exits = append(res.Exits, took)
		if err != nil {
			res.StuckDaemons++
			t.Errorf("kill %d: %v", len(res.Exits), err)
			// Recorded: now free the machine so that the run can end.
			abortMount(d.Mountpoint)
			if _, err := killDaemon(d); err != nil {
				t.Fatalf("daemon still there after its connection was aborted: %v", err)
			}
		}
		k.End, k.Outcome = h.Now(), OK
		res.noteDaemonLog(d.Log())
		h.Add(k)
		// The old mount stays until the next daemon detaches it; meanwhile
		// it must fail at once, never hang.
		if err := deadMountAnswers(d.Mountpoint); err != nil {
			res.DeadMountErrors = append(res.DeadMountErrors, err.Error())
			t.Errorf("kill %d: %v", len(res.Exits), err)
			abortMount(d.Mountpoint)
		}
		between()
		rs := Event{Kind: KindRestart, Client: "runner", Start: h.Now()}
		t0 := time.Now()
		d.Restart(t)
		res.Restarts = append(res.Restarts, time.Since(t0))
		if strings.Contains(d.Log(), "wedged mount") {
			res.Rescued++
			t.Errorf("restart %d: the new daemon found a wedged mount and aborted it:\n%s", len(res.Restarts), d.Log())
		}
		if err := statWithin(qdir, StuckAfter); err != nil {
			t.Fatalf("mount after restart %d: %v", len(res.Restarts), err)
		}
		res.Serving = append(res.Serving, time.Since(killedAt))
		rs.End, rs.Outcome = h.Now(), OK
		h.Add(rs)
		m.up()
	}

	killAll := func() {
		for i := range daemons {
			killAndRestart(i, func() {})
		}
	}
	// victim picks the daemon to kill: the duty holder when asked, then
	// checks, once it is killed, that another takes the duty over.
	victim := func() (int, func()) {
		if !opts.KillDutyHolder || len(daemons) < 2 {
			return rnd.IntN(len(daemons)), func() {}
		}
		holder := -1
		testenv.RetryUntil(10*time.Second, func() bool {
			holder = dutyHolder(daemons)
			return holder >= 0
		})
		if holder < 0 {
			t.Fatalf("no daemon holds the duty")
		}
		killed := time.Now()
		return holder, func() {
			others := append(append([]*testenv.Daemon(nil), daemons[:holder]...), daemons[holder+1:]...)
			if !testenv.RetryUntil(20*time.Second, func() bool { return dutyHolder(others) >= 0 }) {
				t.Fatalf("kill %d: no other daemon took the duty over within 20 s", len(res.Restarts))
			}
			res.Takeovers = append(res.Takeovers, time.Since(killed))
		}
	}
	restartStore := func() {
		t.Helper()
		for _, m := range ms {
			m.down()
		}
		ev := Event{Kind: KindKill, Client: "runner:store", Start: h.Now()}
		if err := opts.RestartStore(); err != nil {
			t.Fatalf("restart the store: %v", err)
		}
		ev.End, ev.Outcome = h.Now(), OK
		h.Add(ev)
		// The daemons reconnect by themselves: wait until each serves.
		for i := range daemons {
			if !testenv.RetryUntil(30*time.Second, func() bool {
				_, err := os.ReadDir(filepath.Join(qdirs[i], StateInbox))
				return err == nil
			}) {
				t.Fatalf("daemon %d did not work again within 30 s of the store's restart", i)
			}
		}
		res.DBRestarts++
		for _, m := range ms {
			m.up()
		}
	}

	// Kill at random moments while the clients work.
	killStart := time.Now()
	dbEvery := 0
	if opts.RestartStore != nil && opts.DBRestarts > 0 {
		dbEvery = max(1, opts.Kills/opts.DBRestarts)
	}
	for i := 0; i < opts.Kills && time.Since(killStart) < opts.Duration; i++ {
		time.Sleep(opts.MinGap + time.Duration(rnd.Int64N(int64(opts.MaxGap-opts.MinGap)+1)))
		if dbEvery > 0 && i%dbEvery == dbEvery-1 && res.DBRestarts < opts.DBRestarts {
			restartStore()
			continue
		}
		k, tookOver := victim()
		killAndRestart(k, tookOver)
		res.PhaseKills++
	}
	close(stopProducing)
	producers.Wait()
	res.KillPhase = time.Since(killStart)

	// Drain: consumers stop blocking and always ack; one more kill
	// releases the .next reads still blocked in the daemon.
	draining.Store(true)
	time.Sleep(opts.MinGap)
	killAll()
	drainStart := time.Now()
	drainDone := make(chan struct{})
	go func() {
		consumers.Wait()
		close(drainDone)
	}()
	select {
	case <-drainDone:
	case <-time.After(opts.DrainTimeout):
		// Out of time: stop, and release any .next read that blocked
		// after all (one taken just as the drain began).
		drainOver.Store(true)
		select {
		case <-drainDone:
		case <-time.After(2 * time.Second):
			killAll()
			<-drainDone
		}
	}
	res.Drain = time.Since(drainStart)
	probe := &client{queue: qdir, h: h, m: m}
	if n, err := probe.liveCount(); err != nil {
		t.Fatalf("count live messages after the drain: %v", err)
	} else {
		res.Undrained = n
	}

	// The last restart, then the final state as the mount shows it.
	killAll()
	final, err := readFinal(qdir)
	if err != nil {
		t.Fatalf("read the final state: %v", err)
	}
	res.Events, res.Final = h.Events(), final
	res.Report = Check(res.Events, final, CheckOptions{VisibilityTimeout: VisibilityTimeout, Archive: true})
	res.Runtime = time.Since(began)
	m.mu.Lock()
	res.Unexpected = m.unexpected
	m.mu.Unlock()
	if !res.Report.OK() {
		if dir, err := res.Save(opts.KeepDir); err == nil {
			t.Logf("history and final state kept in %s", dir)
		} else {
			t.Logf("could not keep the history: %v", err)
		}
	}
	return res
}

// writePolicy writes a .policy document with one write and a close whose
// result counts.
func writePolicy(path, doc string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if _, err := unix.Write(fd, []byte(doc)); err != nil {
		unix.Close(fd)
		return err
	}
	return unix.Close(fd)
}

// statWithin fails when stat(path) does not answer in time (a wedged
// mount) or fails.
func statWithin(path string, limit time.Duration) error {
	done := make(chan error, 1)
	go func() {
		_, err := os.Stat(path)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		return fmt.Errorf("stat %s: no answer in %v: the mount is wedged", path, limit)
	}
}

// dutyHolder returns the index of the one daemon whose .stats says it
// holds the store's duty, or -1.
func dutyHolder(ds []*testenv.Daemon) int {
	holder := -1
	for i, d := range ds {
		data, err := os.ReadFile(d.Path(".stats"))
		if err != nil {
			continue
		}
		var s struct {
			Duty *bool `json:"duty"`
		}
		if json.Unmarshal(data, &s) == nil && s.Duty != nil && *s.Duty {
			if holder >= 0 {
				return -1
			}
			holder = i
		}
	}
	return holder
}
