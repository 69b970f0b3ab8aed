package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"yirangmq/queuecore"
)

// A change hint is the payload of one NOTIFY on channel, sent in the
// transaction of the change: a header line "yq1 ORIGIN", then a line per
// change, "FROM TO QUEUE NAME" (states as numbers, queue and name as Go
// quoted ASCII strings, so that any bytes of a name survive, whatever the
// server's encoding), or a line "*" for "anything may have changed".
const (
	payloadVersion = "yq1"
	// maxPayload keeps a payload under PostgreSQL's limit of 8000 bytes;
	// a batch whose hints do not fit sends "*" instead.
	maxPayload = 7900
	resyncLine = "*"
)

// Listener timing.
const (
	// listenPing is how long the listener waits for a notification before
	// it checks that its connection is alive (a connection cut without a
	// word, as by a network partition, would otherwise be waited on
	// forever).
	listenPing     = 30 * time.Second
	pingTimeout    = 5 * time.Second
	maxBackoff     = 5 * time.Second
	reconnectNoise = time.Minute // while reconnecting, at most one warning per minute
)

// resyncWhileDeaf is how often a store whose listener is down tells its
// subscribers that anything may have changed (reconnectListener); a
// variable for the tests.
var resyncWhileDeaf = 30 * time.Second

// payload encodes changes from this store.
func (s *Store) payload(changes []queuecore.Change) string {
	var b strings.Builder
	header := payloadVersion + " " + s.origin + "\n"
	b.WriteString(header)
	for _, c := range changes {
		if c.Queue == "" || b.Len() > maxPayload {
			// A delete given by ID alone does not say where the
			// message was; a long batch does not fit.
			return header + resyncLine + "\n"
		}
		b.WriteString(strconv.Itoa(int(c.From)))
		b.WriteByte(' ')
		b.WriteString(strconv.Itoa(int(c.To)))
		b.WriteByte(' ')
		b.WriteString(strconv.QuoteToASCII(c.Queue))
		b.WriteByte(' ')
		b.WriteString(strconv.QuoteToASCII(c.Name))
		b.WriteByte('\n')
	}
	if b.Len() > maxPayload {
		return header + resyncLine + "\n"
	}
	return b.String()
}

// parsePayload decodes a payload.
func parsePayload(p string) (origin string, changes []queuecore.Change, err error) {
	header, rest, _ := strings.Cut(p, "\n")
	v, origin, ok := strings.Cut(header, " ")
	if !ok || v != payloadVersion || origin == "" {
		return "", nil, fmt.Errorf("unknown header %q", truncate(header, 40))
	}
	for line := range strings.SplitSeq(rest, "\n") {
		if line == "" {
			continue
		}
		if line == resyncLine {
			changes = append(changes, queuecore.Change{})
			continue
		}
		c, err := parseChange(line)
		if err != nil {
			return "", nil, fmt.Errorf("line %q: %w", truncate(line, 80), err)
		}
		changes = append(changes, c)
	}
	return origin, changes, nil
}

func parseChange(line string) (queuecore.Change, error) {
	from, line, ok1 := strings.Cut(line, " ")
	to, line, ok2 := strings.Cut(line, " ")
	f, err1 := strconv.ParseUint(from, 10, 8)
	t, err2 := strconv.ParseUint(to, 10, 8)
	if !ok1 || !ok2 || err1 != nil || err2 != nil {
		return queuecore.Change{}, errors.New("bad states")
	}
	qq, err := strconv.QuotedPrefix(line)
	if err != nil || len(line) < len(qq)+1 || line[len(qq)] != ' ' {
		return queuecore.Change{}, errors.New("bad queue")
	}
	q, err1 := strconv.Unquote(qq)
	n, err2 := strconv.Unquote(line[len(qq)+1:])
	if err1 != nil || err2 != nil || q == "" {
		return queuecore.Change{}, errors.New("bad queue or name")
	}
	return queuecore.Change{Queue: q, Name: n, From: queuecore.State(f), To: queuecore.State(t)}, nil
}

// Subscribe registers fn to hear the changes that other Stores on the
// database commit. fn runs on the listener goroutine: it must not block
// for long (Close waits for it) and must not call Subscribe.
func (s *Store) Subscribe(fn func(queuecore.Change)) {
	if fn == nil {
		return
	}
	s.subMu.Lock()
	s.subs = append(s.subs, fn)
	s.subMu.Unlock()
}

// deliver calls every subscriber with c.
func (s *Store) deliver(c queuecore.Change) {
	s.subMu.Lock()
	subs := s.subs // append-only: this slice never changes
	s.subMu.Unlock()
	for _, fn := range subs {
		fn(c)
	}
}

// handle delivers the changes of a notification from another store; one
// that it cannot read becomes "anything may have changed".
func (s *Store) handle(payload string) {
	origin, changes, err := parsePayload(payload)
	if err != nil {
		s.log.Warn("unreadable change hint; treating it as a resync", queuecore.LogErr, err)
		changes = []queuecore.Change{{}}
	} else if origin == s.origin {
		return
	}
	for _, c := range changes {
		s.deliver(c)
	}
}

// connectListener opens the listener's connection and LISTENs.
func (s *Store) connectListener(ctx context.Context) (*pgx.Conn, error) {
	c, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if _, err := c.Exec(lctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		closeConn(c)
		return nil, err
	}
	return c, nil
}

// listenLoop delivers the notifications c receives until ctx is done. When
// the connection fails it reconnects, with backoff, and then delivers a
// resync: what was committed meanwhile was not heard.
func (s *Store) listenLoop(ctx context.Context, c *pgx.Conn) {
	for {
		err := s.receive(ctx, c)
		closeConn(c)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("change listener lost its connection; reconnecting", queuecore.LogErr, err)
		if c = s.reconnectListener(ctx); c == nil {
			return
		}
		s.log.Info("change listener reconnected")
		s.deliver(queuecore.Change{})
	}
}

// receive waits for notifications on c and handles them, until c fails or
// ctx is done.
func (s *Store) receive(ctx context.Context, c *pgx.Conn) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, listenPing)
		n, err := c.WaitForNotification(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !pgconn.Timeout(err) || c.IsClosed() {
				return err
			}
			pctx, cancel := context.WithTimeout(ctx, pingTimeout)
			err = c.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			continue
		}
		if n != nil {
			s.handle(n.Payload)
		}
	}
}

// reconnectListener connects again, with exponential backoff, until it
// succeeds (nil once ctx is done). Meanwhile it delivers a resync every
// resyncWhileDeaf while the database answers the pool, for a daemon whose
// listener cannot reconnect (its session_url unreachable while the pool
// works): what other daemons committed was not heard. The core also polls
// for ready messages and reloads its queues on timers of its own; the
// resync makes it read everything again at once (queues, gauges, waiting
// readers).
func (s *Store) reconnectListener(ctx context.Context) *pgx.Conn {
	delay := 100 * time.Millisecond
	lastWarn := time.Now() // listenLoop has just warned
	lastResync := time.Now()
	for {
		if time.Since(lastResync) >= resyncWhileDeaf {
			lastResync = time.Now()
			if !s.down.Load() {
				s.deliver(queuecore.Change{})
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		c, err := s.connectListener(ctx)
		if err == nil {
			return c
		}
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(lastWarn) >= reconnectNoise {
			s.log.Warn("change listener cannot reconnect; retrying", queuecore.LogErr, err)
			lastWarn = time.Now()
		}
		delay = min(2*delay, maxBackoff)
	}
}
