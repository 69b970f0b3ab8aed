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
	daemons, qdirs := startQueue(t, opts)
	r := newRunner(t, opts, daemons, qdirs)
	go r.watch()
	defer r.stopClients()
	r.startClients()
	r.killWhileWorking()
	r.drain()
	r.finish(began)
	return r.res
}

// startQueue starts the daemons, creates the queue with Policy through
// the first one, and waits until every daemon sees it; it returns the
// daemons and the queue's directory in each one's mount.
func startQueue(t *testing.T, opts Options) ([]*testenv.Daemon, []string) {
	t.Helper()
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
	return daemons, qdirs
}

// runner is one run of Run once the queue is there: the daemons and
// their mounts, the clients' history and watchdog, and the result it
// fills.
type runner struct {
	t       *testing.T
	opts    Options
	daemons []*testenv.Daemon
	qdirs   []string      // the queue's directory in each daemon's mount
	mounts  []*mountState // each mount's state, shared by its clients
	h       *History
	wd      *watchdog
	res     *Result
	rnd     *rand.Rand // picks the gaps between kills and their victims

	stuckMu                sync.Mutex // held while the watchdog adds to res.StuckClients
	producers, consumers   sync.WaitGroup
	stopProducing          chan struct{}
	draining, drainOver    atomic.Bool   // told to the consumers
	watchDone, watchExited chan struct{} // stop the watchdog; it stopped
}

// newRunner sets up a run on daemons that serve the queue: a new
// history (its clock starts now), a watchdog with no clients yet, and a
// state for every mount; the mounts share one quit channel.
func newRunner(t *testing.T, opts Options, daemons []*testenv.Daemon, qdirs []string) *runner {
	r := &runner{
		t: t, opts: opts, daemons: daemons, qdirs: qdirs,
		h:             NewHistory(),
		wd:            newWatchdog(),
		mounts:        make([]*mountState, len(daemons)),
		stopProducing: make(chan struct{}),
		watchDone:     make(chan struct{}),
		watchExited:   make(chan struct{}),
	}
	for i := range r.mounts {
		r.mounts[i] = newMountState()
		r.mounts[i].quit = r.mounts[0].quit
	}
	r.res = &Result{DaemonErrors: map[string]int{}}
	r.rnd = rand.New(rand.NewPCG(opts.Seed, 0))
	return r
}

// watch is the watchdog: a client call blocked past StuckAfter fails the
// run; then, and only then, the mounts are aborted so that it can end.
// It returns once watchDone is closed.
func (r *runner) watch() {
	defer close(r.watchExited)
	seen := map[string]bool{}
	for {
		select {
		case <-r.watchDone:
			return
		case <-time.After(500 * time.Millisecond):
		}
		stuck := r.wd.stuck(StuckAfter)
		if len(stuck) == 0 {
			continue
		}
		r.stuckMu.Lock()
		for _, s := range stuck {
			if key, _, _ := strings.Cut(s, ", thread"); !seen[key] {
				seen[key] = true
				r.res.StuckClients = append(r.res.StuckClients, s)
			}
		}
		r.stuckMu.Unlock()
		for _, dd := range r.daemons {
			abortMount(dd.Mountpoint)
		}
	}
}

// stopClients ends every client and then the watchdog, however Run
// ends: no client outlives it. A .next read blocked in a live daemon is
// released by killing the daemon.
func (r *runner) stopClients() {
	close(r.mounts[0].quit)
	done := make(chan struct{})
	go func() {
		r.producers.Wait()
		r.consumers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		for i, dd := range r.daemons {
			r.mounts[i].down()
			if _, err := killDaemon(dd); err != nil {
				r.t.Errorf("at the end of the run: %v", err)
				abortMount(dd.Mountpoint)
			}
		}
		<-done
	}
	close(r.watchDone)
	<-r.watchExited
}

// startClients starts the producers and the consumers, each on its own
// thread: producer i on daemon i%Daemons, consumer i on daemon
// (i+1)%Daemons.
func (r *runner) startClients() {
	opts := r.opts
	for i := 0; i < opts.Producers; i++ {
		k := i % len(r.daemons)
		c := &client{name: fmt.Sprintf("p%d", i), queue: r.qdirs[k], h: r.h, m: r.mounts[k]}
		r.wd.add(c)
		rnd := rand.New(rand.NewPCG(opts.Seed, uint64(100+i)))
		r.producers.Add(1)
		go func() {
			defer r.producers.Done()
			c.pin()
			defer c.unpin()
			produce(c, rnd, r.stopProducing)
		}()
	}
	for i := 0; i < opts.Consumers; i++ {
		k := (i + 1) % len(r.daemons)
		c := &client{name: fmt.Sprintf("c%d", i), queue: r.qdirs[k], h: r.h, m: r.mounts[k]}
		r.wd.add(c)
		rnd := rand.New(rand.NewPCG(opts.Seed, uint64(200+i)))
		r.consumers.Add(1)
		go func() {
			defer r.consumers.Done()
			c.pin()
			defer c.unpin()
			consume(c, rnd, &r.draining, &r.drainOver)
		}()
	}
}

// killWhileWorking kills a daemon at random moments while the clients
// work, for opts.Kills rounds or until opts.Duration has passed; with
// RestartStore, opts.DBRestarts of the rounds restart the store instead.
// Then it stops the producers and waits for them.
func (r *runner) killWhileWorking() {
	r.t.Helper()
	opts, res := r.opts, r.res
	killStart := time.Now()
	dbEvery := 0
	if opts.RestartStore != nil && opts.DBRestarts > 0 {
		dbEvery = max(1, opts.Kills/opts.DBRestarts)
	}
	for i := 0; i < opts.Kills && time.Since(killStart) < opts.Duration; i++ {
		time.Sleep(opts.MinGap + time.Duration(r.rnd.Int64N(int64(opts.MaxGap-opts.MinGap)+1)))
		if dbEvery > 0 && i%dbEvery == dbEvery-1 && res.DBRestarts < opts.DBRestarts {
			r.restartStore()
			continue
		}
		k, tookOver := r.victim()
		r.killAndRestart(k, tookOver)
		res.PhaseKills++
	}
	close(r.stopProducing)
	r.producers.Wait()
	res.KillPhase = time.Since(killStart)
}

// killAndRestart kills daemon i, calls between once it is gone, and
// restarts it.
func (r *runner) killAndRestart(i int, between func()) {
	r.t.Helper()
	killedAt := r.kill(i)
	between()
	r.restart(i, killedAt)
}

// kill kills daemon i like a supervisor, records the kill in the history
// and the daemon's log in the result, and checks that its old mount
// fails at once; it returns the time of the SIGKILL.
func (r *runner) kill(i int) time.Time {
	r.t.Helper()
	t, h, res := r.t, r.h, r.res
	d, m := r.daemons[i], r.mounts[i]
	k := Event{Kind: KindKill, Client: "runner", Start: h.Now()}
	m.down()
	r.wd.killed(m)
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
	return killedAt
}

// restart starts daemon i again, checks that it found no wedged mount
// and serves the queue, records the restart in the history and tells
// its clients the mount is up.
func (r *runner) restart(i int, killedAt time.Time) {
	r.t.Helper()
	t, h, res := r.t, r.h, r.res
	d, m, qdir := r.daemons[i], r.mounts[i], r.qdirs[i]
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

// killAll kills and restarts every daemon, one after the other.
func (r *runner) killAll() {
	for i := range r.daemons {
		r.killAndRestart(i, func() {})
	}
}

// victim picks the daemon to kill: the duty holder when asked, then
// checks, once it is killed, that another takes the duty over.
func (r *runner) victim() (int, func()) {
	t, daemons := r.t, r.daemons
	if !r.opts.KillDutyHolder || len(daemons) < 2 {
		return r.rnd.IntN(len(daemons)), func() {}
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
			t.Fatalf("kill %d: no other daemon took the duty over within 20 s", len(r.res.Restarts))
		}
		r.res.Takeovers = append(r.res.Takeovers, time.Since(killed))
	}
}

// restartStore stops and starts the shared store's server, with every
// mount counted as down and the restart in the history as a kill, and
// waits until each daemon serves again.
func (r *runner) restartStore() {
	r.t.Helper()
	t, h := r.t, r.h
	for _, m := range r.mounts {
		m.down()
	}
	ev := Event{Kind: KindKill, Client: "runner:store", Start: h.Now()}
	if err := r.opts.RestartStore(); err != nil {
		t.Fatalf("restart the store: %v", err)
	}
	ev.End, ev.Outcome = h.Now(), OK
	h.Add(ev)
	// The daemons reconnect by themselves: wait until each serves.
	for i := range r.daemons {
		if !testenv.RetryUntil(30*time.Second, func() bool {
			_, err := os.ReadDir(filepath.Join(r.qdirs[i], StateInbox))
			return err == nil
		}) {
			t.Fatalf("daemon %d did not work again within 30 s of the store's restart", i)
		}
	}
	r.res.DBRestarts++
	for _, m := range r.mounts {
		m.up()
	}
}

// drain lets the consumers empty the queue: they stop blocking and
// always ack; one more kill releases the .next reads still blocked in
// the daemon. Then it counts what is still live.
func (r *runner) drain() {
	r.t.Helper()
	res := r.res
	r.draining.Store(true)
	time.Sleep(r.opts.MinGap)
	r.killAll()
	drainStart := time.Now()
	drainDone := make(chan struct{})
	go func() {
		r.consumers.Wait()
		close(drainDone)
	}()
	select {
	case <-drainDone:
	case <-time.After(r.opts.DrainTimeout):
		// Out of time: stop, and release any .next read that blocked
		// after all (one taken just as the drain began).
		r.drainOver.Store(true)
		select {
		case <-drainDone:
		case <-time.After(2 * time.Second):
			r.killAll()
			<-drainDone
		}
	}
	res.Drain = time.Since(drainStart)
	probe := &client{queue: r.qdirs[0], h: r.h, m: r.mounts[0]}
	if n, err := probe.liveCount(); err != nil {
		r.t.Fatalf("count live messages after the drain: %v", err)
	} else {
		res.Undrained = n
	}
}

// finish kills and restarts every daemon a last time, reads the final
// state as the first mount shows it, checks the history against it, adds
// up the errors no live mount should have given, and
// keeps both when the check failed.
func (r *runner) finish(began time.Time) {
	r.t.Helper()
	t, res := r.t, r.res
	r.killAll()
	final, err := readFinal(r.qdirs[0])
	if err != nil {
		t.Fatalf("read the final state: %v", err)
	}
	res.Events, res.Final = r.h.Events(), final
	res.Report = Check(res.Events, final, CheckOptions{VisibilityTimeout: VisibilityTimeout, Archive: true})
	res.Runtime = time.Since(began)
	// Every mount's clients count their own (two daemons on a shared
	// store: both mounts).
	res.Unexpected = map[string]int{}
	for k, m := range r.mounts {
		m.mu.Lock()
		for e, n := range m.unexpected {
			if k > 0 {
				e = fmt.Sprintf("mount %d: %s", k+1, e)
			}
			res.Unexpected[e] += n
		}
		m.mu.Unlock()
	}
	if !res.Report.OK() {
		if dir, err := res.Save(r.opts.KeepDir); err == nil {
			t.Logf("history and final state kept in %s", dir)
		} else {
			t.Logf("could not keep the history: %v", err)
		}
	}
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
