package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"yirangmq/queuecore"
)

// clearScreen moves the cursor home and clears the screen, as top does.
const clearScreen = "\x1b[H\x1b[2J"

// runStatus prints the queues of a mount from MOUNT/.stats: a table, the
// JSON itself, or (--watch) a table redrawn every interval until SIGINT.
func runStatus(ctx context.Context, env *cliEnv, args []string) error {
	fl := pflag.NewFlagSet("status", pflag.ContinueOnError)
	clientUsage(fl, "status [--mount M] [--queue Q] [--json | --prometheus] [--watch [--interval D]]",
		"Shows every queue of the mount (or one): messages ready, in flight, delayed,\ndead and archived, the age of the oldest ready one, and rates per second over\nthe last minute. --watch redraws the table until interrupted.")
	var mount, queue string
	var asJSON, watch, prom bool
	var interval time.Duration
	addMountFlag(fl, &mount)
	fl.StringVarP(&queue, "queue", "q", "", "show this queue only")
	fl.BoolVar(&asJSON, "json", false, "print the JSON of .stats (MOUNT/.stats, or QUEUE/.stats with --queue)")
	fl.BoolVar(&prom, "prometheus", false, "print MOUNT/.metrics: the Prometheus text exposition format (for node_exporter's textfile collector)")
	fl.BoolVarP(&watch, "watch", "w", false, "redraw every interval until interrupted")
	fl.DurationVar(&interval, "interval", time.Second, "how often --watch redraws")
	if ok, err := parseFlagsNoArgs(env, fl, args); !ok {
		return err
	}
	if interval <= 0 {
		fmt.Fprintln(env.stderr, "yirangmq status: --interval must be positive")
		return errUsage
	}
	abs, err := checkMount(mount)
	if err != nil {
		return err
	}
	var q queueRef
	if queue != "" {
		if q, err = openQueue(abs, queue); err != nil {
			return err
		}
	}
	show := func() error {
		if prom {
			b, err := os.ReadFile(filepath.Join(abs, ".metrics"))
			if err != nil {
				return err
			}
			_, err = env.stdout.Write(b)
			return err
		}
		if asJSON {
			return printStatsJSON(env.stdout, abs, q, watch)
		}
		d, err := readDaemonStats(abs)
		if err != nil {
			return err
		}
		if q.name != "" {
			qs, err := q.readStats()
			if err != nil {
				return err
			}
			d.Queues = []queuecore.QueueStats{qs}
		}
		if watch {
			fmt.Fprint(env.stdout, clearScreen)
			fmt.Fprintf(env.stdout, "yirangmq %s  %s  %s  up %s  every %s  (^C quits)\n\n", d.Version, d.Backend, abs,
				(time.Duration(d.UptimeSec) * time.Second).String(), interval)
		}
		printStatusTable(env.stdout, d.Queues)
		printDiskLine(env.stdout, d.Disk)
		printRefusals(env.stdout, abs, d.Queues)
		return nil
	}
	if !watch {
		return show()
	}
	for {
		if err := show(); err != nil {
			return err
		}
		if !sleepCtx(ctx, interval) {
			return nil
		}
	}
}

func readDaemonStats(mount string) (queuecore.DaemonStats, error) {
	var d queuecore.DaemonStats
	b, err := os.ReadFile(filepath.Join(mount, ".stats"))
	if err != nil {
		return d, fmt.Errorf("read stats: %w", err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("read stats: %w", err)
	}
	return d, nil
}

// printStatsJSON copies the daemon's document; when watching, one compact
// document a line, so the output is a stream of JSON values.
func printStatsJSON(w io.Writer, mount string, q queueRef, compact bool) error {
	path := filepath.Join(mount, ".stats")
	if q.name != "" {
		path = q.path(".stats")
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && q.name != "" {
		return fmt.Errorf("queue %s does not exist", q.name)
	}
	if err != nil {
		return fmt.Errorf("read stats: %w", err)
	}
	if compact {
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return fmt.Errorf("read stats: %w", err)
		}
		b, _ = json.Marshal(v)
		b = append(b, '\n')
	}
	_, err = w.Write(b)
	return err
}

func printStatusTable(w io.Writer, queues []queuecore.QueueStats) {
	if len(queues) == 0 {
		fmt.Fprintln(w, "no queues (mkdir MOUNT/NAME creates one)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tREADY\tINFLIGHT\tDELAYED\tDLQ\tARCHIVED\tOLDEST\tPUB/s\tLEASE/s\tACK/s\tPAUSED\tREFUSED")
	for _, s := range queues {
		paused := "-"
		if s.Paused {
			paused = "yes"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%d\n", s.Queue, s.Ready, s.Inflight, s.Delayed, s.DLQ, s.Archived,
			age(s.Ready, s.OldestReadyAgeSec), rate(s.Rates.PublishedPerSec), rate(s.Rates.LeasedPerSec), rate(s.Rates.AckedPerSec), paused, s.RefusedTotal)
	}
	tw.Flush()
}

// printRefusals lists the last operations each queue refused, the newest
// first: a producer whose shell ignored the error of close(2) (echo >)
// sees here why its message is not in inbox/. MOUNT/.stats counts them
// only; the list is in each QUEUE/.stats, which this user may not be
// allowed to read (then it is left out).
func printRefusals(w io.Writer, mount string, queues []queuecore.QueueStats) {
	for _, s := range queues {
		if s.LastRefusals == nil && s.RefusedTotal > 0 {
			if qs, err := (queueRef{mount: mount, name: s.Queue}).readStats(); err == nil {
				s.LastRefusals = qs.LastRefusals
			}
		}
		if len(s.LastRefusals) == 0 {
			continue
		}
		fmt.Fprintf(w, "last refused in %s (newest first):\n", s.Queue)
		for _, r := range s.LastRefusals {
			name := r.Name
			if name == "" {
				name = "-"
			}
			fmt.Fprintf(w, "  %s  %s  %s  uid %d  %s\n", r.At.UTC().Format(time.RFC3339), strconv.Quote(name), r.Errno, r.UID, r.Reason)
		}
	}
}

// printDiskLine says how much room the store has left against its
// free-space floor, and whether publishes are refused for lack of it.
func printDiskLine(w io.Writer, k *queuecore.DiskStats) {
	if k == nil {
		return
	}
	line := fmt.Sprintf("disk: %s free of %s, floor %s", mib(k.FreeBytes), mib(k.TotalBytes), mib(k.MinFreeBytes))
	if k.Low {
		line += ": LOW, publishes refused with ENOSPC while consumers drain"
	}
	if k.ArchiveTrimmedTotal > 0 {
		line += fmt.Sprintf(" (%d archived messages dropped for space)", k.ArchiveTrimmedTotal)
	}
	fmt.Fprintln(w, line)
}

func mib(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB" }

// age says how long the oldest ready message has waited: "-" when none.
func age(ready int64, sec float64) string {
	if ready == 0 {
		return "-"
	}
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d < time.Second:
		return "0s"
	case d < time.Hour:
		return d.Truncate(time.Second).String()
	case d < 48*time.Hour:
		return d.Truncate(time.Minute).String()
	default:
		return strconv.Itoa(int(d.Hours()/24)) + "d"
	}
}

func rate(r float64) string {
	if r == 0 {
		return "0"
	}
	if r < 10 {
		return strconv.FormatFloat(r, 'f', 2, 64)
	}
	return strconv.FormatFloat(r, 'f', 0, 64)
}
