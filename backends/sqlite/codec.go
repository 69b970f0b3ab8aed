package sqlite

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/mattn/go-sqlite3"

	"yirangmq/backends"
	"yirangmq/queuecore"
)

// Times are stored as backends.Nanos keeps them.

func nanos(t time.Time) int64 { return backends.Nanos(t) }

func fromNanos(n int64) time.Time { return backends.FromNanos(n) }

// newArgs returns n positional arguments, numbered from 1, to be reused by
// one connection's statements.
func newArgs(n int) []driver.NamedValue {
	args := make([]driver.NamedValue, n)
	for i := range args {
		args[i].Ordinal = i + 1
	}
	return args
}

// bindMessage sets args[0:nMsgCols] to m's metadata, in msgCols order.
func bindMessage(args []driver.NamedValue, m *queuecore.Message) {
	_ = args[nMsgCols-1]
	args[0].Value = int64(m.ID)
	args[1].Value = m.Queue
	args[2].Value = m.Name
	args[3].Value = int64(m.State)
	args[4].Value = m.SortKey()
	args[5].Value = int64(m.Seq)
	args[6].Value = int64(m.Priority)
	args[7].Value = m.Size
	args[8].Value = m.MessageID
	args[9].Value = nanos(m.PublishedAt)
	args[10].Value = nanos(m.FirstAt)
	args[11].Value = nanos(m.StateAt)
	args[12].Value = nanos(m.Deadline)
	args[13].Value = int64(m.Attempts)
	args[14].Value = int64(m.Redrives)
	args[15].Value = m.Reason
	args[16].Value = m.ReasonMessage
	args[17].Value = nanos(m.FailedAt)
	args[18].Value = m.Consumer
	args[19].Value = m.DedupKey
	args[20].Value = int64(m.UID)
	args[21].Value = int64(m.GID)
}

// scanMessage reads a row of msgCols.
func scanMessage(dest []driver.Value) (queuecore.Message, error) {
	_ = dest[nMsgCols-1]
	var c scanner
	m := queuecore.Message{
		ID:            uint64(c.int(dest[0])),
		Queue:         c.str(dest[1]),
		Name:          c.str(dest[2]),
		State:         queuecore.State(c.int(dest[3])),
		Seq:           uint64(c.int(dest[5])),
		Priority:      int(c.int(dest[6])),
		Size:          c.int(dest[7]),
		MessageID:     c.str(dest[8]),
		PublishedAt:   fromNanos(c.int(dest[9])),
		FirstAt:       fromNanos(c.int(dest[10])),
		StateAt:       fromNanos(c.int(dest[11])),
		Deadline:      fromNanos(c.int(dest[12])),
		Attempts:      int(c.int(dest[13])),
		Redrives:      int(c.int(dest[14])),
		Reason:        c.str(dest[15]),
		ReasonMessage: c.str(dest[16]),
		FailedAt:      fromNanos(c.int(dest[17])),
		Consumer:      c.str(dest[18]),
		DedupKey:      c.str(dest[19]),
		UID:           uint32(c.int(dest[20])),
		GID:           uint32(c.int(dest[21])),
	}
	if c.err != nil {
		return queuecore.Message{}, fmt.Errorf("read message %d: %w", m.ID, c.err)
	}
	return m, nil
}

// scanner converts column values and keeps the first type mismatch, which
// only a store edited by hand can produce.
type scanner struct{ err error }

func (c *scanner) int(v driver.Value) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case nil:
		return 0
	}
	c.fail(v, "an integer")
	return 0
}

func (c *scanner) str(v driver.Value) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	}
	c.fail(v, "text")
	return ""
}

func (c *scanner) bytes(v driver.Value) []byte {
	switch v := v.(type) {
	case []byte:
		return v
	case string:
		return []byte(v)
	case nil:
		return []byte{}
	}
	c.fail(v, "a blob")
	return nil
}

func (c *scanner) fail(v driver.Value, want string) {
	if c.err == nil {
		c.err = fmt.Errorf("column holds %T, want %s", v, want)
	}
}

// constraintErr maps a constraint violation to the sentinel the Store
// contract names: a taken ID or name is ErrExists, a missing queue (the
// foreign key) is ErrNotFound. It returns nil for any other error.
func constraintErr(err error) error {
	var se sqlite3.Error
	if !errors.As(err, &se) || se.Code != sqlite3.ErrConstraint {
		return nil
	}
	switch se.ExtendedCode {
	case sqlite3.ErrConstraintPrimaryKey, sqlite3.ErrConstraintUnique, sqlite3.ErrConstraintRowID:
		return queuecore.ErrExists
	case sqlite3.ErrConstraintForeignKey:
		return queuecore.ErrNotFound
	}
	return nil
}
