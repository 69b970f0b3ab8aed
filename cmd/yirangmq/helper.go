package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
)

// Mounting at boot goes through mount(8)'s helper convention. An fstab line
//
//	/var/lib/yirangmq  /mnt/mq  fuse.yirangmq  backend=sqlite,allow_other,nofail  0 0
//
// makes mount(8) run either /sbin/mount.fuse.yirangmq (the link `make
// install` puts there) or mount.fuse3, which runs `yirangmq` from PATH; both
// call us as
//
//	yirangmq STORE MOUNTPOINT [-o OPTIONS] [-n] [-s] [-f] [-v]
//
// and expect us to return once the mount is ready.

// helperName is the name mount(8) looks for in /sbin.
const helperName = "mount.fuse.yirangmq"

// isHelperCall reports whether the command line is a mount helper call:
// started as mount.fuse.yirangmq, or given a store and a mountpoint
// instead of a command.
func isHelperCall(argv0 string, args []string) bool {
	if b := filepath.Base(argv0); b == helperName || b == "mount.yirangmq" {
		return true
	}
	if len(args) < 2 || strings.HasPrefix(args[0], "-") {
		return false
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return false
		}
	}
	return args[0] != "help"
}

// runHelper turns a helper call into `mount --daemon`.
func runHelper(ctx context.Context, env *cliEnv, args []string) error {
	var pos, opts []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o" && i+1 < len(args):
			opts = append(opts, args[i+1])
			i++
		case strings.HasPrefix(a, "-o") && len(a) > 2:
			opts = append(opts, a[2:])
		case a == "-n" || a == "-s" || a == "-v" || a == "-f":
			// no mtab, sloppy, verbose, fake: nothing to do for us
		case strings.HasPrefix(a, "-"):
			return fmt.Errorf("mount helper: unknown flag %q", a)
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return fmt.Errorf("mount helper: want STORE MOUNTPOINT [-o OPTIONS], got %q", args)
	}
	margs := []string{"--daemon", "--store", pos[0]}
	for _, o := range opts {
		margs = append(margs, "-o", o)
	}
	return runMount(ctx, env, append(margs, pos[1]))
}
