package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"
)

// runPublish publishes files (or stdin) through the mount: each message is
// written as the draft inbox/.NAME and renamed to inbox/NAME, so it is
// committed whole at the rename, whatever happens to this process.
func runPublish(ctx context.Context, env *cliEnv, args []string) error {
	fl := pflag.NewFlagSet("publish", pflag.ContinueOnError)
	clientUsage(fl, "publish [--mount M] --queue Q [--file F ... | FILE ... | -] [--json] [--name N]",
		"Publishes one message per file (stdin when no file is named, or for \"-\"),\neach written as a draft inbox/.NAME and renamed to inbox/NAME. NAME is\nunique and sorts in publish order. Prints the names published.")
	var mount, queue, name string
	var files []string
	var checkJSON bool
	addMountFlag(fl, &mount)
	fl.StringVarP(&queue, "queue", "q", "", "the queue to publish to")
	fl.StringArrayVarP(&files, "file", "f", nil, "a file to publish as one message (repeatable; - is stdin)")
	fl.BoolVar(&checkJSON, "json", false, "check that every body is JSON before publishing any")
	fl.StringVar(&name, "name", "", "the message's name (one message only; default: time-based and unique)")
	if ok, err := parseFlags(env, fl, args); !ok {
		return err
	}
	sources := append(files, fl.Args()...)
	if len(sources) == 0 {
		sources = []string{"-"}
	}
	stdins := 0
	for _, s := range sources {
		if s == "-" {
			stdins++
		}
	}
	if stdins > 1 {
		fmt.Fprintln(env.stderr, "yirangmq publish: stdin (-) can be published once")
		return errUsage
	}
	if name != "" && len(sources) > 1 {
		fmt.Fprintln(env.stderr, "yirangmq publish: --name needs exactly one message")
		return errUsage
	}
	q, err := openQueue(mount, queue)
	if err != nil {
		return err
	}

	// Read (and check) every body first: a bad file publishes nothing.
	bodies := make([][]byte, len(sources))
	for i, s := range sources {
		var b []byte
		if s == "-" {
			b, err = io.ReadAll(env.stdin)
			s = "stdin"
		} else {
			b, err = os.ReadFile(s)
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", s, err)
		}
		if checkJSON && !json.Valid(b) {
			return fmt.Errorf("%s is not JSON: nothing published", s)
		}
		bodies[i] = b
	}
	gen := &nameGen{}
	for i, b := range bodies {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("interrupted after %d of %d messages", i, len(bodies))
		}
		n := name
		if n == "" {
			n = gen.next()
		}
		if err := publishOne(q, n, b); err != nil {
			if len(bodies) > 1 {
				return fmt.Errorf("%s (%d of %d messages published)", err, i, len(bodies))
			}
			return err
		}
		fmt.Fprintln(env.stdout, n)
	}
	return nil
}

// publishOne writes body to inbox/.NAME and renames it to inbox/NAME. The
// errors are those of the contract, said in words.
func publishOne(q queueRef, name string, body []byte) error {
	if strings.HasPrefix(name, ".") || strings.ContainsRune(name, '/') || name == "" {
		return fmt.Errorf("%q is not a message name (no leading dot, no slash)", name)
	}
	draft, final := q.path("inbox", "."+name), q.path("inbox", name)
	f, err := os.OpenFile(draft, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return publishError(q, name, "create", err)
	}
	_, err = f.Write(body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(draft)
		return publishError(q, name, "write", err)
	}
	if err := os.Rename(draft, final); err != nil {
		os.Remove(draft) // still there when the rename was refused before the commit
		return publishError(q, name, "commit", err)
	}
	return nil
}

// publishError turns the errnos of docs/contract.md §2 into sentences.
func publishError(q queueRef, name, op string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("publish %s: %s: %w", q.rel("inbox", name), op, err)
	}
	switch errno {
	case syscall.EINVAL:
		// A body the queue's format or schema rejects is kept in dlq/
		// with the reason; a malformed name is not.
		dead := q.path("dlq", name)
		if _, serr := os.Stat(dead); serr == nil {
			why, _ := getXattr(dead, "reason_message")
			if why != "" {
				why = " (" + why + ")"
			}
			return fmt.Errorf("%s: rejected by the queue's format%s: see %s", name, why, q.rel("dlq", name))
		}
		return fmt.Errorf("%s: invalid message name", name)
	case syscall.EEXIST:
		return fmt.Errorf("%s: a message of that name is already live in queue %s", name, q.name)
	case syscall.EDQUOT:
		return fmt.Errorf("%s: queue %s is full (it holds maxReady ready messages): try again later", name, q.name)
	case syscall.EFBIG:
		limit := ""
		if p, _, perr := q.readPolicy(); perr == nil {
			limit = fmt.Sprintf(" (%d bytes)", p.MaxMessageBytes)
		}
		return fmt.Errorf("%s: larger than queue %s's maxMessageBytes%s", name, q.name, limit)
	case syscall.ENOENT:
		if _, serr := os.Stat(q.path()); serr != nil {
			return fmt.Errorf("queue %s does not exist", q.name)
		}
	case syscall.ENOSPC:
		return fmt.Errorf("%s: the daemon's store is out of space", name)
	case syscall.EACCES, syscall.EPERM:
		return fmt.Errorf("%s: not allowed to publish to queue %s: %w", name, q.name, err)
	}
	return fmt.Errorf("publish %s: %s: %w", q.rel("inbox", name), op, err)
}

// nameGen makes message names that are unique and sort in the order they
// were made: UTC time to the nanosecond, a sequence number for names made
// in the same nanosecond by this process, and random bits against other
// producers.
type nameGen struct {
	mu   sync.Mutex
	last string
	seq  int
}

func (g *nameGen) next() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	ts := time.Now().UTC().Format("20060102T150405.000000000Z")
	if ts == g.last {
		g.seq++
	} else {
		g.last, g.seq = ts, 0
	}
	var r [5]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("%s-%03d-%s", ts, g.seq, hex.EncodeToString(r[:]))
}
