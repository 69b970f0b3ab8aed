package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
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
