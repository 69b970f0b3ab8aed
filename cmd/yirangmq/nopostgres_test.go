package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoPostgresTag: a build with -tags nopostgres leaves the postgres
// store and its driver out (the nopostgres binaries of make release) and
// keeps both local stores; the default build has pgx and pgxpool.
func TestNoPostgresTag(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command here")
	}
	deps := func(tags string) string {
		out, err := exec.Command(goBin, "list", "-deps", "-tags", tags, ".").CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps -tags %q: %v\n%s", tags, err, out)
		}
		return string(out)
	}
	with, without := deps(""), deps("nopostgres")
	for _, pkg := range []string{"yirangmq/backends/postgres", "github.com/jackc/pgx/v5", "github.com/jackc/pgx/v5/pgxpool"} {
		if !strings.Contains(with, pkg+"\n") {
			t.Errorf("the default build does not have %s", pkg)
		}
		if strings.Contains(without, pkg) {
			t.Errorf("-tags nopostgres still builds %s", pkg)
		}
	}
	for _, pkg := range []string{"yirangmq/backends/sqlite", "yirangmq/backends/fs", "github.com/mattn/go-sqlite3"} {
		if !strings.Contains(without, pkg+"\n") {
			t.Errorf("-tags nopostgres lost %s", pkg)
		}
	}
}
