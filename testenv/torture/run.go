package torture

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

// Options say how hard to torture which store.
type Options struct {
	Backend   string        // sqlite (default) or fs
	Sync      string        // full (default), normal or off
	Kills     int           // SIGKILLs while clients run (default 20); one more follows the drain
	Producers int           // default 3
	Consumers int           // default 3
	Duration  time.Duration // the killing stops after this long even short of Kills (default 2 min)
	// MinGap and MaxGap bound the random time between a restart and the
	// next kill (default 200 ms and 800 ms).
	MinGap, MaxGap time.Duration
	DrainTimeout   time.Duration // default 30 s
	Seed           uint64        // 0: from the clock
	// KeepDir is where the history of a failed check is kept (default
	// the temporary directory).
	KeepDir string

	// Store is the daemons' --store (default: a new directory). With a
	// store several daemons share (postgres), Daemons mount it at once
	// (default 1): producer i works on daemon i%Daemons and consumer i on
	// daemon (i+1)%Daemons, so what one publishes the other consumes.
	Store   string
	Daemons int
	// KillDutyHolder makes every kill hit the daemon that holds the
	// store's duty (expiry, backoff, retention; see .stats), and waits
	// for another to take it over (Result.Takeovers).
	KillDutyHolder bool
	// RestartStore, when set, is called DBRestarts times during the kill
	// phase, between kills, to stop and start the shared store's server
	// (every daemon counts as down meanwhile).
	RestartStore func() error
	DBRestarts   int
	// MaxMessageInodes is the daemons' --max-message-inodes (default 32):
	// small, so that the pruner asks the kernel to forget inodes all the
	// time and is killed in the middle of it too.
	MaxMessageInodes int
	// DaemonArgs are more flags for the daemons (e.g. --sqlite-file-bodies).
	DaemonArgs []string
}

func (o *Options) defaults() {
	if o.Backend == "" {
		o.Backend = "sqlite"
	}
	if o.MaxMessageInodes <= 0 {
		o.MaxMessageInodes = 32
	}
	if o.Sync == "" {
		o.Sync = "full"
	}
	if o.Kills <= 0 {
		o.Kills = 20
	}
	if o.Producers <= 0 {
		o.Producers = 3
	}
	if o.Consumers <= 0 {
		o.Consumers = 3
	}
	if o.Duration <= 0 {
		o.Duration = 2 * time.Minute
	}
	if o.MinGap <= 0 {
		o.MinGap = 200 * time.Millisecond
	}
	if o.MaxGap < o.MinGap {
		o.MaxGap = max(o.MinGap, 800*time.Millisecond)
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	if o.Daemons <= 0 {
		o.Daemons = 1
	}
}

// QueueName is the queue the torture runs on.
const QueueName = "torture"

// Policy is the queue's policy, chosen so that the checker can be exact:
// short leases (expiry is part of the test), retries without backoff so
// a nacked or expired message is ready again at once (nothing waits in
// delayed/), a retry limit that a message does not reach in a run (and a
// dlq kept forever if one does), an archive without limit so that every
// acked message stays visible, and no dedup or backpressure, which would
// drop or refuse publishes for reasons other than a crash.
const Policy = `{
  "visibilityTimeoutSec": 2,
  "retry": {"limit": 100, "backoff": "fixed", "initialDelaySec": 0, "maxDelaySec": 0},
  "dlq": {"enabled": true, "retentionDays": 0},
  "archive": {"enabled": true, "retentionSec": 0, "maxMessages": 0},
  "dedupWindowSec": 0,
  "maxReady": 0
}
`

// VisibilityTimeout is Policy's lease length.
const VisibilityTimeout = 2 * time.Second

// Result is what a run did and what the checker found.
type Result struct {
	Report  *Report
	Events  []Event
	Final   []FinalMessage
	Runtime time.Duration
	// Undrained is what was still in inbox/, processing/ and delayed/
	// when the drain ended.
	Undrained int
	// Unexpected counts errors that a steady, live mount gave although
	// they are no refusal (EIO, ENOTCONN, EINTR…), by error text.
	Unexpected map[string]int
	// Restarts lists how long each restart took, to the ready handshake.
	Restarts []time.Duration
	// Exits lists how long each killed daemon took to exit after SIGKILL;
	// Serving how long from each SIGKILL until the restarted daemon
	// served the queue again (exit, start, ready, a stat of the queue).
	Exits, Serving []time.Duration
	// StuckDaemons counts the kills after which the daemon was still
	// there StuckAfter later; StuckClients lists the client calls that
	// stayed blocked longer than that; DeadMountErrors the old mounts
	// that did not answer ENOTCONN; Rescued the restarts whose daemon
	// found a wedged mount and had to abort it (see kill.go).
	// PhaseKills counts the kills while the clients worked (the drain
	// and the end add one per daemon each).
	PhaseKills      int
	StuckDaemons    int
	StuckClients    []string
	DeadMountErrors []string
	Rescued         int
	// DaemonErrors counts the ERROR lines of the daemons' logs, by
	// message (each daemon's log is read when it is killed).
	DaemonErrors map[string]int
	// KillPhase and Drain are how long the clients worked under kills,
	// and how long the drain took.
	KillPhase, Drain time.Duration
	// Takeovers are how long the duty went unheld after each kill of its
	// holder (KillDutyHolder); DBRestarts how many store restarts ran.
	Takeovers  []time.Duration
	DBRestarts int
}

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

// noteDaemonLog counts the ERROR lines of a daemon's log by message.
func (r *Result) noteDaemonLog(log string) {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "level=ERROR") {
			continue
		}
		msg := line
		if i := strings.Index(line, "msg="); i >= 0 {
			msg = line[i:]
		}
		r.DaemonErrors[msg]++
	}
}

// Save writes the history (history.jsonl) and the final state
// (final.json) to a new directory in parent (default: the temporary
// directory) that outlives the test, for a post-mortem, and returns its
// path.
func (r *Result) Save(parent string) (string, error) {
	dir, err := os.MkdirTemp(parent, "yirangmq-torture-")
	if err != nil {
		return "", err
	}
	f, err := os.Create(filepath.Join(dir, "history.jsonl"))
	if err != nil {
		return "", err
	}
	if err := WriteJSONL(f, r.Events); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	b, _ := json.MarshalIndent(r.Final, "", " ")
	if err := os.WriteFile(filepath.Join(dir, "final.json"), b, 0o644); err != nil {
		return "", err
	}
	return dir, nil
}

// produce publishes unique names until stop is closed.
func produce(c *client, rnd *rand.Rand, stop <-chan struct{}) {
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		if !c.m.waitUp() {
			return
		}
		name := fmt.Sprintf("m-%s-%06d", c.name, seq)
		size := 16 + rnd.IntN(2048)
		if rnd.IntN(20) == 0 {
			size = 16 + rnd.IntN(96<<10) // more than one FUSE write
		}
		body := MakeBody(name, size, rnd)
		e := c.publish(name, body, 1+rnd.IntN(3), rnd.IntN(10) == 0, rnd.IntN(10) == 0)
		c.h.Add(e)
		time.Sleep(time.Duration(rnd.IntN(3000)) * time.Microsecond)
	}
}

// consume leases, reads and acks (or nacks, or abandons) until the drain
// finds the queue empty or runs out of time.
func consume(c *client, rnd *rand.Rand, draining, drainOver *atomic.Bool) {
	for {
		if drainOver.Load() || !c.m.waitUp() {
			return
		}
		drain := draining.Load()
		var lease Event
		if !drain && rnd.IntN(7) == 0 {
			names, err := c.inboxNames(4)
			if err != nil || len(names) == 0 {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			lease = c.leaseRename(names[rnd.IntN(len(names))])
		} else {
			lease = c.leaseNext(drain)
		}
		lease.ID = c.h.Add(lease)
		if lease.Outcome != OK || lease.Name == "" {
			if drain && lease.Outcome == Failed {
				// Nothing ready: done once nothing can become ready.
				if n, err := c.liveCount(); err == nil && n == 0 {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			continue
		}
		c.h.Add(c.read(lease))
		time.Sleep(time.Duration(rnd.IntN(5000)) * time.Microsecond) // the work
		switch p := rnd.IntN(100); {
		case drain || p < 80:
			// An ack whose outcome is unknown is tried again once the
			// mount is back (the lease survives the restart); ENOENT
			// then means that the first one went through, or that the
			// lease ran out.
			for try := 0; try < 5; try++ {
				e := c.ack(lease)
				c.h.Add(e)
				if e.Outcome != Unknown || !c.m.waitUp() {
					break
				}
			}
		case p < 92:
			c.h.Add(c.nack(lease))
		default:
			now := c.h.Now()
			c.h.Add(Event{Kind: KindAbandon, Client: c.name, Name: lease.Name, Lease: lease.ID, Start: now, End: now, Outcome: OK})
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

// readFinal lists every state directory and reads every body, twice,
// until two readings agree (something may still be moving when the drain
// ran out of time).
func readFinal(qdir string) ([]FinalMessage, error) {
	var prev []FinalMessage
	var err error
	for try := 0; try < 20; try++ {
		var cur []FinalMessage
		cur, err = readFinalOnce(qdir)
		if err == nil && prev != nil && reflect.DeepEqual(prev, cur) {
			return cur, nil
		}
		if err == nil {
			prev = cur
			continue
		}
		prev = nil
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil {
		err = errors.New("the queue did not stand still")
	}
	return nil, err
}

func readFinalOnce(qdir string) ([]FinalMessage, error) {
	var out []FinalMessage
	for _, s := range States {
		f, err := os.Open(filepath.Join(qdir, s))
		if err != nil {
			return nil, err
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", s, err)
		}
		sort.Strings(names)
		for _, name := range names {
			body, err := readFile(filepath.Join(qdir, s, name))
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w", s, name, err)
			}
			m := FinalMessage{State: s, Name: name, Sum: Sum(body)}
			if verr := VerifyBody(name, body); verr != nil {
				m.BodyErr = verr.Error()
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// FormatUnexpected renders Result.Unexpected in one line.
func FormatUnexpected(u map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(u) {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, u[k]))
	}
	return strings.Join(parts, ", ")
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
