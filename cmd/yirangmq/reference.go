package main

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

// writeReference renders docs/cli.md from the commands' own --help, so the
// reference is generated from the flag definitions and cannot drift
// (reference_test.go fails when docs/cli.md is stale; `make docs` rewrites it).
func writeReference(ctx context.Context, w io.Writer) {
	fmt.Fprintln(w, "# yirangmq command line reference")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Generated from the flag definitions by `make docs`; do not edit by hand.")
	fmt.Fprintln(w)
	var top bytes.Buffer
	usage(&top)
	fmt.Fprintf(w, "```\n%s```\n", top.String())
	for _, c := range commands() {
		if c.name == "reference" {
			continue
		}
		var out bytes.Buffer
		run(ctx, &cliEnv{stdout: &out, stderr: &out, stdin: bytes.NewReader(nil)}, []string{c.name, "--help"})
		fmt.Fprintf(w, "\n## yirangmq %s\n\n%s.\n\n```\n%s```\n", c.name, c.summary, out.String())
	}
	fmt.Fprintln(w, "\n## Mount helper")
	fmt.Fprintln(w, "\nmount(8) and /etc/fstab call the binary as `mount.fuse.yirangmq STORE MOUNTPOINT -o OPTIONS`")
	fmt.Fprintln(w, "(or, through mount.fuse3, `yirangmq STORE MOUNTPOINT -o OPTIONS`); it mounts like")
	fmt.Fprintln(w, "`yirangmq mount --daemon --store STORE -o OPTIONS MOUNTPOINT` and returns once the mount is ready.")
}

func runReference(ctx context.Context, env *cliEnv, args []string) error {
	fl := pflag.NewFlagSet("reference", pflag.ContinueOnError)
	if ok, err := parseFlagsNoArgs(env, fl, args); !ok {
		return err
	}
	writeReference(ctx, env.stdout)
	return nil
}
