package queuecore_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"yirangmq/queuecore"
	"yirangmq/testenv"
)

// Tests of what differs on a 32-bit machine (armv7): int is 32 bits wide
// there. make test-cross runs them under qemu-arm; here they check the
// same answers on a 64-bit machine.

// TestPolicyNumbersPast32Bits: a policy number that does not fit in 32
// bits (or in 64) is refused the same way on every machine, naming the
// field, and never wraps into an accepted value.
func TestPolicyNumbersPast32Bits(t *testing.T) {
	fields := []struct{ doc, name string }{
		{`{"visibilityTimeoutSec": %s}`, "visibilityTimeoutSec"},
		{`{"maxLeaseSec": %s}`, "maxLeaseSec"},
		{`{"dedupWindowSec": %s}`, "dedupWindowSec"},
		{`{"retry": {"limit": %s}}`, "limit"},
		{`{"dlq": {"retentionDays": %s}}`, "retentionDays"},
		{`{"maxMessageBytes": %s}`, "maxMessageBytes"},
	}
	// 2^31, 2^32+30 (30 after a wrap to 32 bits: a valid timeout),
	// -2^31-1, 2^63 (past int64 as well).
	values := []string{"2147483648", "4294967326", "-2147483649", "9223372036854775808"}
	for _, f := range fields {
		for _, v := range values {
			doc := fmt.Sprintf(f.doc, v)
			p, err := queuecore.ParsePolicy([]byte(doc))
			var ie *queuecore.InputError
			if !errors.As(err, &ie) {
				t.Errorf("ParsePolicy(%s) = %+v, %v; want an InputError", doc, p, err)
				continue
			}
			if msg := err.Error(); !strings.Contains(msg, f.name) || strings.Contains(msg, "must be a number, not") {
				t.Errorf("ParsePolicy(%s): error %q does not say which field is out of range", doc, msg)
			}
		}
	}
	// The largest accepted values are the same everywhere.
	p, err := queuecore.ParsePolicy([]byte(`{"visibilityTimeoutSec": 604800, "maxLeaseSec": 604800, "archive": {"maxMessages": 9223372036854775807}, "maxReady": 9223372036854775807}`))
	if err != nil {
		t.Fatalf("the largest values: %v", err)
	}
	if p.VisibilityTimeout() != 7*24*time.Hour || p.Archive.MaxMessages != math.MaxInt64 || p.MaxReady != math.MaxInt64 {
		t.Fatalf("the largest values read back as %+v", p)
	}
}

// y2038 is 2^31 seconds after the epoch: a signed 32-bit time_t ends one
// second before.
var y2038 = time.Unix(1<<31, 0)

// TestTimesPast2038 runs a message's life across 2038-01-19T03:14:08Z on
// each store (the clock starts 10 seconds before): a lease whose deadline
// is past it, its expiry, the retry's due time, a restart of the store in
// between, and a publish after it. Every time reads back exact.
func TestTimesPast2038(t *testing.T) {
	start := y2038.Add(-10 * time.Second)
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			e := &env{t: t, ctx: context.Background(), dir: t.TempDir(), open: s.opener(t),
				clock: testenv.NewFakeClock(start), notes: &notes{ch: make(chan queuecore.Event, 1024)}}
			e.start()
			t.Cleanup(e.stop)

			e.queue("q", `{"visibilityTimeoutSec": 30, "retry": {"limit": 3, "backoff": "fixed", "initialDelaySec": 5, "maxDelaySec": 5}}`)
			m := e.publish("q", "before", "x")
			equal(t, "published at", m.PublishedAt, start)
			l := mustLease(t, e, "before")
			equal(t, "lease deadline", l.Deadline, start.Add(30*time.Second))
			if l.Deadline.Unix() <= math.MaxInt32 {
				t.Fatalf("deadline %v is not past 2038", l.Deadline)
			}

			e.restart()
			got := e.get("q", queuecore.StateLeased, "before")
			equal(t, "deadline after a restart", got.Deadline, start.Add(30*time.Second))
			equal(t, "published at after a restart", got.PublishedAt, start)

			e.clock.Advance(30 * time.Second) // past 2038: the lease expires
			d := e.waitState("q", queuecore.StateDelayed, "before")
			equal(t, "attempts", d.Attempts, 1)
			equal(t, "retry due", d.Deadline, start.Add(35*time.Second))
			e.clock.Advance(5 * time.Second)
			e.waitState("q", queuecore.StateReady, "before")

			after := e.publish("q", "after", "y")
			equal(t, "published after 2038", after.PublishedAt, start.Add(35*time.Second))
			e.restart()
			equal(t, "published after 2038, after a restart", e.get("q", queuecore.StateReady, "after").PublishedAt, start.Add(35*time.Second))
			st := e.stats("q")
			equal(t, "ready", st.Ready, int64(2))
			// The oldest ready message is "before", back in inbox/ at +35 s
			// or published at start: either way its age is small and not
			// negative (no wrapped time).
			if st.OldestReadyAgeSec < 0 || st.OldestReadyAgeSec > 60 {
				t.Fatalf("oldest ready age %v s across 2038", st.OldestReadyAgeSec)
			}
		})
	}
}

// TestNoUnalignedAtomics: on 32-bit ARM a 64-bit atomic operation panics
// unless its word is 8-byte aligned, which Go guarantees only for the
// atomic.Int64/Uint64 types and the first word of an allocation. So no
// code of this module (nor the vendored go-fuse) calls the sync/atomic
// functions on plain int64/uint64 words: it uses the types.
func TestNoUnalignedAtomics(t *testing.T) {
	bad := regexp.MustCompile(`^(Add|Load|Store|Swap|CompareAndSwap|And|Or)(Int64|Uint64)$`)
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "bin" || d.Name() == "var" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		atomicName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"sync/atomic"` {
				atomicName = "atomic"
				if imp.Name != nil {
					atomicName = imp.Name.Name
				}
			}
		}
		if atomicName == "" {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == atomicName && bad.MatchString(sel.Sel.Name) {
				t.Errorf("%s: atomic.%s on a plain 64-bit word: use atomic.Int64 or atomic.Uint64 (alignment on 32-bit)", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("only %d Go files under ..: not the module's root?", files)
	}
}

// TestEnvelopeNumbersPast32Bits: an envelope's priority or delay that
// would wrap in 32 bits (2^32+5 → 5) is refused, never taken as small.
func TestEnvelopeNumbersPast32Bits(t *testing.T) {
	for _, attr := range []string{`"priority": 4294967301`, `"priority": -4294967301`, `"priority": 9223372036854775813`, `"delaySec": 4294967301`, `"delaySec": 1e300`} {
		body := `{"messageId": "m1", "attributes": {` + attr + `}, "payload": {}}`
		if env, err := queuecore.ParseEnvelope([]byte(body), "q"); err == nil {
			t.Errorf("ParseEnvelope with %s = %+v, want an error", attr, env.Attributes)
		}
	}
	if _, err := queuecore.ParseEnvelope([]byte(`{"messageId": "m1", "attributes": {"priority": 5, "delaySec": 5}, "payload": {}}`), "q"); err != nil {
		t.Fatalf("small numbers: %v", err)
	}
}
