// Package goqite holds the schema and statements of the SQLite baseline
// the benchmarks compare yirangmq with: a queue kept the way goqite (the
// best-known Go queue on SQLite, maragudk/goqite) keeps one. goqite itself
// is not on the module proxy; its schema (schema.sql, before the priority
// column) and its send, receive and delete statements are these.
package goqite

// Schema creates the queue table.
const Schema = `
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

// The statements: Send (queue, body, timeout) returning id; Receive
// (new timeout, queue, now, max receives) returning id, body, received;
// Delete (queue, id).
const (
	Send    = `insert into goqite (queue, body, timeout) values (?, ?, ?) returning id`
	Receive = `update goqite set timeout = ?, received = received + 1
where id = (select id from goqite where queue = ? and ? >= timeout and received < ? order by created limit 1)
returning id, body, received`
	Delete = `delete from goqite where queue = ? and id = ?`
)

// Time is the layout of goqite's times (its rfc3339Milli).
const Time = "2006-01-02T15:04:05.000Z07:00"
