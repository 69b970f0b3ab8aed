package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
)

// runDlq lists, redrives or deletes a queue's dead letters through the
// mount: the reasons come from the messages' xattrs, a requeue is
// mv dlq/NAME inbox/, a purge is rm dlq/NAME.
func runDlq(ctx context.Context, env *cliEnv, args []string) error {
	fl := pflag.NewFlagSet("dlq", pflag.ContinueOnError)
	clientUsage(fl, "dlq list|requeue|purge [--mount M] --queue Q [--filter KEY=VALUE ...] [--older-than D]",
		"list shows the dead letters of a queue with why and when they failed;\nrequeue moves the matching ones back to inbox/ (attempts reset); purge\ndeletes them. Filters: reasonCode=CODE (e.g. HANDLER_FAILED,\nVALIDATION_ERROR, LEASE_EXPIRED, NACKED, MANUAL), name=GLOB.")
	var mount, queue string
	var filters []string
	var olderThan time.Duration
	var asJSON bool
	addMountFlag(fl, &mount)
	fl.StringVarP(&queue, "queue", "q", "", "the queue")
	fl.StringArrayVar(&filters, "filter", nil, "only messages matching KEY=VALUE: reasonCode=CODE or name=GLOB (repeatable: all must match)")
	fl.DurationVar(&olderThan, "older-than", 0, "only messages dead-lettered at least this long ago")
	fl.BoolVar(&asJSON, "json", false, "list: print JSON")
	if ok, err := parseFlags(env, fl, args); !ok {
		return err
	}
	if fl.NArg() != 1 {
		fmt.Fprintln(env.stderr, "yirangmq dlq: one action is needed: list, requeue or purge (see yirangmq dlq --help)")
		return errUsage
	}
	action := fl.Arg(0)
	if action != "list" && action != "requeue" && action != "purge" {
		fmt.Fprintf(env.stderr, "yirangmq dlq: unknown action %q: list, requeue or purge\n", action)
		return errUsage
	}
	match, err := parseDeadFilters(filters, olderThan)
	if err != nil {
		fmt.Fprintf(env.stderr, "yirangmq dlq: %v\n", err)
		return errUsage
	}
	q, err := openQueue(mount, queue)
	if err != nil {
		return err
	}
	letters, err := listDead(ctx, q, match)
	if err != nil {
		return err
	}
	switch action {
	case "list":
		if asJSON {
			if letters == nil {
				letters = []deadLetter{}
			}
			b, _ := json.MarshalIndent(letters, "", "  ")
			_, err := fmt.Fprintf(env.stdout, "%s\n", b)
			return err
		}
		printDeadTable(env.stdout, letters)
		return nil
	case "requeue":
		return eachDead(ctx, env, q, letters, "requeued", func(name string) error {
			err := os.Rename(q.path("dlq", name), q.path("inbox", name))
			if errors.Is(err, syscall.EINVAL) {
				// A redrive is validated again (docs/contract.md §2).
				return fmt.Errorf("%s stays in dlq/: it fails the queue's format or schema as they are now (yirangmq status says why): %w", name, err)
			}
			return err
		})
	default:
		return eachDead(ctx, env, q, letters, "purged", func(name string) error {
			return os.Remove(q.path("dlq", name))
		})
	}
}

// deadLetter is one message of dlq/ and its xattrs.
type deadLetter struct {
	Name          string    `json:"name"`
	Reason        string    `json:"reason"`
	ReasonMessage string    `json:"reason_message"`
	FailedAt      time.Time `json:"failed_at"`
	Attempts      int       `json:"attempts"`
	Size          int64     `json:"size"`
}

type deadFilter func(deadLetter) bool

// parseDeadFilters turns --filter and --older-than into one predicate.
func parseDeadFilters(filters []string, olderThan time.Duration) (deadFilter, error) {
	var preds []deadFilter
	for _, f := range filters {
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			return nil, fmt.Errorf("--filter %q: want KEY=VALUE", f)
		}
		switch k {
		case "reasonCode", "reason":
			preds = append(preds, func(d deadLetter) bool { return strings.EqualFold(d.Reason, v) })
		case "name":
			if _, err := path.Match(v, ""); err != nil {
				return nil, fmt.Errorf("--filter %q: %w", f, err)
			}
			preds = append(preds, func(d deadLetter) bool { ok, _ := path.Match(v, d.Name); return ok })
		default:
			return nil, fmt.Errorf("--filter %q: unknown key %q (reasonCode or name)", f, k)
		}
	}
	if olderThan < 0 {
		return nil, errors.New("--older-than must not be negative")
	}
	if olderThan > 0 {
		cut := time.Now().Add(-olderThan)
		preds = append(preds, func(d deadLetter) bool { return !d.FailedAt.After(cut) })
	}
	return func(d deadLetter) bool {
		for _, p := range preds {
			if !p(d) {
				return false
			}
		}
		return true
	}, nil
}

// listDead reads dlq/ and the xattrs of each message, oldest failure first.
// Messages that leave dlq/ meanwhile are skipped.
func listDead(ctx context.Context, q queueRef, match deadFilter) ([]deadLetter, error) {
	entries, err := os.ReadDir(q.path("dlq"))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", q.name+"/dlq", err)
	}
	var out []deadLetter
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, err := readDead(q, e.Name())
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if match(d) {
			out = append(out, d)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].FailedAt.Before(out[j].FailedAt) })
	return out, nil
}

func readDead(q queueRef, name string) (deadLetter, error) {
	p := q.path("dlq", name)
	d := deadLetter{Name: name}
	fi, err := os.Stat(p)
	if err != nil {
		return d, err
	}
	d.Size = fi.Size()
	d.FailedAt = fi.ModTime() // dlq/: mtime is the dead-letter time
	vals := map[string]string{}
	for _, k := range []string{"reason", "reason_message", "failed_at", "attempts"} {
		v, err := getXattr(p, k)
		if err != nil {
			return d, err
		}
		vals[k] = v
	}
	d.Reason, d.ReasonMessage = vals["reason"], vals["reason_message"]
	if t, err := time.Parse(time.RFC3339Nano, vals["failed_at"]); err == nil {
		d.FailedAt = t
	}
	d.Attempts, _ = strconv.Atoi(vals["attempts"])
	return d, nil
}

func printDeadTable(w io.Writer, letters []deadLetter) {
	if len(letters) == 0 {
		fmt.Fprintln(w, "no dead letters")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tREASON\tFAILED_AT\tATTEMPTS\tREASON_MESSAGE")
	for _, d := range letters {
		msg := strings.ReplaceAll(d.ReasonMessage, "\n", " ")
		if len(msg) > 120 {
			msg = msg[:117] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", d.Name, orDash(d.Reason), d.FailedAt.Local().Format(time.RFC3339), d.Attempts, orDash(msg))
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// progressBatch: batches larger than this show progress on a terminal.
const progressBatch = 100

// eachDead applies op to every letter, with a progress line on stderr for
// big batches when stderr is a terminal. Messages already gone are not
// errors; other failures are counted and the first one returned.
func eachDead(ctx context.Context, env *cliEnv, q queueRef, letters []deadLetter, verb string, op func(name string) error) error {
	progress := len(letters) > progressBatch && isTerminal(env.stderr)
	done, gone, failed := 0, 0, 0
	var first error
	for i, d := range letters {
		if ctx.Err() != nil {
			break
		}
		err := op(d.Name)
		switch {
		case err == nil:
			done++
		case errors.Is(err, os.ErrNotExist):
			gone++
		default:
			failed++
			if first == nil {
				first = err
			}
		}
		if progress && (i%10 == 0 || i == len(letters)-1) {
			fmt.Fprintf(env.stderr, "\r%s %d/%d", verb, i+1, len(letters))
		}
	}
	if progress {
		fmt.Fprintln(env.stderr)
	}
	fmt.Fprintf(env.stdout, "%s %d of %d dead letters of %s", verb, done, len(letters), q.name)
	if gone > 0 {
		fmt.Fprintf(env.stdout, " (%d had already left dlq/)", gone)
	}
	fmt.Fprintln(env.stdout)
	switch {
	case first != nil:
		return fmt.Errorf("%d failed, first: %w", failed, first)
	case ctx.Err() != nil:
		return fmt.Errorf("interrupted after %d of %d", done+gone, len(letters))
	}
	return nil
}
