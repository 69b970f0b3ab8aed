package main

import (
	"strings"
	"testing"
)

// TestBadFlagSaysWhy: a wrong flag or flag value exits 2 with one line
// that names the command and what was wrong, for every command.
func TestBadFlagSaysWhy(t *testing.T) {
	for _, c := range commands() {
		for _, tc := range []struct{ args, want string }{
			{"--no-such-flag", `unknown flag: --no-such-flag`},
			{"-Z", `unknown shorthand flag: 'Z' in -Z`},
		} {
			r := cli(t, "", c.name, tc.args)
			if r.code != 2 {
				t.Errorf("yirangmq %s %s: exit %d, want 2 (stderr %q)", c.name, tc.args, r.code, r.stderr)
				continue
			}
			wantLine := "yirangmq " + c.name + ": " + tc.want + " (see yirangmq " + c.name + " --help)\n"
			if r.stderr != wantLine {
				t.Errorf("yirangmq %s %s: stderr %q, want %q", c.name, tc.args, r.stderr, wantLine)
			}
			if r.stdout != "" {
				t.Errorf("yirangmq %s %s: stdout %q, want nothing", c.name, tc.args, r.stdout)
			}
		}
	}
	// Commands that take no arguments say so.
	for _, c := range []string{"version", "reference", "status", "announce", "pause", "resume", "drain"} {
		r := cli(t, "", c, "extra")
		if want := "yirangmq " + c + ": unexpected argument \"extra\"\n"; r.code != 2 || r.stderr != want || r.stdout != "" {
			t.Errorf("yirangmq %s extra: exit %d, stderr %q, stdout %d bytes; want 2, %q, nothing", c, r.code, r.stderr, len(r.stdout), want)
		}
	}
	// A value that does not parse names the flag.
	r := cli(t, "", "announce", "--interval", "soon")
	if r.code != 2 || !strings.Contains(r.stderr, `"soon"`) || !strings.Contains(r.stderr, "--interval") {
		t.Errorf("announce --interval soon: exit %d, stderr %q; want 2 and a line naming the flag and the value", r.code, r.stderr)
	}
}
