package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers "sqlite3" for database/sql

	"yirangmq/testenv/goqite"
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

const (
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
	if _, err := db.ExecContext(ctx, goqite.Schema); err != nil {
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
		return tx.QueryRowContext(ctx, goqite.Send, goqiteQueueName, body, time.Now().Format(goqite.Time)).Scan(&id)
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
		return tx.QueryRowContext(ctx, goqite.Receive, now.Add(goqiteTimeout).Format(goqite.Time), goqiteQueueName,
			now.Format(goqite.Time), goqiteMaxReceive).Scan(&id, &body, &received)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return "", errGoqiteEmpty
	}
	return id, err
}

// delete acks a received message.
func (g *goqiteQueue) delete(ctx context.Context, id string) error {
	return g.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, goqite.Delete, goqiteQueueName, id)
		return err
	})
}
