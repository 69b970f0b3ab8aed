package torture

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// The state directories of a queue, as named in a mount.
const (
	StateInbox      = "inbox"
	StateProcessing = "processing"
	StateDelayed    = "delayed"
	StateDLQ        = "dlq"
	StateArchive    = "archive"
)

// States lists the state directories, live ones first.
var States = []string{StateInbox, StateProcessing, StateDelayed, StateDLQ, StateArchive}

func isLive(state string) bool { return state != StateArchive }

// FinalMessage is a message found through the mount after the last
// restart.
type FinalMessage struct {
	State   string `json:"state"` // one of States
	Name    string `json:"name"`
	Sum     string `json:"sum"`
	BodyErr string `json:"body_err,omitempty"` // what is wrong with its bytes
}

// CheckOptions describe the queue the history ran against.
type CheckOptions struct {
	// VisibilityTimeout is the queue's lease length: a leased message
	// may not be leased again before it passed (unless nacked).
	VisibilityTimeout time.Duration
	// Archive says acked messages are kept in archive/ without limit, so
	// an ack that returned 0 must leave the message there, and every
	// committed message must still be found somewhere.
	Archive bool
	// Slack absorbs the difference between the daemon's clock and the
	// history's (default 250 ms).
	Slack time.Duration
}

// Redelivery causes: why a delivery was followed by another of the same
// message.
const (
	CauseNack    = "nack"    // the consumer (or another holder of the name) nacked it
	CauseAbandon = "abandon" // the consumer let the lease run out on purpose
	CauseKill    = "kill"    // the lease was in flight when the daemon was killed
	CauseExpired = "expired" // the consumer held it past the visibility timeout
)

// Report is what Check found. Errors lists every violation; the counts
// describe the run.
type Report struct {
	Publishes        int // publish attempts
	Committed        int // publishes whose close(2) (or draft rename) returned 0
	UnknownPublishes int // publishes whose outcome is unknown
	FailedPublishes  int // publishes refused or never started (no effect)
	Delivered        int // distinct messages leased at least once
	Deliveries       int // leases observed (a .next name or a rename that returned 0)
	Acked            int // messages whose ack returned 0
	UnknownAcks      int // ack calls with an unknown outcome
	Nacks            int // nacks that returned 0
	Abandons         int // leases left to expire on purpose
	Kills            int
	// InFlightAtKills sums, over the kills, the leases held or being
	// taken when the daemon died: the bound on kill-caused redeliveries.
	InFlightAtKills int
	Final           map[string]int // messages per state directory after the last restart

	Lost            []string // committed, never delivered, and not live at the end
	Vanished        []string // with Archive: committed and found in no state at the end
	BadBytes        []string // deliveries or final bodies with wrong bytes
	Duplicates      int      // messages delivered more than once
	ExtraDeliveries int      // deliveries beyond the first, summed
	Redelivered     map[string]int

	// Errors are violations of the contract that only the daemon can
	// have caused: the test fails on them.
	Errors []string
	// RenameAnomalies are violations of lease exclusivity that a
	// rename(2) into processing/ reported although the message was
	// already leased: a lease the queue may never have granted, since the
	// kernel answers a rename between two names of one inode with 0
	// without asking the filesystem (see doc.go). They are reported
	// apart so that they neither hide nor pass for daemon bugs.
	RenameAnomalies []string
}

// OK reports whether the history and the final state are consistent.
func (r *Report) OK() bool { return len(r.Errors) == 0 }

func (r *Report) errorf(format string, args ...any) {
	r.Errors = append(r.Errors, fmt.Sprintf(format, args...))
}

// leaseViolation records a second lease that should not have been
// granted: an error when the queue granted it (.next), an anomaly when
// only a rename(2) said so.
func (r *Report) leaseViolation(l Event, format string, args ...any) {
	if l.Kind == KindLeaseRename {
		r.RenameAnomalies = append(r.RenameAnomalies, fmt.Sprintf(format, args...))
		return
	}
	r.errorf(format, args...)
}

// Summary is one paragraph of numbers.
func (r *Report) Summary() string {
	var causes []string
	for _, c := range []string{CauseNack, CauseAbandon, CauseKill, CauseExpired} {
		causes = append(causes, fmt.Sprintf("%s %d", c, r.Redelivered[c]))
	}
	var final []string
	for _, s := range States {
		final = append(final, fmt.Sprintf("%s %d", s, r.Final[s]))
	}
	return fmt.Sprintf("kills %d; publishes %d (committed %d, unknown %d, failed %d); "+
		"delivered %d messages in %d deliveries; acked %d (unknown acks %d), nacks %d, abandoned %d; "+
		"lost %d, vanished %d, bad bytes %d; duplicates %d (%d extra deliveries: %s; leases in flight at kills %d); "+
		"final: %s; violations %d, rename anomalies %d",
		r.Kills, r.Publishes, r.Committed, r.UnknownPublishes, r.FailedPublishes,
		r.Delivered, r.Deliveries, r.Acked, r.UnknownAcks, r.Nacks, r.Abandons,
		len(r.Lost), len(r.Vanished), len(r.BadBytes), r.Duplicates, r.ExtraDeliveries, strings.Join(causes, ", "), r.InFlightAtKills,
		strings.Join(final, ", "), len(r.Errors), len(r.RenameAnomalies))
}

// Check holds a history against the queue as found after the last
// restart. It verifies:
//   - nothing committed is lost: every message whose publish returned 0
//     was delivered at least once or is still live (inbox, processing,
//     delayed, dlq); with Archive, every committed message is still found
//     somewhere, and every ack that returned 0 left its message in
//     archive/ and in no live state;
//   - no wrong bytes: every body read after a lease, and every body in
//     the final state, verifies on its own and matches what its publish
//     wrote;
//   - no message in two states at once in the final listing, and none
//     that nobody published (or whose publish never reached a daemon);
//   - no delivery after an ack of the message returned 0, no second ack
//     that returns 0, no nack that returns 0 after an ack did;
//   - no redelivery before the lease it follows could have expired,
//     unless the message was nacked in between (this is also how a lease
//     lost in a restart shows up);
//   - duplicates are counted and explained: each delivery beyond the
//     first follows a nack, an abandoned lease, a lease in flight at a
//     kill, or a lease held past its deadline; kill-caused ones are
//     bounded by the leases in flight at the kills.
func Check(events []Event, final []FinalMessage, opts CheckOptions) *Report {
	if opts.Slack == 0 {
		opts.Slack = 250 * time.Millisecond
	}
	c := newChecker(opts)
	c.sortHistory(events)
	c.checkReads()
	c.checkFinal(final)
	c.checkLeases()
	c.checkLost()
	c.checkAcks()
	c.checkArchived()
	c.checkRedeliveries()
	c.checkKills()
	return c.r
}

// checker is one run of Check: the report it fills, and the history
// sorted by kind of call, by message and by lease, beside the states each
// name was found in at the end.
type checker struct {
	r    *Report
	opts CheckOptions

	publishes                map[string]Event
	leases                   map[string][]Event  // observed leases (OK), by message
	byLease                  map[int][]Event     // read, ack, nack, abandon by lease event
	acks                     map[string][]Event  // every ack call, by message
	nacks                    map[string][]Event  // every nack call, by message
	reads, kills, leaseCalls []Event             // reads that returned 0, kills, every lease call
	where                    map[string][]string // the final states of each name
}

func newChecker(opts CheckOptions) *checker {
	return &checker{
		r:         &Report{Final: map[string]int{}, Redelivered: map[string]int{}},
		opts:      opts,
		publishes: map[string]Event{},
		leases:    map[string][]Event{},
		byLease:   map[int][]Event{},
		acks:      map[string][]Event{},
		nacks:     map[string][]Event{},
		where:     map[string][]string{},
	}
}

// sortHistory files every event under its kind of call, counts the calls
// in the report, and puts the kills in the order they started.
func (c *checker) sortHistory(events []Event) {
	r := c.r
	for _, e := range events {
		switch e.Kind {
		case KindPublish:
			r.Publishes++
			if prev, dup := c.publishes[e.Name]; dup {
				r.errorf("name %q published twice (#%d and #%d): the torture must use unique names", e.Name, prev.ID, e.ID)
			}
			c.publishes[e.Name] = e
			switch e.Outcome {
			case OK:
				r.Committed++
			case Unknown:
				r.UnknownPublishes++
			default:
				r.FailedPublishes++
			}
		case KindLease, KindLeaseRename:
			c.leaseCalls = append(c.leaseCalls, e)
			if e.BodyErr != "" {
				r.BadBytes = append(r.BadBytes, e.String())
				r.errorf("bad lease reply: %s", e)
			}
			if e.Outcome == OK && e.Name != "" {
				c.leases[e.Name] = append(c.leases[e.Name], e)
				r.Deliveries++
			}
		case KindRead:
			c.byLease[e.Lease] = append(c.byLease[e.Lease], e)
			if e.Outcome == OK {
				c.reads = append(c.reads, e)
			}
		case KindAck:
			c.byLease[e.Lease] = append(c.byLease[e.Lease], e)
			c.acks[e.Name] = append(c.acks[e.Name], e)
			if e.Outcome == Unknown {
				r.UnknownAcks++
			}
		case KindNack:
			c.byLease[e.Lease] = append(c.byLease[e.Lease], e)
			c.nacks[e.Name] = append(c.nacks[e.Name], e)
			if e.Outcome == OK {
				r.Nacks++
			}
		case KindAbandon:
			c.byLease[e.Lease] = append(c.byLease[e.Lease], e)
			r.Abandons++
		case KindKill:
			c.kills = append(c.kills, e)
		}
	}
	r.Kills = len(c.kills)
	sort.Slice(c.kills, func(i, j int) bool { return c.kills[i].Start < c.kills[j].Start })
}

// known checks what a name must be, whoever shows it to us: published,
// by a publish that did not fail.
func (c *checker) known(name, where string) {
	p, ok := c.publishes[name]
	switch {
	case !ok:
		c.r.errorf("%s: %q was never published", where, name)
	case p.Outcome == Failed:
		c.r.errorf("%s: %q appeared, but its publish never reached a live daemon or was refused: %s", where, name, p)
	}
}

// checkBytes checks a body that was read: it verifies on its own and its
// checksum is the one its publish recorded.
func (c *checker) checkBytes(name, sum, bodyErr, where string) {
	if bodyErr != "" {
		c.r.BadBytes = append(c.r.BadBytes, fmt.Sprintf("%s %s: %s", where, name, bodyErr))
		c.r.errorf("wrong bytes: %s %s: %s", where, name, bodyErr)
		return
	}
	if p, ok := c.publishes[name]; ok && p.Sum != "" && p.Sum != sum {
		c.r.BadBytes = append(c.r.BadBytes, fmt.Sprintf("%s %s: checksum %.12s, published %.12s", where, name, sum, p.Sum))
		c.r.errorf("wrong bytes: %s %s: checksum %.12s differs from the published %.12s", where, name, sum, p.Sum)
	}
}

// checkReads checks the bodies read after a lease.
func (c *checker) checkReads() {
	for _, e := range c.reads {
		c.known(e.Name, fmt.Sprintf("read #%d", e.ID))
		c.checkBytes(e.Name, e.Sum, e.BodyErr, fmt.Sprintf("read #%d of", e.ID))
	}
}

// checkFinal counts the final state by state directory and checks it:
// one place per name, right bytes, nothing unknown.
func (c *checker) checkFinal(final []FinalMessage) {
	for _, m := range final {
		c.r.Final[m.State]++
		c.where[m.Name] = append(c.where[m.Name], m.State)
		c.known(m.Name, "final "+m.State+"/")
		c.checkBytes(m.Name, m.Sum, m.BodyErr, "final "+m.State+"/")
	}
	for _, name := range sortedKeys(c.where) {
		if states := c.where[name]; len(states) > 1 {
			c.r.errorf("%q is in %s at once", name, strings.Join(states, " and "))
		}
	}
}

// live reports whether name is in a live state at the end.
func (c *checker) live(name string) bool {
	for _, s := range c.where[name] {
		if isLive(s) {
			return true
		}
	}
	return false
}

// inArchive reports whether name is in archive/ at the end.
func (c *checker) inArchive(name string) bool {
	for _, s := range c.where[name] {
		if s == StateArchive {
			return true
		}
	}
	return false
}

// checkLeases puts each message's observed leases in the order they
// ended, checks that every leased name was published, and counts the
// messages delivered.
func (c *checker) checkLeases() {
	for name, ls := range c.leases {
		sort.Slice(ls, func(i, j int) bool { return ls[i].End < ls[j].End })
		c.leases[name] = ls
		c.known(name, fmt.Sprintf("lease #%d", ls[0].ID))
	}
	c.r.Delivered = len(c.leases)
}

// checkLost checks that nothing committed is lost: never delivered and
// not live at the end, or, with Archive, found in no state at all.
func (c *checker) checkLost() {
	for _, name := range sortedKeys(c.publishes) {
		p := c.publishes[name]
		committed := p.Outcome == OK || len(c.leases[name]) > 0
		if p.Outcome == OK && len(c.leases[name]) == 0 && !c.live(name) {
			c.r.Lost = append(c.r.Lost, name)
			c.r.errorf("lost: %q was committed (%s), never delivered, and is not in inbox, processing, delayed or dlq at the end (found in: %v)",
				name, p, c.where[name])
		}
		if c.opts.Archive && committed && len(c.where[name]) == 0 {
			c.r.Vanished = append(c.r.Vanished, name)
			c.r.errorf("vanished: %q was committed and is in no state at the end; its history: %s", name, historyOf(name, p, c.leases, c.acks, c.nacks))
		}
	}
}

// checkAcks checks the acks that returned 0 and what they leave behind:
// one per message, the message out of every live state (and, with
// Archive, in archive/), and no successful nack or lease after it.
func (c *checker) checkAcks() {
	for _, name := range sortedKeys(c.acks) {
		var okAcks []Event
		for _, a := range c.acks[name] {
			if a.Outcome == OK {
				okAcks = append(okAcks, a)
			}
		}
		if len(okAcks) == 0 {
			continue
		}
		c.r.Acked++
		if len(okAcks) > 1 {
			c.r.errorf("%q acked twice with success: %s and %s", name, okAcks[0], okAcks[1])
		}
		first := okAcks[0]
		for _, a := range okAcks[1:] {
			if a.End < first.End {
				first = a
			}
		}
		if c.live(name) {
			c.r.errorf("%q is live (%v) at the end although its ack returned 0: %s", name, c.where[name], first)
		} else if c.opts.Archive && !c.inArchive(name) {
			c.r.errorf("%q is not in archive/ at the end although its ack returned 0: %s", name, first)
		}
		for _, n := range c.nacks[name] {
			if n.Outcome == OK && n.Start > first.End {
				c.r.errorf("%q nacked with success (%s) after its ack returned 0 (%s)", name, n, first)
			}
		}
		for _, l := range c.leases[name] {
			if l.Start > first.End {
				c.r.leaseViolation(l, "%q delivered again (%s) after its ack returned 0 (%s)", name, l, first)
			}
		}
	}
}

// checkArchived checks that every message in archive/ at the end had an
// ack that reached the daemon.
func (c *checker) checkArchived() {
	for _, name := range sortedKeys(c.where) {
		if !c.inArchive(name) {
			continue
		}
		attempted := false
		for _, a := range c.acks[name] {
			attempted = attempted || a.Outcome != Failed
		}
		if !attempted {
			c.r.errorf("%q is in archive/ but no ack of it ever reached the daemon", name)
		}
	}
}

// terminalEnd is when the last ack, nack or abandon of lease l ended, or
// -1 when it had none.
func (c *checker) terminalEnd(l Event) time.Duration {
	end := time.Duration(-1)
	for _, e := range c.byLease[l.ID] {
		if e.Kind != KindRead && e.End > end {
			end = e.End
		}
	}
	return end
}

// checkRedeliveries counts the messages delivered more than once and the
// cause of each delivery beyond the first, and checks that none came
// before the lease it follows could have expired, unless it was nacked.
func (c *checker) checkRedeliveries() {
	for _, name := range sortedKeys(c.leases) {
		ls := c.leases[name]
		if len(ls) < 2 {
			continue
		}
		c.r.Duplicates++
		c.r.ExtraDeliveries += len(ls) - 1
		for i := 1; i < len(ls); i++ {
			prev, cur := ls[i-1], ls[i]
			cause, nacked := c.redeliveryCause(name, prev, cur)
			c.r.Redelivered[cause]++
			if !nacked && cur.End+c.opts.Slack < prev.Start+c.opts.VisibilityTimeout {
				c.r.leaseViolation(cur, "%q redelivered %v after it was leased, before its visibility timeout (%v) and with no nack: %s then %s",
					name, (cur.End - prev.Start).Round(time.Millisecond), c.opts.VisibilityTimeout, prev, cur)
			}
		}
	}
}

// redeliveryCause says why lease cur of name followed lease prev, and
// whether anyone holding the name nacked it between the two.
func (c *checker) redeliveryCause(name string, prev, cur Event) (cause string, nacked bool) {
	for _, n := range c.nacks[name] {
		if n.Outcome != Failed && n.End > prev.Start && n.Start < cur.End {
			nacked = true
		}
	}
	own := c.byLease[prev.ID]
	end := c.terminalEnd(prev)
	if end < 0 {
		end = cur.End
	}
	switch {
	case hasKind(own, KindNack, OK):
		return CauseNack, nacked
	case hasKind(own, KindAbandon, OK):
		return CauseAbandon, nacked
	case killBetween(c.kills, prev.Start, end):
		return CauseKill, nacked
	case nacked:
		return CauseNack, nacked
	}
	return CauseExpired, nacked
}

// checkKills counts the leases in flight at each kill: taken (or being
// taken) before it, and not yet acked, nacked or abandoned when it came;
// no more redeliveries than that may follow kills.
func (c *checker) checkKills() {
	for _, k := range c.kills {
		for _, l := range c.leaseCalls {
			if l.Start >= k.Start || l.Outcome == Failed {
				continue
			}
			end := l.End
			if l.Outcome == OK {
				if t := c.terminalEnd(l); t >= 0 {
					end = t
				} else {
					end = math.MaxInt64
				}
			}
			if end >= k.Start {
				c.r.InFlightAtKills++
			}
		}
	}
	if c.r.Redelivered[CauseKill] > c.r.InFlightAtKills {
		c.r.errorf("%d redeliveries follow kills, more than the %d leases in flight at the kills", c.r.Redelivered[CauseKill], c.r.InFlightAtKills)
	}
}

func hasKind(events []Event, k Kind, o Outcome) bool {
	for _, e := range events {
		if e.Kind == k && e.Outcome == o {
			return true
		}
	}
	return false
}

func killBetween(kills []Event, from, to time.Duration) bool {
	for _, k := range kills {
		if k.Start > from && k.Start <= to {
			return true
		}
	}
	return false
}

func historyOf(name string, p Event, leases, acks, nacks map[string][]Event) string {
	all := []Event{p}
	all = append(all, leases[name]...)
	all = append(all, acks[name]...)
	all = append(all, nacks[name]...)
	sort.Slice(all, func(i, j int) bool { return all[i].Start < all[j].Start })
	var s []string
	for _, e := range all {
		s = append(s, e.String())
	}
	return strings.Join(s, "; ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
