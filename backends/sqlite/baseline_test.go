package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers "sqlite3" for database/sql
)

// BenchmarkGoqiteBaseline is the reference the queue core is measured
// against: a goqite-style queue (database/sql, one table, WAL, go-sqlite3
// defaults) doing send, receive and delete, each one statement. Run beside
// BenchmarkRoundTrip to compare on the same machine at the same moment.
func BenchmarkGoqiteBaseline(b *testing.B) {
	ctx := context.Background()
	db, err := sql.Open("sqlite3", filepath.Join(b.TempDir(), "goqite.db")+"?_journal=WAL&_timeout=5000&_fk=true")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	_, err = db.Exec(`
create table goqite (
  id text primary key default ('m_' || lower(hex(randomblob(16)))),
  created text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  updated text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  queue text not null,
  body blob not null,
  timeout text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  received integer not null default 0,
  priority integer not null default 0
) strict;
create trigger goqite_updated_timestamp after update on goqite begin
  update goqite set updated = strftime('%Y-%m-%dT%H:%M:%fZ') where id = old.id;
end;
create index goqite_queue_priority_created_idx on goqite (queue, priority desc, created);`)
	if err != nil {
		b.Fatal(err)
	}
	const format = "2006-01-02T15:04:05.000000Z"
	cpu := startCPU(b)
	for range b.N {
		_, err := db.ExecContext(ctx, `insert into goqite (queue, body, timeout, priority) values (?, ?, ?, ?)`,
			"bench", benchBody, time.Now().UTC().Format(format), 0)
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now().UTC()
		var id string
		var body []byte
		var received int
		err = db.QueryRowContext(ctx, `
update goqite set timeout = ?, received = received + 1
where id = (
  select id from goqite
  where queue = ? and ? >= timeout and received < ?
  order by priority desc, created
  limit 1
)
returning id, body, received`, now.Add(30*time.Second).Format(format), "bench", now.Format(format), 3).Scan(&id, &body, &received)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `delete from goqite where queue = ? and id = ?`, "bench", id); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "roundtrips/s")
	cpu.report(b)
}
