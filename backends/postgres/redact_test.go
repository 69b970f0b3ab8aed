package postgres

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Every form pgx parses loses its password, and what is left still means
// the same connection.
func TestRedact(t *testing.T) {
	cases := []struct{ conn, secret string }{
		{"postgres://u:SECRETPW@db:5432/q", "SECRETPW"},
		{"postgresql://u:SECRETPW@db/q?sslmode=disable", "SECRETPW"},
		{"postgres://u@db/q?password=SECRETPW&sslmode=disable", "SECRETPW"},
		{"postgres://u:SECRET%20PW@db/q", "SECRET"},
		{"host=db user=u password=SECRETPW dbname=q", "SECRETPW"},
		{"host=db password = SECRETPW dbname=q", "SECRETPW"},
		{"host=db password= SECRETPW", "SECRETPW"},
		{"host=db password =SECRETPW", "SECRETPW"},
		{"password=SECRETPW", "SECRETPW"},
		{"host=db\tpassword\t=\tSECRETPW\tdbname=q", "SECRETPW"},
		{"host=db password='SECRET PW2' dbname=q", "SECRET"},
		{`host=db password='SEC\'RET PW3' dbname=q`, "RET PW3"},
		{`host=db password=SEC\ RETPW4 dbname=q`, "RETPW4"},
		{`host=db password='' dbname=q`, "''"},
		{"host=db password=A password=SECRETPW5", "SECRETPW5"},
	}
	for _, c := range cases {
		got := Redact(c.conn)
		if strings.Contains(got, c.secret) || strings.Contains(got, "SECRET") {
			t.Errorf("Redact(%q) = %q: the password shows", c.conn, got)
		}
		want, err := pgconn.ParseConfig(c.conn)
		if err != nil {
			t.Fatalf("pgx does not parse %q: %v", c.conn, err)
		}
		if want.Password == "" {
			continue
		}
		red, err := pgconn.ParseConfig(got)
		if err != nil {
			t.Errorf("Redact(%q) = %q, which pgx does not parse: %v", c.conn, got, err)
			continue
		}
		if red.Password != "xxxxx" || red.Host != want.Host || red.User != want.User || red.Database != want.Database {
			t.Errorf("Redact(%q) = %q: password %q host %q user %q db %q; want xxxxx %q %q %q",
				c.conn, got, red.Password, red.Host, red.User, red.Database, want.Host, want.User, want.Database)
		}
	}
	for _, c := range []string{"host=db password='unterminated", "postgres://u:SECRET@db/%zz"} {
		if got := Redact(c); strings.Contains(got, "SECRET") || strings.Contains(got, "unterminated") {
			t.Errorf("Redact(%q) = %q", c, got)
		}
	}
	if got := Redact("host=db dbname=q"); got != "host=db dbname=q" {
		t.Errorf("a string without a password changed: %q", got)
	}
}
