package backendtest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"

	"yirangmq/queuecore"
)

// This file is the bookkeeping of the crash test, kept apart from processes
// and stores so that it can be tested on its own (crashcheck_test.go feeds
// it histories with a lost commit and checks that it says so).
//
// The child reports every change twice: a "begin" line with the whole
// change (a batch, a PutQueue or a DeleteQueue) before it calls the store,
// and a "commit" line once the store returned nil. Each child worker owns
// its messages (ID % crashWorkers) and has at most one change in flight, so
// at the kill each worker has at most one change begun and not reported
// committed, touching only its own messages (and, for the queue worker, its
// own queues and the policies of the fixed ones). Recovery is right when
// every message and queue untouched by those in-flight changes is exactly
// as the committed changes left it, and, for each in-flight change, what it
// touches is either all as before it or all as after it.

// crashOp is one op of a reported batch. The body is not reported: it is
// crashBody(ID).
type crashOp struct {
	Kind queuecore.OpKind  `json:"k"`
	Msg  queuecore.Message `json:"m"`
}

// crashLine is one line of the child's stdout after crashLinePrefix.
type crashLine struct {
	Worker int `json:"w"`
	Batch  int `json:"n"`
	// begin: one of these three
	Ops         []crashOp            `json:"ops,omitempty"`
	PutQueue    *queuecore.QueueInfo `json:"put,omitempty"`
	DeleteQueue string               `json:"delq,omitempty"`

	OK  bool   `json:"ok,omitempty"`  // commit
	Err string `json:"err,omitempty"` // the store failed a change it should take
}

// crashLinePrefix marks the child's reports among whatever else the test
// binary prints.
const crashLinePrefix = "yirangmq-crash "

func (l crashLine) encode() string {
	b, err := json.Marshal(l)
	if err != nil {
		panic(err) // only plain values: cannot fail
	}
	return crashLinePrefix + string(b) + "\n"
}

// crashBody is the body of message id: a header that names the message, the
// payload's length and its CRC-32, then a payload drawn from id. Mostly
// small, sometimes empty, sometimes tens of KiB, so that a torn or stale
// body is told apart from the right one.
func crashBody(id uint64) []byte {
	r := rand.New(rand.NewPCG(id, 0xc0ffee))
	var n int
	switch r.IntN(20) {
	case 0:
		n = 0
	case 1:
		n = 32<<10 + r.IntN(32<<10)
	default:
		n = r.IntN(2048)
	}
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(r.Uint32())
	}
	header := fmt.Sprintf("message %d, %d bytes, crc32 %08x\n", id, n, crc32.ChecksumIEEE(payload))
	return append([]byte(header), payload...)
}

// explainBody says what is wrong with a body that is not crashBody(id).
func explainBody(id uint64, got []byte) string {
	header, payload, ok := bytes.Cut(got, []byte("\n"))
	var gid uint64
	var n int
	var sum uint32
	if !ok {
		return fmt.Sprintf("no header (%d bytes: %s)", len(got), abbrev(got))
	}
	if _, err := fmt.Sscanf(string(header), "message %d, %d bytes, crc32 %08x", &gid, &n, &sum); err != nil {
		return fmt.Sprintf("garbled header %q", header)
	}
	switch {
	case gid != id:
		return fmt.Sprintf("the body of message %d", gid)
	case len(payload) != n:
		return fmt.Sprintf("torn: %d payload bytes of %d", len(payload), n)
	case crc32.ChecksumIEEE(payload) != sum:
		return "payload does not match its checksum"
	}
	return "differs from the body its ID derives"
}

// crashModel is the messages of a store by ID.
type crashModel map[uint64]queuecore.Message

// apply makes ops on m with the store's rules; on error m is partly
// changed, so callers apply to a clone when they mean to try.
func (m crashModel) apply(ops []crashOp) error {
	for _, op := range ops {
		id := op.Msg.ID
		switch op.Kind {
		case queuecore.OpInsert, queuecore.OpUpdate:
			_, exists := m[id]
			if op.Kind == queuecore.OpInsert && exists {
				return fmt.Errorf("insert %d: %w", id, queuecore.ErrExists)
			}
			if op.Kind == queuecore.OpUpdate && !exists {
				return fmt.Errorf("update %d: %w", id, queuecore.ErrNotFound)
			}
			for _, o := range m {
				if o.ID != id && o.Queue == op.Msg.Queue && o.Name == op.Msg.Name && o.State.Live() == op.Msg.State.Live() {
					return fmt.Errorf("message %d takes the name of %d: %w", id, o.ID, queuecore.ErrExists)
				}
			}
			m[id] = op.Msg
		case queuecore.OpDelete:
			if _, ok := m[id]; !ok {
				return fmt.Errorf("delete %d: %w", id, queuecore.ErrNotFound)
			}
			delete(m, id)
		default:
			return fmt.Errorf("op kind %d", op.Kind)
		}
	}
	return nil
}

// restrict is the part of m with the given IDs.
func (m crashModel) restrict(ids map[uint64]bool) crashModel {
	out := crashModel{}
	for id := range ids {
		if x, ok := m[id]; ok {
			out[id] = x
		}
	}
	return out
}

// diff describes how got differs from want, "" if not at all.
func (m crashModel) diff(got crashModel) string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(m)) {
		g, ok := got[id]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%d missing", id))
		default:
			if d := diffMessage(m[id], g); d != "" {
				out = append(out, fmt.Sprintf("%d: %s", id, d))
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(got)) {
		if _, ok := m[id]; !ok {
			out = append(out, fmt.Sprintf("%d present", id))
		}
	}
	return strings.Join(out, "; ")
}

// crashHistory follows the child's reports: what the store must hold after
// the batches reported committed, and the batch each worker had in flight.
type crashHistory struct {
	want      crashModel
	queues    map[string]queuecore.QueueInfo
	lastTouch map[uint64]string // ID → the committed batch that last changed it
	inFlight  map[int]crashLine // worker → begun, not reported committed
	lastBatch map[int]int       // worker → number of its last reported batch
	committed int               // changes reported committed
	queueOps  int               // of which PutQueue or DeleteQueue
	maxGiven  uint64            // largest ID or Seq of a committed batch
	childErrs []string          // failures the child reported
}

// newCrashHistory starts from the store the previous check verified.
func newCrashHistory(start crashModel, queues []queuecore.QueueInfo, maxGiven uint64) *crashHistory {
	qs := map[string]queuecore.QueueInfo{}
	for _, q := range queues {
		qs[q.Name] = q
	}
	return &crashHistory{
		want:      maps.Clone(start),
		queues:    qs,
		lastTouch: map[uint64]string{},
		inFlight:  map[int]crashLine{},
		lastBatch: map[int]int{},
		maxGiven:  maxGiven,
	}
}

// feed reads one line of the child's stdout; lines without the prefix are
// not reports and are ignored. An error is a broken report: the child or
// the checker is wrong, not the store.
func (h *crashHistory) feed(line string) error {
	rest, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), crashLinePrefix)
	if !ok {
		return nil
	}
	var l crashLine
	if err := json.Unmarshal([]byte(rest), &l); err != nil {
		return fmt.Errorf("bad report %q: %w", line, err)
	}
	switch {
	case l.Err != "":
		h.childErrs = append(h.childErrs, fmt.Sprintf("worker %d batch %d: %s", l.Worker, l.Batch, l.Err))
		return nil
	case l.OK:
		b, ok := h.inFlight[l.Worker]
		if !ok || b.Batch != l.Batch {
			return fmt.Errorf("worker %d reports batch %d committed, but began %v", l.Worker, l.Batch, b.Batch)
		}
		delete(h.inFlight, l.Worker)
		if err := h.commit(b); err != nil {
			return fmt.Errorf("worker %d batch %d committed but impossible: %w", l.Worker, l.Batch, err)
		}
		h.lastBatch[l.Worker] = l.Batch
		h.committed++
	default:
		if b, ok := h.inFlight[l.Worker]; ok {
			return fmt.Errorf("worker %d begins batch %d with batch %d in flight", l.Worker, l.Batch, b.Batch)
		}
		kinds := 0
		for _, set := range []bool{len(l.Ops) > 0, l.PutQueue != nil, l.DeleteQueue != ""} {
			if set {
				kinds++
			}
		}
		if kinds != 1 {
			return fmt.Errorf("worker %d begins batch %d with %d kinds of change", l.Worker, l.Batch, kinds)
		}
		h.inFlight[l.Worker] = l
	}
	return nil
}

// commit applies a change reported committed to the history.
func (h *crashHistory) commit(b crashLine) error {
	by := fmt.Sprintf("worker %d batch %d", b.Worker, b.Batch)
	switch {
	case b.PutQueue != nil:
		h.queues[b.PutQueue.Name] = *b.PutQueue
		h.queueOps++
	case b.DeleteQueue != "":
		h.queueOps++
		if _, ok := h.queues[b.DeleteQueue]; !ok {
			return fmt.Errorf("delete queue %s: %w", b.DeleteQueue, queuecore.ErrNotFound)
		}
		delete(h.queues, b.DeleteQueue)
		for id, m := range h.want {
			if m.Queue == b.DeleteQueue {
				delete(h.want, id)
				h.lastTouch[id] = by + " (DeleteQueue)"
			}
		}
	default:
		for _, op := range b.Ops {
			if _, ok := h.queues[op.Msg.Queue]; !ok && op.Kind != queuecore.OpDelete {
				return fmt.Errorf("message %d in queue %s: %w", op.Msg.ID, op.Msg.Queue, queuecore.ErrNotFound)
			}
		}
		if err := h.want.apply(b.Ops); err != nil {
			return err
		}
		for _, op := range b.Ops {
			h.lastTouch[op.Msg.ID] = by
			if op.Kind != queuecore.OpDelete {
				h.maxGiven = max(h.maxGiven, op.Msg.ID, op.Msg.Seq)
			}
		}
	}
	return nil
}

// touched are the IDs and queue names that the in-flight changes touch:
// they may be as before or after those changes.
func (h *crashHistory) touched() (ids map[uint64]bool, queues map[string]bool) {
	ids, queues = map[uint64]bool{}, map[string]bool{}
	for _, b := range h.inFlight {
		for _, op := range b.Ops {
			ids[op.Msg.ID] = true
		}
		if b.PutQueue != nil {
			queues[b.PutQueue.Name] = true
		}
		if b.DeleteQueue != "" {
			queues[b.DeleteQueue] = true
			for id, m := range h.want {
				if m.Queue == b.DeleteQueue {
					ids[id] = true
				}
			}
		}
	}
	return ids, queues
}

// gone are the IDs of messages that committed changes deleted and no
// in-flight change touches: the store must not know them at all.
func (h *crashHistory) gone() []uint64 {
	touched, _ := h.touched()
	var out []uint64
	for id := range h.lastTouch {
		if _, ok := h.want[id]; !ok && !touched[id] {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// check compares a recovered store, read into snap, with the history, and
// returns every problem found (none: recovery is right).
func (h *crashHistory) check(snap *snapshot) []string {
	problems := checkConsistent(snap)
	got := crashModel(snap.messages())
	gotQueues := map[string]queuecore.QueueInfo{}
	for _, q := range snap.Queues {
		gotQueues[q.Name] = q
	}
	problems = append(problems, h.checkInFlight(got, gotQueues)...)
	problems = append(problems, h.checkCommitted(got, gotQueues)...)
	if snap.MaxID < h.maxGiven {
		problems = append(problems, fmt.Sprintf("MaxID = %d, but committed batches gave ID or Seq %d", snap.MaxID, h.maxGiven))
	}
	return problems
}

// checkInFlight: each batch in flight at the kill is absent or whole.
func (h *crashHistory) checkInFlight(got crashModel, gotQueues map[string]queuecore.QueueInfo) []string {
	var problems []string
	for _, w := range slices.Sorted(maps.Keys(h.inFlight)) {
		b := h.inFlight[w]
		what := fmt.Sprintf("worker %d batch %d %s, in flight at the kill,", w, b.Batch, b.describe())
		switch {
		case b.PutQueue != nil:
			name := b.PutQueue.Name
			old, hadOld := h.queues[name]
			g, has := gotQueues[name]
			if !(has && diffQueue(*b.PutQueue, g) == "" || hadOld && has && diffQueue(old, g) == "" || !hadOld && !has) {
				problems = append(problems, fmt.Sprintf("%s left queue %s neither as before (%v) nor as after: %+v (present: %v)", what, name, hadOld, g, has))
			}
		case b.DeleteQueue != "":
			ids := map[uint64]bool{}
			for id, m := range h.want {
				if m.Queue == b.DeleteQueue {
					ids[id] = true
				}
			}
			before, actual := h.want.restrict(ids), got.restrict(ids)
			g, has := gotQueues[b.DeleteQueue]
			if has && (before.diff(actual) != "" || diffQueue(h.queues[b.DeleteQueue], g) != "") {
				problems = append(problems, fmt.Sprintf("%s is not whole: the queue is there, its messages differ: %s", what, before.diff(actual)))
			}
			if !has && len(actual) > 0 {
				problems = append(problems, fmt.Sprintf("%s is not whole: the queue is gone, messages %v of it are left", what, slices.Sorted(maps.Keys(actual))))
			}
		default:
			ids := map[uint64]bool{}
			for _, op := range b.Ops {
				ids[op.Msg.ID] = true
			}
			before := h.want.restrict(ids)
			after := maps.Clone(before)
			if err := after.apply(b.Ops); err != nil {
				problems = append(problems, fmt.Sprintf("%s cannot apply to the committed state: %v", what, err))
				continue
			}
			actual := got.restrict(ids)
			if before.diff(actual) != "" && after.diff(actual) != "" {
				problems = append(problems, fmt.Sprintf("%s is neither absent nor whole: against before: %s; against after: %s",
					what, before.diff(actual), after.diff(actual)))
			}
		}
	}
	return problems
}

// checkCommitted: what batches reported committed left is there, and what
// they deleted is not, apart from what a batch in flight touched.
func (h *crashHistory) checkCommitted(got crashModel, gotQueues map[string]queuecore.QueueInfo) []string {
	var problems []string
	touched, touchedQueues := h.touched()
	for _, name := range slices.Sorted(maps.Keys(h.queues)) {
		if touchedQueues[name] {
			continue
		}
		g, ok := gotQueues[name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("queue %s, created by a change reported committed, is lost", name))
		case diffQueue(h.queues[name], g) != "":
			problems = append(problems, "not as reported committed: "+diffQueue(h.queues[name], g))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(gotQueues)) {
		if _, ok := h.queues[name]; !ok && !touchedQueues[name] {
			problems = append(problems, fmt.Sprintf("queue %s should not exist (deleted by a change reported committed)", name))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(h.want)) {
		if touched[id] {
			continue
		}
		want := h.want[id]
		by := h.lastTouch[id]
		if by == "" {
			by = "an earlier round"
		}
		g, ok := got[id]
		if !ok {
			problems = append(problems, fmt.Sprintf("message %d (%s/%s/%s, last changed by %s, reported committed) is lost",
				id, want.Queue, want.State, want.Name, by))
			continue
		}
		if d := diffMessage(want, g); d != "" {
			problems = append(problems, fmt.Sprintf("message %d is not as %s, reported committed, left it: %s", id, by, d))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(got)) {
		if _, ok := h.want[id]; !ok && !touched[id] {
			by := h.lastTouch[id]
			if by == "" {
				by = "no batch"
			}
			problems = append(problems, fmt.Sprintf("message %d (%s/%s/%s) should not exist (deleted by %s, reported committed)",
				id, got[id].Queue, got[id].State, got[id].Name, by))
		}
	}
	return problems
}

// checkConsistent checks what must hold of any store, whatever its history:
// every message in its list and in one place only, names unique, lists in
// order, bodies whole and right, Counts agreeing with List.
func checkConsistent(snap *snapshot) []string {
	var problems []string
	seen := map[uint64]listKey{}
	type nameKey struct {
		queue, name string
		archived    bool
	}
	names := map[nameKey]uint64{}
	counted := map[string]map[queuecore.State]queuecore.Count{}
	var maxGot uint64
	for _, k := range slices.SortedFunc(maps.Keys(snap.Lists), func(a, b listKey) int {
		return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.State, b.State))
	}) {
		ms := snap.Lists[k]
		for i, m := range ms {
			if m.Queue != k.Queue || m.State != k.State {
				problems = append(problems, fmt.Sprintf("List(%s) returned message %d of %s/%s", k, m.ID, m.Queue, m.State))
			}
			if prev, ok := seen[m.ID]; ok {
				problems = append(problems, fmt.Sprintf("message %d is in two places: %s and %s", m.ID, prev, k))
			}
			seen[m.ID] = k
			nk := nameKey{m.Queue, m.Name, m.State == archived}
			if other, ok := names[nk]; ok {
				problems = append(problems, fmt.Sprintf("messages %d and %d share the name %s/%q (archived=%v)", other, m.ID, m.Queue, m.Name, nk.archived))
			}
			names[nk] = m.ID
			if i > 0 {
				p := ms[i-1]
				if cmp.Or(cmp.Compare(p.SortKey(), m.SortKey()), cmp.Compare(p.Seq, m.Seq)) > 0 {
					problems = append(problems, fmt.Sprintf("List(%s): message %d comes before %d, out of (SortKey, Seq) order", k, p.ID, m.ID))
				}
			}
			b, ok := snap.Bodies[m.ID]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("message %d has no body", m.ID))
			case !bytes.Equal(b, crashBody(m.ID)):
				problems = append(problems, fmt.Sprintf("message %d: wrong body: %s", m.ID, explainBody(m.ID, b)))
			case int64(len(b)) != m.Size:
				problems = append(problems, fmt.Sprintf("message %d: Size %d, body %d bytes", m.ID, m.Size, len(b)))
			}
			if counted[m.Queue] == nil {
				counted[m.Queue] = map[queuecore.State]queuecore.Count{}
			}
			c := counted[m.Queue][m.State]
			counted[m.Queue][m.State] = queuecore.Count{N: c.N + 1, Bytes: c.Bytes + int64(len(b))}
			maxGot = max(maxGot, m.ID, m.Seq)
		}
	}
	if !mapsEqualCounts(counted, snap.Counts) {
		problems = append(problems, fmt.Sprintf("Counts = %v, but List gives %v", snap.Counts, counted))
	}
	if snap.MaxID < maxGot {
		problems = append(problems, fmt.Sprintf("MaxID = %d, below an ID or Seq in the store (%d)", snap.MaxID, maxGot))
	}
	return problems
}

func mapsEqualCounts(a, b map[string]map[queuecore.State]queuecore.Count) bool {
	a, b = pruneCounts(a), pruneCounts(b)
	if len(a) != len(b) {
		return false
	}
	for q, as := range a {
		if !maps.Equal(as, b[q]) {
			return false
		}
	}
	return true
}

func describeCrashOps(ops []crashOp) string {
	qops := make([]queuecore.Op, len(ops))
	for i, op := range ops {
		qops[i] = queuecore.Op{Kind: op.Kind, Msg: op.Msg}
	}
	return describeOps(qops)
}
