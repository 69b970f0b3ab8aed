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
	r := &Report{Final: map[string]int{}, Redelivered: map[string]int{}}

	publishes := map[string]Event{}
	leases := map[string][]Event{} // observed leases (OK), by message
	byLease := map[int][]Event{}   // read, ack, nack, abandon by lease event
	acks := map[string][]Event{}   // every ack call, by message
	nacks := map[string][]Event{}  // every nack call, by message
	var reads, kills, leaseCalls []Event
	for _, e := range events {
		switch e.Kind {
		case KindPublish:
			r.Publishes++
			if prev, dup := publishes[e.Name]; dup {
				r.errorf("name %q published twice (#%d and #%d): the torture must use unique names", e.Name, prev.ID, e.ID)
			}
			publishes[e.Name] = e
			switch e.Outcome {
			case OK:
				r.Committed++
			case Unknown:
				r.UnknownPublishes++
			default:
				r.FailedPublishes++
			}
		case KindLease, KindLeaseRename:
			leaseCalls = append(leaseCalls, e)
			if e.BodyErr != "" {
				r.BadBytes = append(r.BadBytes, e.String())
				r.errorf("bad lease reply: %s", e)
			}
			if e.Outcome == OK && e.Name != "" {
				leases[e.Name] = append(leases[e.Name], e)
				r.Deliveries++
			}
		case KindRead:
			byLease[e.Lease] = append(byLease[e.Lease], e)
			if e.Outcome == OK {
				reads = append(reads, e)
			}
		case KindAck:
			byLease[e.Lease] = append(byLease[e.Lease], e)
			acks[e.Name] = append(acks[e.Name], e)
			if e.Outcome == Unknown {
				r.UnknownAcks++
			}
		case KindNack:
			byLease[e.Lease] = append(byLease[e.Lease], e)
			nacks[e.Name] = append(nacks[e.Name], e)
			if e.Outcome == OK {
				r.Nacks++
			}
		case KindAbandon:
			byLease[e.Lease] = append(byLease[e.Lease], e)
			r.Abandons++
		case KindKill:
			kills = append(kills, e)
		}
	}
	r.Kills = len(kills)
	sort.Slice(kills, func(i, j int) bool { return kills[i].Start < kills[j].Start })

	// What a name must be, whoever shows it to us.
	known := func(name, where string) {
		p, ok := publishes[name]
		switch {
		case !ok:
			r.errorf("%s: %q was never published", where, name)
		case p.Outcome == Failed:
			r.errorf("%s: %q appeared, but its publish never reached a live daemon or was refused: %s", where, name, p)
		}
	}
	checkBytes := func(name, sum, bodyErr, where string) {
		if bodyErr != "" {
			r.BadBytes = append(r.BadBytes, fmt.Sprintf("%s %s: %s", where, name, bodyErr))
			r.errorf("wrong bytes: %s %s: %s", where, name, bodyErr)
			return
		}
		if p, ok := publishes[name]; ok && p.Sum != "" && p.Sum != sum {
			r.BadBytes = append(r.BadBytes, fmt.Sprintf("%s %s: checksum %.12s, published %.12s", where, name, sum, p.Sum))
			r.errorf("wrong bytes: %s %s: checksum %.12s differs from the published %.12s", where, name, sum, p.Sum)
		}
	}

	// Bodies read after a lease.
	for _, e := range reads {
		known(e.Name, fmt.Sprintf("read #%d", e.ID))
		checkBytes(e.Name, e.Sum, e.BodyErr, fmt.Sprintf("read #%d of", e.ID))
	}

	// The final state: one place per name, right bytes, nothing unknown.
	where := map[string][]string{}
	for _, m := range final {
		r.Final[m.State]++
		where[m.Name] = append(where[m.Name], m.State)
		known(m.Name, "final "+m.State+"/")
		checkBytes(m.Name, m.Sum, m.BodyErr, "final "+m.State+"/")
	}
	live := func(name string) bool {
		for _, s := range where[name] {
			if isLive(s) {
				return true
			}
		}
		return false
	}
	inArchive := func(name string) bool {
		for _, s := range where[name] {
			if s == StateArchive {
				return true
			}
		}
		return false
	}
	for _, name := range sortedKeys(where) {
		if states := where[name]; len(states) > 1 {
			r.errorf("%q is in %s at once", name, strings.Join(states, " and "))
		}
	}

	// Observed leases.
	for name, ls := range leases {
		sort.Slice(ls, func(i, j int) bool { return ls[i].End < ls[j].End })
		leases[name] = ls
		known(name, fmt.Sprintf("lease #%d", ls[0].ID))
	}
	r.Delivered = len(leases)

	// Nothing committed is lost.
	for _, name := range sortedKeys(publishes) {
		p := publishes[name]
		committed := p.Outcome == OK || len(leases[name]) > 0
		if p.Outcome == OK && len(leases[name]) == 0 && !live(name) {
			r.Lost = append(r.Lost, name)
			r.errorf("lost: %q was committed (%s), never delivered, and is not in inbox, processing, delayed or dlq at the end (found in: %v)",
				name, p, where[name])
		}
		if opts.Archive && committed && len(where[name]) == 0 {
			r.Vanished = append(r.Vanished, name)
			r.errorf("vanished: %q was committed and is in no state at the end; its history: %s", name, historyOf(name, p, leases, acks, nacks))
		}
	}

	// Acks and what they leave behind.
	for _, name := range sortedKeys(acks) {
		var okAcks []Event
		for _, a := range acks[name] {
			if a.Outcome == OK {
				okAcks = append(okAcks, a)
			}
		}
		if len(okAcks) == 0 {
			continue
		}
		r.Acked++
		if len(okAcks) > 1 {
			r.errorf("%q acked twice with success: %s and %s", name, okAcks[0], okAcks[1])
		}
		first := okAcks[0]
		for _, a := range okAcks[1:] {
			if a.End < first.End {
				first = a
			}
		}
		if live(name) {
			r.errorf("%q is live (%v) at the end although its ack returned 0: %s", name, where[name], first)
		} else if opts.Archive && !inArchive(name) {
			r.errorf("%q is not in archive/ at the end although its ack returned 0: %s", name, first)
		}
		for _, n := range nacks[name] {
			if n.Outcome == OK && n.Start > first.End {
				r.errorf("%q nacked with success (%s) after its ack returned 0 (%s)", name, n, first)
			}
		}
		for _, l := range leases[name] {
			if l.Start > first.End {
				r.leaseViolation(l, "%q delivered again (%s) after its ack returned 0 (%s)", name, l, first)
			}
		}
	}
	for _, name := range sortedKeys(where) {
		if !inArchive(name) {
			continue
		}
		attempted := false
		for _, a := range acks[name] {
			attempted = attempted || a.Outcome != Failed
		}
		if !attempted {
			r.errorf("%q is in archive/ but no ack of it ever reached the daemon", name)
		}
	}

	// Duplicates and their causes.
	terminalEnd := func(l Event) time.Duration {
		end := time.Duration(-1)
		for _, e := range byLease[l.ID] {
			if e.Kind != KindRead && e.End > end {
				end = e.End
			}
		}
		return end
	}
	for _, name := range sortedKeys(leases) {
		ls := leases[name]
		if len(ls) < 2 {
			continue
		}
		r.Duplicates++
		r.ExtraDeliveries += len(ls) - 1
		for i := 1; i < len(ls); i++ {
			prev, cur := ls[i-1], ls[i]
			nacked := false // by anyone holding the name between the two leases
			for _, n := range nacks[name] {
				if n.Outcome != Failed && n.End > prev.Start && n.Start < cur.End {
					nacked = true
				}
			}
			cause := CauseExpired
			own := byLease[prev.ID]
			end := terminalEnd(prev)
			if end < 0 {
				end = cur.End
			}
			switch {
			case hasKind(own, KindNack, OK):
				cause = CauseNack
			case hasKind(own, KindAbandon, OK):
				cause = CauseAbandon
			case killBetween(kills, prev.Start, end):
				cause = CauseKill
			case nacked:
				cause = CauseNack
			}
			r.Redelivered[cause]++
			if !nacked && cur.End+opts.Slack < prev.Start+opts.VisibilityTimeout {
				r.leaseViolation(cur, "%q redelivered %v after it was leased, before its visibility timeout (%v) and with no nack: %s then %s",
					name, (cur.End - prev.Start).Round(time.Millisecond), opts.VisibilityTimeout, prev, cur)
			}
		}
	}

	// Leases in flight at each kill: taken (or being taken) before it,
	// and not yet acked, nacked or abandoned when it came.
	for _, k := range kills {
		for _, l := range leaseCalls {
			if l.Start >= k.Start || l.Outcome == Failed {
				continue
			}
			end := l.End
			if l.Outcome == OK {
				if t := terminalEnd(l); t >= 0 {
					end = t
				} else {
					end = math.MaxInt64
				}
			}
			if end >= k.Start {
				r.InFlightAtKills++
			}
		}
	}
	if r.Redelivered[CauseKill] > r.InFlightAtKills {
		r.errorf("%d redeliveries follow kills, more than the %d leases in flight at the kills", r.Redelivered[CauseKill], r.InFlightAtKills)
	}
	return r
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
