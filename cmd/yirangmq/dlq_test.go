package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// deadLetters makes two VALIDATION_ERROR letters (bad bodies published to
// a json queue) and one MANUAL (moved by hand).
func deadLetters(t *testing.T) (mount string, check func(dir string, want ...string)) {
	d := startMount(t)
	mkqueue(t, d, "jobs", `{"format": "json"}`)
	for _, n := range []string{"bad1", "bad2"} {
		if r := cli(t, "not json", "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--name", n); r.code != 1 {
			t.Fatalf("publish %s: exit %d, %q", n, r.code, r.stderr)
		}
	}
	mustCLI(t, `{"ok": true}`, "publish", "--mount", d.Mountpoint, "--queue", "jobs", "--name", "good")
	if err := os.Rename(d.Path("jobs", "inbox", "good"), d.Path("jobs", "dlq", "good")); err != nil {
		t.Fatal(err)
	}
	return d.Mountpoint, func(dir string, want ...string) {
		t.Helper()
		if got := names(t, d, "jobs", dir); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s holds %q, want %q", dir, got, want)
		}
	}
}

func TestDlqList(t *testing.T) {
	mount, _ := deadLetters(t)
	out := mustCLI(t, "", "dlq", "list", "--mount", mount, "--queue", "jobs")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != "NAME REASON FAILED_AT ATTEMPTS REASON_MESSAGE" {
		t.Fatalf("dlq list:\n%s", out)
	}
	reasons := map[string]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		reasons[f[0]] = f[1]
	}
	if reasons["bad1"] != "VALIDATION_ERROR" || reasons["bad2"] != "VALIDATION_ERROR" || reasons["good"] != "MANUAL" {
		t.Errorf("reasons %v", reasons)
	}

	var letters []deadLetter
	out = mustCLI(t, "", "dlq", "list", "--mount", mount, "--queue", "jobs", "--filter", "reasonCode=MANUAL", "--json")
	if err := json.Unmarshal([]byte(out), &letters); err != nil {
		t.Fatal(err)
	}
	if len(letters) != 1 || letters[0].Name != "good" || letters[0].Reason != "MANUAL" || letters[0].FailedAt.IsZero() || letters[0].ReasonMessage == "" {
		t.Errorf("dlq list --filter reasonCode=MANUAL --json: %+v", letters)
	}
	out = mustCLI(t, "", "dlq", "list", "--mount", mount, "--queue", "jobs", "--older-than", "1h")
	if out != "no dead letters\n" {
		t.Errorf("dlq list --older-than 1h:\n%s", out)
	}
	out = mustCLI(t, "", "dlq", "list", "--mount", mount, "--queue", "jobs", "--filter", "name=bad*", "--json")
	if err := json.Unmarshal([]byte(out), &letters); err != nil || len(letters) != 2 {
		t.Errorf("dlq list --filter name=bad*: %s", out)
	}

	for _, args := range [][]string{{"dlq"}, {"dlq", "explode"}, {"dlq", "list", "--filter", "color=red"}} {
		if r := cli(t, "", append(args, "--mount", mount, "--queue", "jobs")...); r.code != 2 {
			t.Errorf("%q: exit %d, %q", args, r.code, r.stderr)
		}
	}
}

func TestDlqRequeue(t *testing.T) {
	mount, check := deadLetters(t)
	out := mustCLI(t, "", "dlq", "requeue", "--mount", mount, "--queue", "jobs", "--filter", "reasonCode=MANUAL")
	if out != "requeued 1 of 1 dead letters of jobs\n" {
		t.Errorf("requeue said %q", out)
	}
	check("inbox", "good")
	check("dlq", "bad1", "bad2")
	// Without a filter, every dead letter would go back, but those that
	// fail the queue's format stay: a redrive is validated again.
	r := cli(t, "", "dlq", "requeue", "--mount", mount, "--queue", "jobs")
	if r.code != 1 || !strings.HasPrefix(r.stdout, "requeued 0 of 2 ") || !strings.Contains(r.stderr, "fails the queue's format or schema") {
		t.Errorf("requeue of messages the format rejects: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	check("dlq", "bad1", "bad2")
	// With a format that takes them, they go.
	if err := os.WriteFile(filepath.Join(mount, "jobs", ".policy"), []byte(`{"format": "raw"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out = mustCLI(t, "", "dlq", "requeue", "--mount", mount, "--queue", "jobs")
	if !strings.HasPrefix(out, "requeued 2 of 2 ") {
		t.Errorf("requeue all said %q", out)
	}
	check("dlq")
}

func TestDlqPurge(t *testing.T) {
	mount, check := deadLetters(t)
	out := mustCLI(t, "", "dlq", "purge", "--mount", mount, "--queue", "jobs", "--filter", "reasonCode=VALIDATION_ERROR")
	if out != "purged 2 of 2 dead letters of jobs\n" {
		t.Errorf("purge said %q", out)
	}
	check("dlq", "good")
	check("inbox")
	mustCLI(t, "", "dlq", "purge", "--mount", mount, "--queue", "jobs")
	check("dlq")
	if out := mustCLI(t, "", "dlq", "purge", "--mount", mount, "--queue", "jobs"); out != "purged 0 of 0 dead letters of jobs\n" {
		t.Errorf("purge of an empty dlq said %q", out)
	}
}
