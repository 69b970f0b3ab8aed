package torture

import "time"

// Options say how hard to torture which store.
type Options struct {
	Backend   string        // sqlite (default) or fs
	Sync      string        // full (default), normal or off
	Kills     int           // SIGKILLs while clients run (default 20); one more follows the drain
	Producers int           // default 3
	Consumers int           // default 3
	Duration  time.Duration // the killing stops after this long even short of Kills (default 2 min)
	// MinGap and MaxGap bound the random time between a restart and the
	// next kill (default 200 ms and 800 ms).
	MinGap, MaxGap time.Duration
	DrainTimeout   time.Duration // default 30 s
	Seed           uint64        // 0: from the clock
	// KeepDir is where the history of a failed check is kept (default
	// the temporary directory).
	KeepDir string

	// Store is the daemons' --store (default: a new directory). With a
	// store several daemons share (postgres), Daemons mount it at once
	// (default 1): producer i works on daemon i%Daemons and consumer i on
	// daemon (i+1)%Daemons, so what one publishes the other consumes.
	Store   string
	Daemons int
	// KillDutyHolder makes every kill hit the daemon that holds the
	// store's duty (expiry, backoff, retention; see .stats), and waits
	// for another to take it over (Result.Takeovers).
	KillDutyHolder bool
	// RestartStore, when set, is called DBRestarts times during the kill
	// phase, between kills, to stop and start the shared store's server
	// (every daemon counts as down meanwhile).
	RestartStore func() error
	DBRestarts   int
	// MaxMessageInodes is the daemons' --max-message-inodes (default 32):
	// small, so that the pruner asks the kernel to forget inodes all the
	// time and is killed in the middle of it too.
	MaxMessageInodes int
	// DaemonArgs are more flags for the daemons (e.g. --sqlite-file-bodies).
	DaemonArgs []string
}

func (o *Options) defaults() {
	if o.Backend == "" {
		o.Backend = "sqlite"
	}
	if o.MaxMessageInodes <= 0 {
		o.MaxMessageInodes = 32
	}
	if o.Sync == "" {
		o.Sync = "full"
	}
	if o.Kills <= 0 {
		o.Kills = 20
	}
	if o.Producers <= 0 {
		o.Producers = 3
	}
	if o.Consumers <= 0 {
		o.Consumers = 3
	}
	if o.Duration <= 0 {
		o.Duration = 2 * time.Minute
	}
	if o.MinGap <= 0 {
		o.MinGap = 200 * time.Millisecond
	}
	if o.MaxGap < o.MinGap {
		o.MaxGap = max(o.MinGap, 800*time.Millisecond)
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	if o.Daemons <= 0 {
		o.Daemons = 1
	}
}

// QueueName is the queue the torture runs on.
const QueueName = "torture"

// Policy is the queue's policy, chosen so that the checker can be exact:
// short leases (expiry is part of the test), retries without backoff so
// a nacked or expired message is ready again at once (nothing waits in
// delayed/), a retry limit that a message does not reach in a run (and a
// dlq kept forever if one does), an archive without limit so that every
// acked message stays visible, and no dedup or backpressure, which would
// drop or refuse publishes for reasons other than a crash.
const Policy = `{
  "visibilityTimeoutSec": 2,
  "retry": {"limit": 100, "backoff": "fixed", "initialDelaySec": 0, "maxDelaySec": 0},
  "dlq": {"enabled": true, "retentionDays": 0},
  "archive": {"enabled": true, "retentionSec": 0, "maxMessages": 0},
  "dedupWindowSec": 0,
  "maxReady": 0
}
`

// VisibilityTimeout is Policy's lease length.
const VisibilityTimeout = 2 * time.Second
