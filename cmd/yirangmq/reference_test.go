package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

// docs/cli.md is the output of `yirangmq reference`: generated from the
// flag definitions, checked here so it never drifts.
func TestCLIReferenceIsCurrent(t *testing.T) {
	var b bytes.Buffer
	writeReference(context.Background(), &b)
	path := filepath.Join("..", "..", "docs", "cli.md")
	if *update {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run: make docs)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Fatalf("docs/cli.md is stale: run make docs")
	}
	for _, c := range commands() {
		if c.name == "reference" {
			continue
		}
		if !bytes.Contains(want, []byte("## yirangmq "+c.name+"\n")) {
			t.Errorf("reference lacks %s", c.name)
		}
	}
}

// Every command's --help ends with two or three examples, each a
// yirangmq command line, and shows bool flags as plain --flag.
func TestHelpEndsWithExamples(t *testing.T) {
	for _, c := range commands() {
		r := cli(t, "", c.name, "--help")
		if r.code != 0 {
			t.Errorf("%s --help: exit %d", c.name, r.code)
			continue
		}
		_, ex, ok := strings.Cut(r.stdout, "\nExamples:\n")
		lines := strings.Split(strings.TrimRight(ex, "\n"), "\n")
		if !ok || len(lines) < 2 || len(lines) > 3 {
			t.Errorf("%s --help does not end with two or three examples:\n%s", c.name, r.stdout)
			continue
		}
		for _, l := range lines {
			if !strings.Contains(l, "yirangmq ") {
				t.Errorf("%s --help: example %q runs no yirangmq command", c.name, l)
			}
		}
		if strings.Contains(r.stdout, "[=true|false]") {
			t.Errorf("%s --help shows a bool flag as --flag[=true|false]:\n%s", c.name, r.stdout)
		}
	}
}
