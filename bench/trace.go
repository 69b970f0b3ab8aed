package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// traceSeq is the FUSE request sequence one operation caused, read from
// the daemon's --debug log, and how many of the traced operations caused
// exactly that sequence.
type traceSeq struct {
	Requests []string `json:"requests"`
	Ops      int      `json:"ops"`
}

// traceResult holds the sequences per phase ("warm/publish", ...).
type traceResult struct {
	Phases map[string][]traceSeq `json:"phases"`
	Order  []string              `json:"order"`
}

// runTrace drives a few operations, one at a time, on a mount served with
// --debug, and brackets each with a marker (a stat of MNT/.mark-LABEL, a
// LOOKUP nothing else sends), so that the log says which requests each
// operation caused. "warm": each phase right after the previous one, every
// name still in the kernel's entry cache; "cold": a pause longer than the
// cache timeout before each phase, as in the timed run where thousands of
// operations separate a message's publish from its lease and ack.
func runTrace(ctx context.Context, mnt string, ops int, cacheTimeout time.Duration) ([]string, error) {
	q := filepath.Join(mnt, "trace")
	if err := setupQueue(q); err != nil {
		return nil, err
	}
	dirs := queueDirs{inbox: filepath.Join(q, "inbox"), processing: filepath.Join(q, "processing")}
	body := make([]byte, msgSize)
	var labels []string
	mark := func(label string) {
		// Let the asynchronous RELEASE and FORGETs of the last operation
		// reach the daemon before the marker.
		time.Sleep(20 * time.Millisecond)
		labels = append(labels, label)
		var st unix.Stat_t
		_ = unix.Stat(filepath.Join(mnt, ".mark-"+strings.ReplaceAll(label, "/", "~")), &st)
	}
	for _, mode := range []string{"warm", "cold"} {
		for _, op := range []opKind{opPublish, opLease, opAck} {
			if mode == "cold" && op != opPublish {
				time.Sleep(cacheTimeout + 300*time.Millisecond)
			}
			for i := range ops {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				name := msgName(mode, 0, i)
				mark(fmt.Sprintf("%s/%s/%d", mode, op, i))
				var err error
				switch op {
				case opPublish:
					err = publish(filepath.Join(dirs.inbox, name), body, false, -1)
				case opLease:
					err = unix.Rename(filepath.Join(dirs.inbox, name), filepath.Join(dirs.processing, name))
				case opAck:
					err = unix.Unlink(filepath.Join(dirs.processing, name))
				}
				if err != nil {
					return nil, fmt.Errorf("trace %s %s: %w", op, name, err)
				}
			}
		}
	}
	// .next: the reader's open and read, a publish meanwhile, the ack.
	for i := range ops {
		mark(fmt.Sprintf("next/open+read+publish+ack/%d", i))
		if _, err := runNext(ctx, q, i, 1); err != nil {
			return nil, err
		}
	}
	mark("end/0")
	return labels, nil
}

var (
	rxLine   = regexp.MustCompile(`\brx (\d+): (\S+) n(\d+)(.*)$`)
	txLine   = regexp.MustCompile(`\btx (\d+):\s+(.*)$`)
	quoted   = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)
	newDirRe = regexp.MustCompile(`\{i(\d+)`)
	nodeRe   = regexp.MustCompile(`^OK, \{n(\d+)`)
)

// parseTrace turns a --debug log into request sequences per marker.
// Node numbers become paths (from the LOOKUP, CREATE and MKDIR answers),
// so that a line reads "LOOKUP trace/processing/NAME → ENOENT".
func parseTrace(logPath string, labels []string) (traceResult, error) {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return traceResult{}, err
	}
	paths := map[uint64]string{1: ""}
	pathOf := func(n uint64) string {
		if p, ok := paths[n]; ok {
			return p
		}
		return "n" + strconv.FormatUint(n, 10)
	}
	type req struct {
		op, text, childPath string
		idx                 int // into the current segment
		seg                 string
	}
	pending := map[string]*req{}
	segs := map[string][]string{}
	cur := ""
	for _, line := range strings.Split(string(b), "\n") {
		if m := rxLine.FindStringSubmatch(line); m != nil {
			op, rest := m[2], m[4]
			node, _ := strconv.ParseUint(m[3], 10, 64)
			names := quoted.FindAllStringSubmatch(rest, -1)
			if op == "LOOKUP" && node == 1 && len(names) > 0 && strings.HasPrefix(names[0][1], ".mark-") {
				cur = strings.ReplaceAll(strings.TrimPrefix(names[0][1], ".mark-"), "~", "/")
				continue
			}
			r := &req{op: op, seg: cur}
			switch {
			case op == "RENAME" && len(names) >= 2:
				to := uint64(0)
				if mm := newDirRe.FindStringSubmatch(rest); mm != nil {
					to, _ = strconv.ParseUint(mm[1], 10, 64)
				}
				r.text = fmt.Sprintf("RENAME %s/%s → %s/%s", pathOf(node), names[0][1], pathOf(to), names[1][1])
			case len(names) >= 1 && (op == "LOOKUP" || op == "CREATE" || op == "UNLINK" || op == "MKDIR" || op == "GETXATTR"):
				if op == "GETXATTR" {
					r.text = fmt.Sprintf("GETXATTR %s %s", pathOf(node), names[0][1])
				} else {
					r.childPath = strings.TrimPrefix(pathOf(node)+"/"+names[0][1], "/")
					r.text = op + " " + r.childPath
				}
			case op == "FORGET" || op == "BATCH_FORGET":
				r.text = op // of an inode, which may have moved since its path was known
			default:
				r.text = op + " " + pathOf(node)
			}
			// Requests before the first marker (the queue's mkdir) only
			// teach node paths.
			r.idx = -1
			if cur != "" {
				r.idx = len(segs[cur])
				segs[cur] = append(segs[cur], r.text)
			}
			pending[m[1]] = r
			continue
		}
		if m := txLine.FindStringSubmatch(line); m != nil {
			r := pending[m[1]]
			if r == nil {
				continue
			}
			delete(pending, m[1])
			status := m[2]
			suffix := ""
			if mm := nodeRe.FindStringSubmatch(status); mm != nil && r.childPath != "" {
				n, _ := strconv.ParseUint(mm[1], 10, 64)
				if n != 0 {
					paths[n] = r.childPath
				} else {
					suffix = " → negative entry" // go-fuse's cached ENOENT
				}
			}
			if !strings.HasPrefix(status, "OK") {
				errno, _, _ := strings.Cut(status, "=")
				suffix = " → " + errnoName(errno)
			}
			if r.idx >= 0 && suffix != "" {
				segs[r.seg][r.idx] += suffix
			}
		}
	}
	res := traceResult{Phases: map[string][]traceSeq{}}
	for _, label := range labels {
		phase := label[:strings.LastIndexByte(label, '/')]
		if phase == "end" {
			continue
		}
		seq := segs[label]
		if _, ok := res.Phases[phase]; !ok {
			res.Order = append(res.Order, phase)
		}
		found := false
		for i, s := range res.Phases[phase] {
			if sameGeneric(s.Requests, seq) {
				res.Phases[phase][i].Ops++
				found = true
				break
			}
		}
		if !found {
			res.Phases[phase] = append(res.Phases[phase], traceSeq{Requests: seq, Ops: 1})
		}
	}
	if len(res.Order) == 0 {
		return res, errors.New("no marker found in the --debug log")
	}
	return res, nil
}

// sameGeneric compares two sequences with message names (which differ
// from operation to operation) blanked out and FORGETs left out: the
// kernel sends those when it drops an inode, asynchronously, so where they
// land says nothing about the operation.
func sameGeneric(a, b []string) bool {
	a, b = withoutForgets(a), withoutForgets(b)
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if genericName(a[i]) != genericName(b[i]) {
			return false
		}
	}
	return true
}

func withoutForgets(seq []string) []string {
	var out []string
	for _, r := range seq {
		if r != "FORGET" && r != "BATCH_FORGET" {
			out = append(out, r)
		}
	}
	return out
}

var msgNameRe = regexp.MustCompile(`(warm|cold|next)-(c0-)?\d{6}`)

func genericName(s string) string { return msgNameRe.ReplaceAllString(s, "NAME") }

func errnoName(s string) string {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return s
	}
	if name := unix.ErrnoName(unix.Errno(n)); name != "" {
		return name
	}
	return "errno " + s
}
