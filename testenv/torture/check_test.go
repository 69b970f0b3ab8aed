package torture

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// hist builds synthetic histories; times are in milliseconds.
type hist struct {
	t      *testing.T
	events []Event
	bodies map[string][]byte
	rnd    *rand.Rand
}

func newHist(t *testing.T) *hist {
	return &hist{t: t, bodies: map[string][]byte{}, rnd: rand.New(rand.NewPCG(1, 2))}
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func (h *hist) add(e Event) int {
	e.ID = len(h.events) + 1
	if e.Client == "" {
		e.Client = "x"
	}
	h.events = append(h.events, e)
	return e.ID
}

func (h *hist) publish(name string, at int, o Outcome) {
	body := MakeBody(name, 40, h.rnd)
	h.bodies[name] = body
	h.add(Event{Kind: KindPublish, Name: name, Sum: Sum(body), Via: "create", Start: ms(at), End: ms(at + 5), Outcome: o})
}

func (h *hist) lease(name string, at int) int {
	return h.add(Event{Kind: KindLease, Name: name, Start: ms(at), End: ms(at + 1), Outcome: OK})
}

func (h *hist) read(name string, lease, at int, body []byte) {
	e := Event{Kind: KindRead, Name: name, Lease: lease, Start: ms(at), End: ms(at + 1), Outcome: OK, Sum: Sum(body)}
	if err := VerifyBody(name, body); err != nil {
		e.BodyErr = err.Error()
	}
	h.add(e)
}

func (h *hist) op(k Kind, name string, lease, at int, o Outcome) {
	h.add(Event{Kind: k, Name: name, Lease: lease, Start: ms(at), End: ms(at + 2), Outcome: o})
}

func (h *hist) kill(at int) {
	h.add(Event{Kind: KindKill, Client: "runner", Start: ms(at), End: ms(at + 10), Outcome: OK})
	h.add(Event{Kind: KindRestart, Client: "runner", Start: ms(at + 10), End: ms(at + 100), Outcome: OK})
}

func (h *hist) final(state, name string) FinalMessage {
	body := h.bodies[name]
	m := FinalMessage{State: state, Name: name, Sum: Sum(body)}
	if err := VerifyBody(name, body); err != nil {
		m.BodyErr = err.Error()
	}
	return m
}

func (h *hist) check(final ...FinalMessage) *Report {
	return Check(h.events, final, CheckOptions{VisibilityTimeout: 2 * time.Second, Archive: true})
}

func wantErrors(t *testing.T, r *Report, want ...string) {
	t.Helper()
	if len(want) == 0 {
		if !r.OK() {
			t.Fatalf("want no violation, got:\n%s", strings.Join(r.Errors, "\n"))
		}
		return
	}
	if r.OK() {
		t.Fatalf("want violations %q, got none; %s", want, r.Summary())
	}
	all := strings.Join(r.Errors, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Fatalf("want a violation containing %q, got:\n%s", w, all)
		}
	}
}

func TestCheckPasses(t *testing.T) {
	h := newHist(t)
	// a: published, leased, read, acked: in archive/.
	h.publish("a", 0, OK)
	l := h.lease("a", 10)
	h.read("a", l, 12, h.bodies["a"])
	h.op(KindAck, "a", l, 15, OK)
	// b: published, never leased: still in inbox/.
	h.publish("b", 20, OK)
	// c: publish with an unknown outcome that did not commit: absent.
	h.publish("c", 30, Unknown)
	// d: publish with an unknown outcome that did commit: in inbox/.
	h.publish("d", 40, Unknown)
	// e: a publish that never reached a daemon: absent.
	h.publish("e", 45, Failed)
	// f: nacked, leased again at once, acked with an unknown outcome
	// that went through.
	h.publish("f", 50, OK)
	l = h.lease("f", 60)
	h.op(KindNack, "f", l, 70, OK)
	l = h.lease("f", 80)
	h.op(KindAck, "f", l, 90, Unknown)
	// g: in flight at a kill, leased again after its lease expired.
	h.publish("g", 100, OK)
	l = h.lease("g", 110)
	h.kill(120)
	h.op(KindAck, "g", l, 125, Unknown)
	l = h.lease("g", 2200)
	h.op(KindAck, "g", l, 2210, OK)
	// i: abandoned, redelivered after the timeout, still leased.
	h.publish("i", 3000, OK)
	l = h.lease("i", 3010)
	h.op(KindAbandon, "i", l, 3011, OK)
	h.lease("i", 5100)

	r := h.check(h.final("inbox", "b"), h.final("inbox", "d"), h.final("processing", "i"),
		h.final("archive", "a"), h.final("archive", "f"), h.final("archive", "g"))
	wantErrors(t, r)
	if r.Committed != 5 || r.UnknownPublishes != 2 || r.FailedPublishes != 1 {
		t.Errorf("publishes: %s", r.Summary())
	}
	if r.Duplicates != 3 || r.ExtraDeliveries != 3 || r.Redelivered[CauseNack] != 1 || r.Redelivered[CauseKill] != 1 || r.Redelivered[CauseAbandon] != 1 {
		t.Errorf("duplicates: %s", r.Summary())
	}
	if r.InFlightAtKills != 1 || r.Kills != 1 || r.Acked != 2 || len(r.Lost) != 0 {
		t.Errorf("counts: %s", r.Summary())
	}
}

func TestCheckLost(t *testing.T) {
	h := newHist(t)
	h.publish("a", 0, OK)
	h.publish("b", 10, OK)
	h.kill(20)
	r := h.check(h.final("inbox", "b"))
	wantErrors(t, r, `lost: "a"`)
	if len(r.Lost) != 1 || r.Lost[0] != "a" {
		t.Fatalf("lost = %q, want [a]", r.Lost)
	}
}

func TestCheckVanishedAfterDelivery(t *testing.T) {
	// Delivered, never acked, gone: not "lost" in the weak sense, but
	// with an archive every committed message must still be somewhere.
	h := newHist(t)
	h.publish("a", 0, OK)
	l := h.lease("a", 10)
	h.op(KindAbandon, "a", l, 11, OK)
	r := h.check()
	wantErrors(t, r, `vanished: "a"`)
	if len(r.Lost) != 0 || len(r.Vanished) != 1 {
		t.Fatalf("lost %q, vanished %q", r.Lost, r.Vanished)
	}
}

func TestCheckCorruptBody(t *testing.T) {
	h := newHist(t)
	h.publish("a", 0, OK)
	l := h.lease("a", 10)
	torn := h.bodies["a"][:len(h.bodies["a"])-7]
	h.read("a", l, 12, torn)
	h.op(KindAck, "a", l, 15, OK)
	wantErrors(t, h.check(h.final("archive", "a")), "wrong bytes", "cut short")

	// Bytes that verify on their own but are not what was published.
	h = newHist(t)
	h.publish("a", 0, OK)
	l = h.lease("a", 10)
	h.read("a", l, 12, MakeBody("a", 40, rand.New(rand.NewPCG(9, 9))))
	h.op(KindAck, "a", l, 15, OK)
	wantErrors(t, h.check(h.final("archive", "a")), "differs from the published")

	// Another message's body under this name, in the final state.
	h = newHist(t)
	h.publish("a", 0, OK)
	h.publish("b", 1, OK)
	h.bodies["a"] = h.bodies["b"]
	wantErrors(t, h.check(h.final("inbox", "a"), h.final("inbox", "b")), `served under the name "a"`)
}

func TestCheckTwoStates(t *testing.T) {
	h := newHist(t)
	h.publish("a", 0, OK)
	l := h.lease("a", 10)
	h.op(KindAck, "a", l, 15, OK)
	wantErrors(t, h.check(h.final("inbox", "a"), h.final("archive", "a")), "inbox and archive at once", "live")
}

func TestCheckAckViolations(t *testing.T) {
	// Delivered again after its ack returned 0.
	h := newHist(t)
	h.publish("a", 0, OK)
	l := h.lease("a", 10)
	h.op(KindAck, "a", l, 15, OK)
	l = h.lease("a", 3000)
	h.op(KindAck, "a", l, 3010, Failed)
	wantErrors(t, h.check(h.final("archive", "a")), "delivered again")

	// Acked with success, yet not archived.
	h = newHist(t)
	h.publish("a", 0, OK)
	l = h.lease("a", 10)
	h.op(KindAck, "a", l, 15, OK)
	wantErrors(t, h.check(), "not in archive/")

	// Archived by nobody.
	h = newHist(t)
	h.publish("a", 0, OK)
	wantErrors(t, h.check(h.final("archive", "a")), "no ack of it ever reached")
}

func TestCheckEarlyRedelivery(t *testing.T) {
	// A lease lost in a restart: leased again long before its deadline.
	h := newHist(t)
	h.publish("a", 0, OK)
	l := h.lease("a", 10)
	h.kill(20)
	h.op(KindAck, "a", l, 25, Unknown)
	l = h.lease("a", 200)
	h.op(KindAck, "a", l, 210, OK)
	wantErrors(t, h.check(h.final("archive", "a")), "before its visibility timeout")

	// The same after a nack is fine.
	h = newHist(t)
	h.publish("a", 0, OK)
	l = h.lease("a", 10)
	h.op(KindNack, "a", l, 20, Unknown)
	l = h.lease("a", 200)
	h.op(KindAck, "a", l, 210, OK)
	wantErrors(t, h.check(h.final("archive", "a")))
}

func TestCheckPhantoms(t *testing.T) {
	h := newHist(t)
	h.publish("a", 0, Failed)
	h.bodies["z"] = MakeBody("z", 3, h.rnd)
	wantErrors(t, h.check(h.final("inbox", "a"), h.final("inbox", "z")), `"z" was never published`, "never reached a live daemon")
}

func TestBody(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	for _, size := range []int{0, 1, 100, 70000} {
		b := MakeBody("m-1", size, rnd)
		if err := VerifyBody("m-1", b); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		for _, cut := range []int{0, 1, len(b) / 2, len(b) - 1} {
			if VerifyBody("m-1", b[:cut]) == nil {
				t.Errorf("size %d cut to %d verifies", size, cut)
			}
		}
		if VerifyBody("m-2", b) == nil {
			t.Errorf("size %d verifies under another name", size)
		}
		flipped := append([]byte(nil), b...)
		flipped[len(flipped)/2] ^= 1
		if size > 0 && VerifyBody("m-1", flipped) == nil {
			t.Errorf("size %d with a flipped bit verifies", size)
		}
		if VerifyBody("m-1", append(append([]byte(nil), b...), 'x')) == nil {
			t.Errorf("size %d with a trailing byte verifies", size)
		}
	}
}

func TestCheckRenameAnomaly(t *testing.T) {
	// A rename(2) into processing/ that says 0 for a message .next leased
	// a moment before: reported apart from the daemon's violations.
	h := newHist(t)
	h.publish("a", 0, OK)
	l := h.lease("a", 10)
	h.add(Event{Kind: KindLeaseRename, Name: "a", Start: ms(12), End: ms(13), Outcome: OK})
	h.op(KindAck, "a", l, 20, OK)
	r := h.check(h.final("archive", "a"))
	wantErrors(t, r)
	if len(r.RenameAnomalies) != 1 || !strings.Contains(r.RenameAnomalies[0], "before its visibility timeout") {
		t.Fatalf("rename anomalies = %q", r.RenameAnomalies)
	}
}
