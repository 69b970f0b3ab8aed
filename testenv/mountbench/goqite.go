package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers "sqlite3" for database/sql
)

// goqiteQueue is the SQLite baseline: a queue kept the way goqite (the
// best-known Go queue on SQLite, maragudk/goqite) keeps one, with the
// statements of queuecore/bench_test.go's goqiteRoundTrip. database/sql
// and go-sqlite3 on one connection, WAL, synchronous=NORMAL; send is one
// INSERT, receive one UPDATE … RETURNING, delete one DELETE, each in a
// transaction of its own as goqite's Send, Receive and Delete do.
type goqiteQueue struct {
	db *sql.DB
}

// goqiteSchema is goqite's schema (schema.sql, before the priority column).
const goqiteSchema = `
create table goqite (
  id text primary key default ('m_' || lower(hex(randomblob(16)))),
  created text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  updated text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  queue text not null,
  body blob not null,
  timeout text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  received integer not null default 0
) strict;

create trigger goqite_updated_timestamp after update on goqite begin
  update goqite set updated = strftime('%Y-%m-%dT%H:%M:%fZ') where id = old.id;
end;

create index goqite_queue_created_idx on goqite (queue, created);
`

const (
	goqiteSendSQL    = `insert into goqite (queue, body, timeout) values (?, ?, ?) returning id`
	goqiteReceiveSQL = `update goqite set timeout = ?, received = received + 1
where id = (select id from goqite where queue = ? and ? >= timeout and received < ? order by created limit 1)
returning id, body, received`
	goqiteDeleteSQL = `delete from goqite where queue = ? and id = ?`
	// goqiteTime is goqite's rfc3339Milli.
	goqiteTime       = "2006-01-02T15:04:05.000Z07:00"
	goqiteQueueName  = "bench"
	goqiteTimeout    = 5 * time.Minute // longer than any phase: nothing is received twice
	goqiteMaxReceive = 3
)

// errGoqiteEmpty is a receive that found no message.
var errGoqiteEmpty = errors.New("goqite: no message")

// openGoqite creates the queue's database in dir.
func openGoqite(ctx context.Context, dir string) (*goqiteQueue, error) {
	dsn := "file:" + filepath.Join(dir, "goqite.db") + "?_journal=WAL&_timeout=5000&_fk=true&_sync=NORMAL"
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	if _, err := db.ExecContext(ctx, goqiteSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("goqite schema: %w", err)
	}
	var syncMode string
	if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&syncMode); err != nil || syncMode != "1" {
		db.Close()
		return nil, fmt.Errorf("goqite: PRAGMA synchronous = %q (%v), want 1 (NORMAL)", syncMode, err)
	}
	return &goqiteQueue{db: db}, nil
}

func (g *goqiteQueue) Close() error { return g.db.Close() }

// inTx is goqite's internal/sql.InTx: BEGIN, the statement, COMMIT.
func (g *goqiteQueue) inTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	tx, err := g.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// send stores body and returns its id.
func (g *goqiteQueue) send(ctx context.Context, body []byte) (string, error) {
	var id string
	err := g.inTx(ctx, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, goqiteSendSQL, goqiteQueueName, body, time.Now().Format(goqiteTime)).Scan(&id)
	})
	return id, err
}

// receive takes the oldest visible message for goqiteTimeout.
func (g *goqiteQueue) receive(ctx context.Context) (string, error) {
	var id string
	err := g.inTx(ctx, func(tx *sql.Tx) error {
		now := time.Now()
		var body []byte
		var received int
		return tx.QueryRowContext(ctx, goqiteReceiveSQL, now.Add(goqiteTimeout).Format(goqiteTime), goqiteQueueName,
			now.Format(goqiteTime), goqiteMaxReceive).Scan(&id, &body, &received)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return "", errGoqiteEmpty
	}
	return id, err
}

// delete acks a received message.
func (g *goqiteQueue) delete(ctx context.Context, id string) error {
	return g.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, goqiteDeleteSQL, goqiteQueueName, id)
		return err
	})
}
