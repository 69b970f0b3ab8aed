package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"yirangmq/backends"
	"yirangmq/backends/sqlite"
	"yirangmq/queuecore"
)

// runDemo walks one queue through its life on a fresh SQLite store:
// publish, lease, ack, a failing consumer that lands a message in dlq/, a
// redrive, and the stats. It drives the queue core in-process.
func runDemo(ctx context.Context, env *cliEnv, args []string) error {
	fs := pflag.NewFlagSet("demo", pflag.ContinueOnError)
	store := fs.String("store", "var/demo", "store directory (emptied first)")
	if ok, err := parseFlags(env, fs, args); !ok {
		return err
	}
	if err := os.RemoveAll(*store); err != nil {
		return err
	}
	st, err := sqlite.Open(ctx, *store, backends.Options{Sync: queuecore.SyncFull, Holder: "yirangmq demo"})
	if err != nil {
		return err
	}
	defer st.Close()
	core, err := queuecore.Open(ctx, st, queuecore.Options{Backend: "sqlite", StorePath: *store, Version: version})
	if err != nil {
		return err
	}
	defer core.Close()
	say := func(format string, a ...any) { fmt.Fprintf(env.stdout, format+"\n", a...) }

	say("store: %s (sqlite, sync full)", *store)
	if err := core.CreateQueue(ctx, "jobs", uint32(os.Getuid()), uint32(os.Getgid()), 0o755); err != nil {
		return err
	}
	policy := `{"format": "json", "retry": {"limit": 1, "initialDelaySec": 0}}`
	if err := core.SetPolicy(ctx, "jobs", []byte(policy)); err != nil {
		return err
	}
	say("created queue jobs with policy %s", policy)
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("job-%d.json", i)
		if _, err := core.Publish(ctx, "jobs", name, fmt.Appendf(nil, `{"job": %d}`, i), queuecore.PublishOptions{}); err != nil {
			return err
		}
		say("published jobs/inbox/%s", name)
	}
	_, err = core.Publish(ctx, "jobs", "broken.json", []byte("{not json"), queuecore.PublishOptions{})
	say("published jobs/inbox/broken.json -> %v", err)

	for {
		m, err := core.Next(ctx, "jobs", "demo", true)
		if err != nil {
			say("nothing more is ready (%v)", err)
			break
		}
		body, _ := core.Body(ctx, m)
		if m.Name == "job-3.json" && m.Redrives == 0 {
			_ = core.SetReason(ctx, "jobs", m.Name, queuecore.ReasonHandlerFailed, "exit status 1")
			m, err = core.Nack(ctx, "jobs", m.Name)
			if err != nil {
				return err
			}
			say("leased %s %s: handler failed, nacked -> %s (attempts %d)", m.Name, body, m.State.Dir(), m.Attempts)
			continue
		}
		if err := core.Ack(ctx, "jobs", m.Name); err != nil {
			return err
		}
		say("leased %s %s: acked -> archive", m.Name, body)
	}
	err = core.List(ctx, "jobs", queuecore.StateDead, func(m queuecore.Message) bool {
		say("dlq: %s reason=%s (%s) attempts=%d", m.Name, m.Reason, m.ReasonMessage, m.Attempts)
		return true
	})
	if err != nil {
		return err
	}
	if _, err := core.Redrive(ctx, "jobs", "job-3.json"); err != nil {
		return err
	}
	say("redrove job-3.json to inbox")
	m, err := core.Next(ctx, "jobs", "demo", true)
	if err != nil {
		return err
	}
	if err := core.Ack(ctx, "jobs", m.Name); err != nil {
		return err
	}
	say("leased %s (redrives %d): acked", m.Name, m.Redrives)
	stats, err := core.Stats(ctx, "jobs")
	if err != nil {
		return err
	}
	out, _ := json.MarshalIndent(stats, "", "  ")
	say("jobs/.stats:\n%s", out)
	return nil
}
