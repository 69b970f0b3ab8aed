package queuecore

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"
)

// HandEdited is a Store that people may change by hand while no daemon
// runs, and that says at Open what it found changed (the fs store: its
// tree is the truth, and a person's `mv`, `cp`, `rm` or new file there is
// a transition to take, not damage to repair). The core applies each
// change once, when it opens the store, with the rules of the transition
// it means (applyHandChanges).
type HandEdited interface {
	// HandChanges returns, once, what Open found changed by hand: each
	// message as found (in the queue and state where its file is, with a
	// new ID where it had none or shared one), and how it came there.
	// Messages in it are already in the store where found; Gone ones are
	// not in it.
	HandChanges() []HandChange
}

// HandKind says how a message came to be where a store found it.
type HandKind uint8

const (
	// HandMoved: the file was moved to another state or queue (Msg) than
	// its metadata names (From, FromQueue).
	HandMoved HandKind = iota + 1
	// HandNew: a file with no metadata (written or copied in by hand):
	// Msg has a new ID, the file's times and owner, and nothing else.
	HandNew
	// HandCopied: a copy of another message's file with its metadata
	// (`cp -a`): Msg has a new ID and the copied fields; From and
	// FromQueue are where the metadata says the original was.
	HandCopied
	// HandGone: the message was in the store at the last clean stop and
	// its file is gone: removed by hand. Msg is what the store last had.
	HandGone
)

func (k HandKind) String() string {
	switch k {
	case HandMoved:
		return "moved"
	case HandNew:
		return "new"
	case HandCopied:
		return "copied"
	case HandGone:
		return "gone"
	}
	return "invalid"
}

// HandChange is one message a store found changed by hand.
type HandChange struct {
	Kind      HandKind
	Msg       Message
	From      State  // HandMoved, HandCopied: the state the metadata names
	FromQueue string // HandMoved, HandCopied: the queue the metadata names
}

// handLogMax is how many messages of one kind applyHandChanges names in
// the log at INFO; the rest go to DEBUG (the summary line counts all).
const handLogMax = 10

// applyHandChanges takes what a HandEdited store found changed by hand as
// the transitions the changes mean, once, when the core opens the store
// and before the scheduler runs, and logs one line that counts them:
//   - a move into inbox/ is a redrive (from dlq/), a give-back (from
//     processing/, attempts unchanged), a run-now (from delayed/) or a
//     replay (from archive/: a new publish of the body);
//   - a move into dlq/ is a dead-lettering by hand (reason MANUAL);
//   - a move into processing/ is a lease by nobody, which expires after
//     the visibility timeout; into delayed/, a delay of the same length;
//     into archive/, an ack;
//   - a move from another queue is a forward: a new message of this queue;
//   - a new file, or a copy of a message's file, is a new message: in
//     inbox/ a publish (fanout included);
//   - a file gone since the last clean stop was deleted by hand.
//
// A message that enters inbox/ as new (a publish, a replay, a forward, a
// redrive) is validated against the queue's policy, as a publish is, and
// kept in dlq/ with reason VALIDATION_ERROR when it fails.
func (c *Core) applyHandChanges(ctx context.Context) {
	he, ok := c.store.(HandEdited)
	if !ok {
		return
	}
	changes := he.HandChanges()
	if len(changes) == 0 {
		return
	}
	counts := map[string]int{}
	failed := 0
	for _, h := range changes {
		what, err := c.applyHand(ctx, h)
		if err != nil {
			failed++
			c.log.Error("cannot take a change made by hand; the next start tries again",
				LogQueue, h.Msg.Queue, LogName, h.Msg.Name, LogErr, err)
			continue
		}
		counts[what]++
		level := slog.LevelDebug
		if counts[what] <= handLogMax {
			level = slog.LevelInfo
		}
		c.log.Log(ctx, level, "took a change made by hand", "change", what, LogQueue, h.Msg.Queue,
			"state", h.Msg.State.Dir(), LogName, h.Msg.Name, "from", handFrom(h))
	}
	args := make([]any, 0, 2*len(counts)+2)
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		args = append(args, k, counts[k])
	}
	if failed > 0 {
		args = append(args, "failed", failed)
	}
	c.log.Info("took from the tree what was changed by hand while the daemon was stopped", args...)
}

func handFrom(h HandChange) string {
	switch {
	case h.Kind == HandNew:
		return "a new file"
	case h.Kind == HandGone:
		return ""
	case h.FromQueue != h.Msg.Queue:
		return h.FromQueue + "/" + h.From.Dir()
	}
	return h.From.Dir()
}

// applyHand takes one change made by hand and says what it was.
func (c *Core) applyHand(ctx context.Context, h HandChange) (string, error) {
	if h.Kind == HandGone {
		return "deleted", nil
	}
	q, err := c.queue(h.Msg.Queue)
	if err != nil {
		return "", err
	}
	cl := liveClaim(q, h.Msg.Name)
	if h.Msg.State == StateArchived {
		cl = archivedClaim(q, h.Msg.Name)
	}
	claims := []claim{cl}
	if err := c.acquire(claims); err != nil {
		return "", err
	}
	var b batch
	b.byDaemon = true
	defer c.finish(claims, &b)
	p := policyOf(q)
	now := c.now()
	old, m := h.Msg, c.handFresh(h, q, now)
	if m.State == StateReady {
		what, publish := c.handToReady(h, q, &m, now)
		if publish {
			// It enters the queue as new: the queue's format and schema
			// decide, as for a publish.
			return c.handPublish(ctx, q, &p, old, m, what, &b)
		}
		b.update(q, old, m)
		return what, c.commit(ctx, &b)
	}
	what := handElsewhere(h, &p, &m, now)
	if m.State == StateDead {
		b.count(func(time.Time) { q.counters.deadLettered.Add(1) })
	}
	b.update(q, old, m)
	return what, c.commit(ctx, &b)
}

// handFresh is the message of h, started over when it is new to the
// queue: a new file, a copy, a forward, a replay.
func (c *Core) handFresh(h HandChange, q *queue, now time.Time) Message {
	m := h.Msg
	if h.Kind != HandMoved || h.FromQueue != q.name || h.From == StateArchived {
		m.Attempts, m.Redrives, m.Reason, m.ReasonMessage, m.FailedAt, m.Consumer = 0, 0, "", "", time.Time{}, ""
		if h.Kind != HandNew {
			m.PublishedAt, m.FirstAt, m.StateAt = now, now, now
		}
		if h.Kind != HandMoved || m.MessageID == "" {
			m.MessageID = c.newMessageID()
		}
	}
	m.Deadline = time.Time{}
	return m
}

// handToReady is a message that came into inbox/ by hand: what it was,
// and whether it enters the queue as new (then it is published: checked
// against the policy, and copied to the fanout queues).
func (c *Core) handToReady(h HandChange, q *queue, m *Message, now time.Time) (what string, publish bool) {
	m.Seq, m.StateAt = c.newSeq(), now
	switch {
	case h.Kind == HandNew:
		m.StateAt = m.PublishedAt
		return "published", true
	case h.Kind == HandCopied:
		return "copied_and_published", true
	case h.FromQueue != q.name:
		return "forwarded", true
	case h.From == StateDead:
		m.Attempts, m.PublishedAt = 0, now
		m.Redrives++
		return "redriven", true
	case h.From == StateLeased:
		if m.ReasonMessage == "" {
			m.ReasonMessage = "given back by hand"
		}
		return "given_back", false
	case h.From == StateDelayed:
		return "run_now", false
	}
	return "replayed", true // from archive/
}

// handElsewhere is a message that came by hand into a state other than
// inbox/: dlq/ (dead-lettered), processing/ (leased by nobody), delayed/
// (delayed by the visibility timeout) or archive/ (acked).
func handElsewhere(h HandChange, p *Policy, m *Message, now time.Time) string {
	visibility := time.Duration(p.VisibilityTimeoutSec) * time.Second
	switch m.State {
	case StateDead:
		if !(h.Kind == HandMoved && h.From == StateLeased && m.FailedAt.IsZero() && m.Reason != "") {
			m.Reason, m.ReasonMessage = ReasonManual, "moved to dlq/ by hand"
		}
		m.StateAt, m.FailedAt = now, now
		return "dead_lettered"
	case StateLeased:
		m.StateAt, m.Deadline, m.Consumer = now, now.Add(visibility), "by hand"
		return "leased_by_hand"
	case StateDelayed:
		m.StateAt, m.Deadline = now, now.Add(visibility)
		return "delayed_by_hand"
	}
	m.StateAt = now // archive/
	if h.Kind == HandNew {
		m.StateAt = m.PublishedAt
	}
	return "archived_by_hand"
}

// handPublish commits m, found by hand in inbox/, as a publish would: its
// body checked against the queue's policy (kept in dlq/ when it fails),
// with the fields an envelope gives, and copied to the fanout queues. A
// body the check rewrites (an envelope's messageId and timestamp filled
// in) replaces the file: the message is deleted and published again.
func (c *Core) handPublish(ctx context.Context, q *queue, p *Policy, old, m Message, what string, b *batch) (string, error) {
	body, err := c.store.Body(ctx, m.ID)
	if err != nil {
		return "", err
	}
	now := c.now()
	chk, verr := p.checkBody(q.name, body, now)
	switch {
	case p.broken != "":
		// The queue is closed until a valid policy is written: the message
		// waits in dlq/ rather than be delivered unchecked.
		m.State, m.Reason, m.ReasonMessage, m.FailedAt, m.StateAt = StateDead, ReasonValidation, "the queue's policy cannot be loaded", now, now
		what = "rejected"
	case verr != nil:
		m.State, m.Reason, m.ReasonMessage, m.FailedAt, m.StateAt = StateDead, ReasonValidation, verr.Error(), now, now
		what = "rejected"
		c.log.Warn("a message put in inbox/ by hand failed validation, kept in dlq", LogQueue, q.name, LogName, m.Name, LogReason, verr.Error())
	default:
		m.Priority = chk.facts.Priority
		if chk.facts.MessageID != "" {
			m.MessageID = chk.facts.MessageID
		}
		if m.DedupKey == "" {
			m.DedupKey = chk.facts.DedupKey
		}
		if chk.facts.Delay > 0 {
			m.State, m.Deadline = StateDelayed, now.Add(chk.facts.Delay)
		}
	}
	if verr == nil && p.broken == "" && !bytes.Equal(chk.body, body) {
		b.remove(q, old)
		id, err := c.newID()
		if err != nil {
			return "", err
		}
		m.ID, m.Size = id, int64(len(chk.body))
		b.insert(q, m, chk.body, true)
	} else {
		b.update(q, old, m)
	}
	if m.State != StateDead {
		for _, fq := range c.fanoutQueues(q, p) {
			cp := m
			if cp.ID, err = c.newID(); err != nil {
				return "", err
			}
			cp.Seq, cp.Queue = c.newSeq(), fq.name
			b.insert(fq, cp, chk.body, true)
		}
		b.count(func(now time.Time) {
			q.counters.published.Add(1)
			if what == "redriven" {
				q.counters.redriven.Add(1)
			}
		})
	} else {
		b.count(func(time.Time) { q.counters.rejected.Add(1) })
	}
	return what, c.commit(ctx, b)
}
