package queuecore

import (
	"encoding/json"
	"time"
)

// A refused publish or policy is not always seen by its writer: a shell's
// builtin echo ignores the error of close(2), and a file committed at
// RELEASE has nobody left to tell. So each queue keeps its last refusals
// in memory, shown by QUEUE/.stats and `yirangmq status`, and a refused
// .policy reads back with its refusal ("lastRefused"), until a valid one
// is written. They are this daemon's, since it started.

// Refusal is one operation on a queue refused for its input or for want
// of room: what was named, by whom, the errno the caller got and why.
type Refusal struct {
	At     time.Time `json:"at"`
	Name   string    `json:"name"`  // the message's name, or ".policy"
	Errno  string    `json:"errno"` // EINVAL, EPERM, ...
	Reason string    `json:"reason"`
	UID    uint32    `json:"uid"`
}

// keptRefusals is how many refusals a queue keeps (QueueStats.LastRefusals).
const keptRefusals = 5

// refusals is a queue's last refusals, oldest first, and their count;
// guarded by the queue's mutex.
type refusals struct {
	last   []Refusal
	total  int64
	policy *Refusal // the last .policy written, refused (until a valid one)
}

func (r *refusals) add(x Refusal) {
	if len(r.last) == keptRefusals {
		copy(r.last, r.last[1:])
		r.last = r.last[:keptRefusals-1]
	}
	r.last = append(r.last, x)
	r.total++
}

// newestFirst is a copy of the last refusals, the newest first.
func (r *refusals) newestFirst() []Refusal {
	out := make([]Refusal, len(r.last))
	for i, x := range r.last {
		out[len(out)-1-i] = x
	}
	return out
}

// NoteRefusal records a refused operation on a queue (the filesystem
// layer calls it where it answers with the errno); a queue that is gone
// is ignored. A refusal of a .policy is NotePolicyRefusal.
func (c *Core) NoteRefusal(queueName string, r Refusal) {
	q, err := c.queue(queueName)
	if err != nil {
		return
	}
	if r.At.IsZero() {
		r.At = c.now()
	}
	q.mu.Lock()
	q.refused.add(r)
	q.mu.Unlock()
}

// NotePolicyRefusal records a .policy document that was refused: it
// counts as a refusal of the queue, and .policy reads back with it
// (PolicyDocument) until a valid policy is written.
func (c *Core) NotePolicyRefusal(queueName string, r Refusal) {
	q, err := c.queue(queueName)
	if err != nil {
		return
	}
	if r.At.IsZero() {
		r.At = c.now()
	}
	r.Name = ".policy"
	q.mu.Lock()
	q.refused.add(r)
	q.refused.policy = &r
	q.mu.Unlock()
}

// policyAccepted forgets the refusal of an earlier .policy.
func (q *queue) policyAccepted() {
	q.mu.Lock()
	q.refused.policy = nil
	q.mu.Unlock()
}

// policyDoc is .policy as it reads: the policy in effect, every field, and
// the refusal of the last document written, if it was refused.
type policyDoc struct {
	Policy
	LastRefused *Refusal `json:"lastRefused,omitempty"`
}

// PolicyDocument renders a queue's .policy: the policy in effect with
// every default filled in and, when the last document written to it was
// refused, that refusal under "lastRefused" (ignored when written back).
func (c *Core) PolicyDocument(name string) ([]byte, error) {
	q, err := c.queue(name)
	if err != nil {
		return nil, err
	}
	q.mu.Lock()
	d := policyDoc{Policy: q.policy, LastRefused: q.refused.policy}
	q.mu.Unlock()
	b, _ := json.MarshalIndent(d, "", "  ")
	return append(b, '\n'), nil
}
