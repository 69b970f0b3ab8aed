package fusefs

import "yirangmq/queuecore"

// maxNameLen is NAME_MAX: the longest file name a POSIX program expects
// (and what Statfs reports as the mount's name length).
//
// The kernel does not enforce it for FUSE: a 256-byte name reaches the
// daemon's LOOKUP and CREATE (measured on Linux 6.18). Without this check a
// 256-byte name got ENOENT from stat and EINVAL from open(O_CREAT), where
// every other Linux filesystem says ENAMETOOLONG. The kernel sends a
// LOOKUP before every create, mkdir and rename onto a name it has not
// cached, and never caches a failed lookup of this kind, so refusing the
// name at Lookup gives ENAMETOOLONG for all of them. The core's longest
// message name is the same NAME_MAX.
const maxNameLen = queuecore.MaxMessageName

func nameTooLong(name string) bool { return len(name) > maxNameLen }
