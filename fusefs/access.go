package fusefs

import (
	"context"
	"os"
	"strconv"
	"strings"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// The kernel checks the permissions of ordinary operations (the mount has
// default_permissions with allow_other). What the daemon does on its own
// behalf for a request — a lease through .next, a fanout named in a
// policy — it checks itself, with the same rules, for the caller of the
// request.

// creds is who made a request: its uid, gid and supplementary groups.
type creds struct {
	uid, gid uint32
	pid      uint32 // the thread, to read its groups from /proc when needed
	groups   []uint32
	loaded   bool
}

// callerCreds returns the credentials of a request's caller.
func callerCreds(ctx context.Context) creds {
	if c, ok := fuse.FromContext(ctx); ok {
		return creds{uid: c.Uid, gid: c.Gid, pid: c.Pid}
	}
	// No caller: a request the kernel makes by itself (RELEASE). Such
	// creds are root's, so they are never used for a check: a check is
	// made at open, which always has a caller, and its creds kept.
	return creds{}
}

// Access bits, as in access(2).
const (
	mayExec  = 1
	mayWrite = 2
	mayRead  = 4
)

// may reports whether c may do want (mayRead|mayWrite|mayExec) on a file
// with owner uid:gid and mode: the owner's bits, else the group's when c
// is in the group (primary or supplementary), else the others'. Root may
// do anything, as CAP_DAC_OVERRIDE lets it.
func (c *creds) may(uid, gid, mode, want uint32) bool {
	if c.uid == 0 {
		return true
	}
	switch {
	case c.uid == uid:
		mode >>= 6
	case c.inGroup(gid):
		mode >>= 3
	}
	return mode&want == want
}

func (c *creds) inGroup(gid uint32) bool {
	if c.gid == gid {
		return true
	}
	if !c.loaded {
		c.groups, c.loaded = supplementaryGroups(c.pid), true
	}
	for _, g := range c.groups {
		if g == gid {
			return true
		}
	}
	return false
}

// supplementaryGroups reads the Groups: line of /proc/TID/status. FUSE
// gives only the uid and the primary gid of a request; a thread that is
// gone has no groups that can be proven.
func supplementaryGroups(tid uint32) []uint32 {
	if tid == 0 {
		return nil
	}
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(tid), 10) + "/status")
	if err != nil {
		return nil
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		v, ok := strings.CutPrefix(line, "Groups:")
		if !ok {
			continue
		}
		var gs []uint32
		for _, f := range strings.Fields(v) {
			if n, err := strconv.ParseUint(f, 10, 32); err == nil {
				gs = append(gs, uint32(n))
			}
		}
		return gs
	}
	return nil
}
