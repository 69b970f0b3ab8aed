package fusefs_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"yirangmq/testenv"
)

func TestMain(m *testing.M) {
	testenv.CleanLeftoverMounts()
	os.Exit(m.Run())
}

// backends are the local stores. The postgres store is not run through
// this suite: its mount-level behaviour is what testenv/multihost checks,
// with two daemons on one database (where it differs: shared names, the
// duty holder, a network split), and the core's and the store's suites
// (queuecore, backends/postgres) run every operation on it. Running the
// whole suite a third time against a server would add minutes to make
// test and check the same filesystem code again.
var backends = []string{"sqlite", "fs"}

// eachBackend runs f on a fresh mount of each store.
func eachBackend(t *testing.T, opts testenv.DaemonOptions, f func(t *testing.T, d *testenv.Daemon)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			o := opts
			o.Backend = b
			f(t, testenv.StartDaemon(t, o))
		})
	}
}

// mkq creates a queue by mkdir and gives it a policy through .policy.
func mkq(t *testing.T, d *testenv.Daemon, name, policy string) string {
	t.Helper()
	dir := d.Path(name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if policy != "" {
		if err := os.WriteFile(filepath.Join(dir, ".policy"), []byte(policy), 0o644); err != nil {
			t.Fatalf("write policy: %v", err)
		}
	}
	return dir
}

// ls lists a directory in readdir order (ls -f), without . and ..
func ls(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func sorted(s []string) []string {
	s = append([]string(nil), s...)
	sort.Strings(s)
	return s
}

func wantNames(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%s = %q, want %q", what, got, want)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// stats reads QUEUE/.stats.
func stats(t *testing.T, qdir string) map[string]any {
	t.Helper()
	var s map[string]any
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(qdir, ".stats"))), &s); err != nil {
		t.Fatalf("parse .stats: %v", err)
	}
	return s
}

func stat(t *testing.T, qdir, key string) float64 {
	t.Helper()
	v, ok := stats(t, qdir)[key].(float64)
	if !ok {
		t.Fatalf(".stats has no number %q", key)
	}
	return v
}

// client runs the C client and returns its report lines as one string.
func client(t *testing.T, dir string, args ...string) string {
	t.Helper()
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	r := testenv.Sh(t, dir, testenv.CClient(t)+" "+strings.Join(quoted, " "))
	if r.Code == 2 {
		t.Fatalf("client %v: %s", args, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

func wantOut(t *testing.T, what, got, want string) {
	t.Helper()
	if strings.TrimSpace(got) != strings.TrimSpace(want) {
		t.Fatalf("%s:\n got: %q\nwant: %q", what, got, want)
	}
}
