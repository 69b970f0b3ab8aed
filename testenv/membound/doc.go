// Package membound checks that the daemon's memory stays bounded when a
// backlog is published through the mount: the daemon runs in a memory
// cgroup of 64 MiB, a producer publishes with open/write/close and no
// consumer, then every message is leased and acknowledged (see
// docs/performance-history.md, "Memory with a backlog"). `make test` publishes
// 20,000 messages per store; `make mem-bench` 1,000,000, printing the
// daemon's RSS at 0, 100k, 500k and 1M; `make mem-soak` runs 2 producers
// and 2 consumers for 5 minutes with a growing backlog.
package membound
