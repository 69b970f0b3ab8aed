package queuecore_test

import (
	"errors"
	"strings"
	"testing"

	"yirangmq/queuecore"
)

// A stored policy that cannot be loaded closes its queue: leasing paused,
// publishes refused with ErrPolicyBroken, a loud log line; the stored
// document stays as it was (a chmod does not replace it with defaults)
// until a valid policy is written.
func TestStoredPolicyFailsClosed(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", `{"format": "json", "schema": {"type": "object"}}`)
		e.queue("src", `{"fanout": ["q"]}`)
		e.publish("q", "before", `{"a": 1}`)
		e.stop()
		st, err := e.open(e.ctx, e.dir, queuecore.SyncNormal)
		if err != nil {
			t.Fatal(err)
		}
		infos, err := st.Queues(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A schema nested deeper than a policy may be: what an older
		// version could have stored.
		bad := []byte(`{"format":"json","schema":` + strings.Repeat(`{"not":`, 70) + `{}` + strings.Repeat(`}`, 70) + `}`)
		for _, info := range infos {
			if info.Name == "q" {
				info.Policy = bad
				if err := st.PutQueue(e.ctx, info); err != nil {
					t.Fatal(err)
				}
			}
		}
		st.Close()
		e.start()

		_, err = e.core.Publish(e.ctx, "q", "after", []byte(`"not an object"`), queuecore.PublishOptions{UID: 1000, GID: 1000})
		if !errors.Is(err, queuecore.ErrPolicyBroken) {
			t.Fatalf("publish to a queue whose policy cannot be loaded: %v, want ErrPolicyBroken", err)
		}
		if _, err := e.core.Next(e.ctx, "q", "test", true); err == nil {
			t.Fatalf("a lease from a closed queue")
		}
		if err := e.core.SetPaused(e.ctx, "q", false); !errors.Is(err, queuecore.ErrPolicyBroken) {
			t.Fatalf("resume of a closed queue: %v", err)
		}
		p, err := e.core.Policy("q")
		if err != nil || !p.Paused || p.Broken() == "" {
			t.Fatalf("policy in effect: paused %v broken %q %v", p.Paused, p.Broken(), err)
		}
		// A fanout into it skips it; the source queue works.
		e.publish("src", "fan", "x")
		equalNames(t, "q inbox", e.names("q", queuecore.StateReady), "before")
		// A chmod keeps the stored document.
		if err := e.core.SetQueueOwner(e.ctx, "q", 1000, 1000, 0o700); err != nil {
			t.Fatal(err)
		}
		e.restart()
		if _, err := e.core.Publish(e.ctx, "q", "after", []byte(`{}`), queuecore.PublishOptions{}); !errors.Is(err, queuecore.ErrPolicyBroken) {
			t.Fatalf("after a chmod and a restart: %v, want ErrPolicyBroken", err)
		}
		// A valid policy opens it again.
		if err := e.core.SetPolicy(e.ctx, "q", []byte(`{"format": "json", "schema": {"type": "object"}}`)); err != nil {
			t.Fatal(err)
		}
		e.publish("q", "after", `{"b": 2}`)
		equalNames(t, "q inbox", e.names("q", queuecore.StateReady), "before", "after")
	})
}
