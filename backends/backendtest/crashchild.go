package backendtest

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"yirangmq/queuecore"
)

// runCrashChild is the child of the crash test: it changes the store from
// crashWorkers goroutines, reporting every change before and after, until
// it is killed.
func runCrashChild(t *testing.T, open Opener, spec crashChildSpec) {
	var out sync.Mutex
	report := func(l crashLine) {
		out.Lock()
		defer out.Unlock()
		// One write per line; os.Stdout is not buffered, so a reported
		// line has reached the pipe when report returns.
		if _, err := io.WriteString(os.Stdout, l.encode()); err != nil {
			os.Exit(3)
		}
	}
	fail := func(format string, args ...any) {
		report(crashLine{Worker: -1, Err: fmt.Sprintf(format, args...)})
		os.Exit(2)
	}
	// The parent holds our stdin: when it dies, so do we.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()

	ctx := context.Background()
	mode, err := queuecore.ParseSyncMode(spec.Sync)
	if err != nil {
		fail("%v", err)
	}
	s, err := open(ctx, spec.Dir, mode)
	if err != nil {
		fail("open store: %v", err)
	}
	snap, err := readSnapshot(ctx, s)
	if err != nil {
		fail("read store: %v", err)
	}
	// Start IDs past every ID and Seq there ever was, at a multiple of
	// crashWorkers, so that ID % crashWorkers stays the owner.
	base := (snap.MaxID/crashWorkers + 1) * crashWorkers
	workers := make([]*crashWorker, crashWorkers)
	for w := range workers {
		workers[w] = &crashWorker{
			w:     w,
			r:     rand.New(rand.NewPCG(spec.Seed, uint64(w))),
			owned: crashModel{},
			next:  base + uint64(w),
		}
	}
	for id, m := range snap.messages() {
		workers[id%crashWorkers].owned[id] = m
	}
	qw := workers[crashWorkers-1]
	for _, q := range snap.Queues {
		if strings.HasPrefix(q.Name, crashTmpPrefix) {
			qw.tmp = append(qw.tmp, q.Name)
		}
	}
	for _, w := range workers {
		go func() {
			for n := 1; ; n++ {
				l := w.nextStep()
				l.Worker, l.Batch = w.w, n
				report(l)
				var err error
				switch {
				case l.PutQueue != nil:
					err = s.PutQueue(ctx, *l.PutQueue)
				case l.DeleteQueue != "":
					err = s.DeleteQueue(ctx, l.DeleteQueue)
				default:
					err = s.Apply(ctx, l.storeOps())
				}
				if err != nil {
					report(crashLine{Worker: w.w, Batch: n, Err: fmt.Sprintf("%s: %v", l.describe(), err)})
					os.Exit(2)
				}
				if err := w.done(l); err != nil {
					fail("worker %d: own model: %v", w.w, err)
				}
				report(crashLine{Worker: w.w, Batch: n, OK: true})
			}
		}()
	}
	select {} // until killed
}

// storeOps are the ops of a reported batch, with their bodies.
func (l crashLine) storeOps() []queuecore.Op {
	ops := make([]queuecore.Op, len(l.Ops))
	for i, op := range l.Ops {
		ops[i] = queuecore.Op{Kind: op.Kind, Msg: op.Msg}
		if op.Kind == queuecore.OpInsert {
			ops[i].Body = crashBody(op.Msg.ID)
		}
	}
	return ops
}

// describe is the change of a begin line, for messages.
func (l crashLine) describe() string {
	switch {
	case l.PutQueue != nil:
		return fmt.Sprintf("PutQueue(%s)", l.PutQueue.Name)
	case l.DeleteQueue != "":
		return fmt.Sprintf("DeleteQueue(%s)", l.DeleteQueue)
	}
	return "Apply" + describeCrashOps(l.Ops)
}

// crashWorker makes the changes of one child goroutine, on its own
// messages only, with the transitions queuecore makes.
type crashWorker struct {
	w     int
	r     *rand.Rand
	owned crashModel
	next  uint64   // next ID or Seq: steps of crashWorkers
	tmp   []string // the queue worker's queues
}

func (w *crashWorker) isQueueWorker() bool { return w.w == crashWorkers-1 }

func (w *crashWorker) alloc() uint64 {
	v := w.next
	w.next += crashWorkers
	return v
}

// done records a change the store committed.
func (w *crashWorker) done(l crashLine) error {
	switch {
	case l.PutQueue != nil:
		if strings.HasPrefix(l.PutQueue.Name, crashTmpPrefix) && !slices.Contains(w.tmp, l.PutQueue.Name) {
			w.tmp = append(w.tmp, l.PutQueue.Name)
		}
	case l.DeleteQueue != "":
		w.tmp = slices.DeleteFunc(w.tmp, func(q string) bool { return q == l.DeleteQueue })
		maps.DeleteFunc(w.owned, func(_ uint64, m queuecore.Message) bool { return m.Queue == l.DeleteQueue })
	default:
		return w.owned.apply(l.Ops)
	}
	return nil
}

// nextStep is the next change, one the store must take.
func (w *crashWorker) nextStep() crashLine {
	for {
		if w.isQueueWorker() {
			if l, ok := w.queueStep(); ok {
				return l
			}
		}
		ops := w.draw(w.queues())
		if len(ops) == 0 {
			continue
		}
		if err := maps.Clone(w.owned).apply(ops); err != nil {
			continue // a name clash: draw again
		}
		return crashLine{Ops: ops}
	}
}

// queues are where the worker puts messages.
func (w *crashWorker) queues() []string {
	if w.isQueueWorker() {
		return w.tmp
	}
	return crashQueues
}

// queueStep is a change of queues, or ok=false for a change of messages.
func (w *crashWorker) queueStep() (crashLine, bool) {
	k := w.r.IntN(100)
	switch {
	case len(w.tmp) == 0 || k < 5 && len(w.tmp) < 3:
		q := queueInfo(fmt.Sprintf("%s%d", crashTmpPrefix, w.alloc()))
		q.CreatedAt = at(time.Duration(w.next) * time.Millisecond)
		return crashLine{PutQueue: &q}, true
	case k < 15: // a new policy for a queue that stays
		q := queueInfo(crashQueues[w.r.IntN(len(crashQueues))])
		q.Policy = fmt.Appendf(nil, `{"generation":%d}`, w.alloc())
		q.Mode = 0o700 | uint32(w.r.IntN(0o100))
		return crashLine{PutQueue: &q}, true
	case k < 30: // a queue goes with its messages
		return crashLine{DeleteQueue: w.tmp[w.r.IntN(len(w.tmp))]}, true
	}
	return crashLine{}, false
}

// newMessage is a new message with a fresh ID and Seq in state st.
func (w *crashWorker) newMessage(q, name string, st queuecore.State) queuecore.Message {
	id := w.alloc()
	if name == "" {
		name = fmt.Sprintf("n%d", id) // a lineage: forwards and replays keep it
	}
	now := at(time.Duration(id) * time.Millisecond)
	m := queuecore.Message{
		ID: id, Queue: q, Name: name, State: st, Seq: w.alloc(),
		Priority:  w.r.IntN(3),
		Size:      int64(len(crashBody(id))),
		MessageID: fmt.Sprintf("crash-%d", id), PublishedAt: now, FirstAt: now, StateAt: now,
		UID: 1000, GID: 1000,
	}
	if st == delayed || st == leased {
		m.Deadline = now.Add(time.Duration(w.r.IntN(60)) * time.Second)
	}
	if st == dead {
		m.Reason = queuecore.ReasonValidation
	}
	return m
}

// move is m in state st, with what queuecore changes on that transition.
func (w *crashWorker) move(m queuecore.Message, st queuecore.State) queuecore.Message {
	now := at(time.Duration(w.next) * time.Millisecond)
	m.State, m.StateAt, m.Deadline = st, now, time.Time{}
	switch st {
	case ready:
		m.Seq = w.alloc()
	case leased:
		m.Deadline = now.Add(30 * time.Second)
		m.Consumer = fmt.Sprintf("uid 1000 pid %d worker", 100+w.w)
	case delayed:
		m.Deadline = now.Add(time.Duration(1+w.r.IntN(10)) * time.Second)
		m.Attempts++
		m.Reason, m.FailedAt = queuecore.ReasonNacked, now
	case dead:
		m.Reason, m.ReasonMessage = queuecore.ReasonLeaseExpired, "retry limit spent"
	}
	return m
}

func (w *crashWorker) pick(filter func(queuecore.Message) bool) (queuecore.Message, bool) {
	var c []uint64
	for id, m := range w.owned {
		if filter == nil || filter(m) {
			c = append(c, id)
		}
	}
	if len(c) == 0 {
		return queuecore.Message{}, false
	}
	slices.Sort(c)
	return w.owned[c[w.r.IntN(len(c))]], true
}

// otherQueue is a queue of qs other than q, "" if there is none.
func (w *crashWorker) otherQueue(q string, qs []string) string {
	others := slices.DeleteFunc(slices.Clone(qs), func(o string) bool { return o == q })
	if len(others) == 0 {
		return ""
	}
	return others[w.r.IntN(len(others))]
}

func live(m queuecore.Message) bool { return m.State.Live() }

// transition is the op that moves m on, as a consumer or queuecore would:
// lease, nack, backoff, dead-letter, ack to archive, redrive.
func (w *crashWorker) transition(m queuecore.Message) []crashOp {
	var to queuecore.State
	switch m.State {
	case ready:
		to = leased
	case leased:
		to = []queuecore.State{ready, delayed, dead, archived, archived}[w.r.IntN(5)]
	case delayed:
		to = ready
	case dead:
		to = ready
		m.Redrives++
		m.Attempts = 0
	case archived:
		return []crashOp{{queuecore.OpDelete, queuecore.Message{ID: m.ID}}} // retention
	}
	return w.archiveSafe([]crashOp{{queuecore.OpUpdate, w.move(m, to)}})
}

// archiveSafe prepends the delete of an owned archived message whose name
// an archived message of ops would take (the archive keeps the latest).
func (w *crashWorker) archiveSafe(ops []crashOp) []crashOp {
	last := ops[len(ops)-1].Msg
	if last.State != archived {
		return ops
	}
	for id, o := range w.owned {
		if id != last.ID && o.State == archived && o.Queue == last.Queue && o.Name == last.Name {
			return append([]crashOp{{queuecore.OpDelete, queuecore.Message{ID: id}}}, ops...)
		}
	}
	return ops
}

// draw makes a batch on the worker's messages in queues qs; nil when the
// draw fits nothing the worker has.
func (w *crashWorker) draw(qs []string) []crashOp {
	if len(qs) == 0 {
		return nil
	}
	q := qs[w.r.IntN(len(qs))]
	k := w.r.IntN(100)
	if len(w.owned) > 60 && k < 50 {
		k = 95 // too many: delete
	}
	switch {
	case k < 20: // publish, sometimes with a delay, sometimes rejected to dlq/
		st := []queuecore.State{ready, ready, ready, ready, delayed, dead}[w.r.IntN(6)]
		return []crashOp{{queuecore.OpInsert, w.newMessage(q, "", st)}}
	case k < 28: // publish to several queues at once (fanout), one name
		name := ""
		var ops []crashOp
		for _, fq := range qs[:min(len(qs), 2+w.r.IntN(2))] {
			m := w.newMessage(fq, name, ready)
			name = m.Name
			ops = append(ops, crashOp{queuecore.OpInsert, m})
		}
		return ops
	case k < 60: // one transition
		m, ok := w.pick(nil)
		if !ok {
			return nil
		}
		return w.transition(m)
	case k < 70: // ack and forward: gone here, published there, one step
		m, ok := w.pick(func(m queuecore.Message) bool { return m.State == leased })
		to := w.otherQueue(m.Queue, qs)
		if !ok || to == "" {
			return nil
		}
		fwd := w.newMessage(to, m.Name, ready)
		return []crashOp{{queuecore.OpDelete, queuecore.Message{ID: m.ID}}, {queuecore.OpInsert, fwd}}
	case k < 76: // a message moved to another queue, keeping its ID
		m, ok := w.pick(nil)
		to := w.otherQueue(m.Queue, qs)
		if !ok || to == "" {
			return nil
		}
		m.Queue = to
		return w.archiveSafe([]crashOp{{queuecore.OpUpdate, m}})
	case k < 80: // replay an archived message: a new publish of its name
		m, ok := w.pick(func(m queuecore.Message) bool { return m.State == archived })
		if !ok {
			return nil
		}
		return []crashOp{{queuecore.OpInsert, w.newMessage(m.Queue, m.Name, ready)}}
	case k < 88: // two messages move in one batch
		a, ok1 := w.pick(live)
		b, ok2 := w.pick(live)
		if !ok1 || !ok2 || a.ID == b.ID {
			return nil
		}
		return append(w.transition(a), w.transition(b)...)
	default: // delete (purge, rm)
		m, ok := w.pick(nil)
		if !ok {
			return nil
		}
		return []crashOp{{queuecore.OpDelete, queuecore.Message{ID: m.ID}}}
	}
}
