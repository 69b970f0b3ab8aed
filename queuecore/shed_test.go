package queuecore_test

import (
	"testing"

	"yirangmq/queuecore"
)

// After ShedCaches the core answers from the store: names taken stay
// taken, free names stay free, and nothing is lost.
func TestShedCachesKeepsAnswers(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.queue("q", "")
		e.publish("q", "a", "1")
		e.publish("q", "b", "2")
		e.core.ShedCaches()
		wantErr(t, e.core.CheckPublish(e.ctx, "q", "a"), queuecore.ErrExists)
		if err := e.core.CheckPublish(e.ctx, "q", "c"); err != nil {
			t.Fatalf("CheckPublish of a free name after shedding: %v", err)
		}
		_, err := e.core.Get(e.ctx, "q", queuecore.StateReady, "c")
		wantErr(t, err, queuecore.ErrNotFound)
		equal(t, "body of a", string(mustBody(t, e, e.get("q", queuecore.StateReady, "a"))), "1")
		e.publish("q", "c", "3")
		e.core.ShedCaches()
		equalNames(t, "inbox", e.names("q", queuecore.StateReady), "a", "b", "c")
		_, err = e.core.Publish(e.ctx, "q", "b", []byte("again"), queuecore.PublishOptions{})
		wantErr(t, err, queuecore.ErrExists)
	})
}

func mustBody(t *testing.T, e *env, m queuecore.Message) []byte {
	t.Helper()
	b, err := e.core.Body(e.ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
