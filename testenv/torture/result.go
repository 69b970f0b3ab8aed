package torture

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"
)

// Result is what a run did and what the checker found.
type Result struct {
	Report  *Report
	Events  []Event
	Final   []FinalMessage
	Runtime time.Duration
	// Undrained is what was still in inbox/, processing/ and delayed/
	// when the drain ended.
	Undrained int
	// Unexpected counts errors that a steady, live mount gave although
	// they are no refusal (EIO, ENOTCONN, EINTR…), by error text.
	Unexpected map[string]int
	// Restarts lists how long each restart took, to the ready handshake.
	Restarts []time.Duration
	// Exits lists how long each killed daemon took to exit after SIGKILL;
	// Serving how long from each SIGKILL until the restarted daemon
	// served the queue again (exit, start, ready, a stat of the queue).
	Exits, Serving []time.Duration
	// StuckDaemons counts the kills after which the daemon was still
	// there StuckAfter later; StuckClients lists the client calls that
	// stayed blocked longer than that; DeadMountErrors the old mounts
	// that did not answer ENOTCONN; Rescued the restarts whose daemon
	// found a wedged mount and had to abort it (see kill.go).
	// PhaseKills counts the kills while the clients worked (the drain
	// and the end add one per daemon each).
	PhaseKills      int
	StuckDaemons    int
	StuckClients    []string
	DeadMountErrors []string
	Rescued         int
	// DaemonErrors counts the ERROR lines of the daemons' logs, by
	// message (each daemon's log is read when it is killed).
	DaemonErrors map[string]int
	// KillPhase and Drain are how long the clients worked under kills,
	// and how long the drain took.
	KillPhase, Drain time.Duration
	// Takeovers are how long the duty went unheld after each kill of its
	// holder (KillDutyHolder); DBRestarts how many store restarts ran.
	Takeovers  []time.Duration
	DBRestarts int
}

// noteDaemonLog counts the ERROR lines of a daemon's log by message.
func (r *Result) noteDaemonLog(log string) {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "level=ERROR") {
			continue
		}
		msg := line
		if i := strings.Index(line, "msg="); i >= 0 {
			msg = line[i:]
		}
		r.DaemonErrors[msg]++
	}
}

// Save writes the history (history.jsonl) and the final state
// (final.json) to a new directory in parent (default: the temporary
// directory) that outlives the test, for a post-mortem, and returns its
// path.
func (r *Result) Save(parent string) (string, error) {
	dir, err := os.MkdirTemp(parent, "yirangmq-torture-")
	if err != nil {
		return "", err
	}
	f, err := os.Create(filepath.Join(dir, "history.jsonl"))
	if err != nil {
		return "", err
	}
	if err := WriteJSONL(f, r.Events); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	b, _ := json.MarshalIndent(r.Final, "", " ")
	if err := os.WriteFile(filepath.Join(dir, "final.json"), b, 0o644); err != nil {
		return "", err
	}
	return dir, nil
}

// readFinal lists every state directory and reads every body, twice,
// until two readings agree (something may still be moving when the drain
// ran out of time).
func readFinal(qdir string) ([]FinalMessage, error) {
	var prev []FinalMessage
	var err error
	for try := 0; try < 20; try++ {
		var cur []FinalMessage
		cur, err = readFinalOnce(qdir)
		if err == nil && prev != nil && reflect.DeepEqual(prev, cur) {
			return cur, nil
		}
		if err == nil {
			prev = cur
			continue
		}
		prev = nil
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil {
		err = errors.New("the queue did not stand still")
	}
	return nil, err
}

func readFinalOnce(qdir string) ([]FinalMessage, error) {
	var out []FinalMessage
	for _, s := range States {
		f, err := os.Open(filepath.Join(qdir, s))
		if err != nil {
			return nil, err
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", s, err)
		}
		sort.Strings(names)
		for _, name := range names {
			body, err := readFile(filepath.Join(qdir, s, name))
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w", s, name, err)
			}
			m := FinalMessage{State: s, Name: name, Sum: Sum(body)}
			if verr := VerifyBody(name, body); verr != nil {
				m.BodyErr = verr.Error()
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// FormatUnexpected renders Result.Unexpected in one line.
func FormatUnexpected(u map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(u) {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, u[k]))
	}
	return strings.Join(parts, ", ")
}
