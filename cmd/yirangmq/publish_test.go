package main

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

func TestPublishStdin(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	out := mustCLI(t, "hello\n", "publish", "--mount", d.Mountpoint, "--queue", "jobs")
	name := strings.TrimSpace(out)
	if name == "" || strings.Contains(name, "\n") {
		t.Fatalf("publish printed %q, want one name", out)
	}
	if got := names(t, d, "jobs", "inbox"); len(got) != 1 || got[0] != name {
		t.Fatalf("inbox holds %q, want [%s]", got, name)
	}
	if b, err := os.ReadFile(msgPath(d, "jobs", "inbox", name)); err != nil || string(b) != "hello\n" {
		t.Errorf("body %q, %v", b, err)
	}
	// "-" is stdin too, and an empty body is a message.
	name2 := strings.TrimSpace(mustCLI(t, "", "publish", "-m", d.Mountpoint, "-q", "jobs", "-"))
	if fi, err := os.Stat(msgPath(d, "jobs", "inbox", name2)); err != nil || fi.Size() != 0 {
		t.Errorf("empty message: %v, %v", fi, err)
	}
	if name2 <= name {
		t.Errorf("names do not sort in publish order: %q then %q", name, name2)
	}
}

func TestPublishFiles(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	dir := t.TempDir()
	var files []string
	for _, body := range []string{"first", "second", "third"} {
		f := filepath.Join(dir, body)
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	out := mustCLI(t, "", "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--file", files[0], "-f", files[1], files[2])
	published := strings.Fields(out)
	if len(published) != 3 || !sort.StringsAreSorted(published) {
		t.Fatalf("publish printed %q, want three sorted names", out)
	}
	// Delivery order is the order of the files.
	inbox := names(t, d, "jobs", "inbox")
	if strings.Join(inbox, " ") != strings.Join(published, " ") {
		t.Errorf("inbox order %q, want %q", inbox, published)
	}
	for i, n := range published {
		b, _ := os.ReadFile(msgPath(d, "jobs", "inbox", n))
		if want := filepath.Base(files[i]); string(b) != want {
			t.Errorf("%s holds %q, want %q", n, b, want)
		}
	}
	// No draft is left behind.
	es, _ := os.ReadDir(d.Path("jobs", "inbox"))
	for _, e := range es {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("draft left: %s", e.Name())
		}
	}

	r := cli(t, "", "publish", "--mount", d.Mountpoint, "--queue", "jobs", filepath.Join(dir, "missing"))
	if r.code != 1 || !strings.Contains(r.stderr, "missing") {
		t.Errorf("publish of a missing file: exit %d, %q", r.code, r.stderr)
	}
}

func TestPublishName(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "jobs", "")
	if out := mustCLI(t, "x", "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--name", "order-1"); out != "order-1\n" {
		t.Errorf("publish --name printed %q", out)
	}
	r := cli(t, "y", "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--name", "order-1")
	if r.code != 1 || !strings.Contains(r.stderr, "order-1: a message of that name is already live in queue jobs") {
		t.Errorf("second publish of a live name: exit %d, %q", r.code, r.stderr)
	}
	r = cli(t, "y", "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--name", ".hidden")
	if r.code != 1 || !strings.Contains(r.stderr, "not a message name") {
		t.Errorf("publish --name .hidden: exit %d, %q", r.code, r.stderr)
	}
	r = cli(t, "y", "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--name", "n", "a", "b")
	if r.code != 2 {
		t.Errorf("--name with two files: exit %d, %q", r.code, r.stderr)
	}
}

func TestPublishJSON(t *testing.T) {
	d := startMount(t)
	mkqueue(t, d, "raw", "")
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	os.WriteFile(good, []byte(`{"n": 1}`), 0o644)
	os.WriteFile(bad, []byte(`{"n": `), 0o644)

	// --json checks before sending: a bad file publishes nothing at all.
	r := cli(t, "", "publish", "--mount", d.Mountpoint, "--queue", "raw", "--json", good, bad)
	if r.code != 1 || !strings.Contains(r.stderr, bad+" is not JSON: nothing published") {
		t.Errorf("publish --json of a bad body: exit %d, %q", r.code, r.stderr)
	}
	if got := names(t, d, "raw", "inbox"); len(got) != 0 {
		t.Errorf("inbox holds %q after a refused batch", got)
	}
	r = cli(t, "nope", "publish", "--mount", d.Mountpoint, "--queue", "raw", "--json")
	if r.code != 1 || !strings.Contains(r.stderr, "stdin is not JSON") {
		t.Errorf("publish --json of bad stdin: exit %d, %q", r.code, r.stderr)
	}
	mustCLI(t, "", "publish", "--mount", d.Mountpoint, "--queue", "raw", "--json", good)

	// A queue whose format is json refuses at the commit, and keeps the
	// message in dlq/: the error says where.
	mkqueue(t, d, "jobs", `{"format": "json"}`)
	r = cli(t, "not json", "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--name", "m1")
	if r.code != 1 || !strings.Contains(r.stderr, "m1: rejected by the queue's format") || !strings.Contains(r.stderr, "see jobs/dlq/m1") {
		t.Errorf("publish of a bad body to a json queue: exit %d, %q", r.code, r.stderr)
	}
	if got := names(t, d, "jobs", "dlq"); len(got) != 1 || got[0] != "m1" {
		t.Errorf("dlq holds %q, want [m1]", got)
	}
}

func TestPublishErrors(t *testing.T) {
	d := startMount(t)
	r := cli(t, "x", "publish", "--mount", d.Mountpoint, "--queue", "jobs")
	if r.code != 1 || !strings.Contains(r.stderr, "queue jobs does not exist") {
		t.Errorf("publish to a missing queue: exit %d, %q", r.code, r.stderr)
	}
	mkqueue(t, d, "small", `{"maxMessageBytes": 4, "maxReady": 1}`)
	r = cli(t, "too long", "publish", "--mount", d.Mountpoint, "--queue", "small")
	if r.code != 1 || !strings.Contains(r.stderr, "larger than queue small's maxMessageBytes (4 bytes)") {
		t.Errorf("publish of a big body: exit %d, %q", r.code, r.stderr)
	}
	mustCLI(t, "ok", "publish", "--mount", d.Mountpoint, "--queue", "small")
	r = cli(t, "ok", "publish", "--mount", d.Mountpoint, "--queue", "small")
	if r.code != 1 || !strings.Contains(r.stderr, "queue small is full") {
		t.Errorf("publish to a full queue: exit %d, %q", r.code, r.stderr)
	}
	if got := names(t, d, "small", "inbox"); len(got) != 1 {
		t.Errorf("inbox holds %q", got)
	}
}
