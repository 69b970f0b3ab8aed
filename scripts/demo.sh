#!/usr/bin/env bash
# make demo: mount a fresh SQLite store under ./var/demo and use it the way
# a device's shell scripts would. Everything it does is shown as it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${BIN:-bin/yirangmq}")
VAR=$PWD/var/demo
MNT=$VAR/mnt
STORE=$VAR/store

cleanup() {
	if grep -qs " $MNT " /proc/mounts; then "$BIN" umount "$MNT" 2>/dev/null || "$BIN" umount --lazy "$MNT" || true; fi
}
trap cleanup EXIT
cleanup
rm -rf "$VAR" && mkdir -p "$MNT"

say() { printf '\n\033[1m## %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; eval "$@"; }

say "Mount a SQLite store (the daemon returns once the mount is ready)"
run "$BIN" mount --daemon --backend sqlite --store "$STORE" --sync full --log-file "$VAR/daemon.log" "$MNT"
cd "$MNT"

say "A queue is a directory"
run mkdir jobs
run ls jobs
run 'echo '"'"'{"format": "json", "retry": {"limit": 1, "initialDelaySec": 0}}'"'"' > jobs/.policy'

say "Publish: write a file in inbox/ (committed at close)"
run 'for i in 1 2 3; do echo "{\"job\": $i}" > jobs/inbox/job-$i.json; done'
run 'echo "{not json" > jobs/inbox/broken.json || true'
run ls -l jobs/inbox jobs/dlq
run getfattr -n user.yirangmq.reason --only-values jobs/dlq/broken.json; echo

say "Consume with plain file operations: lease with mv, ack with rm"
run mv jobs/inbox/job-1.json jobs/processing/
run cat jobs/processing/job-1.json
run rm jobs/processing/job-1.json
run ls jobs/archive

say "Consume without polling: .next blocks until it can lease"
run 'm=$(cat jobs/.next) && echo "leased $m: $(cat jobs/$m)" && rm jobs/$m'

say "Publish more with the command line (draft + rename, unique names)"
run 'printf '"'"'{"job": 4}'"'"' | "$BIN" publish --mount "$MNT" --queue jobs'
run 'printf '"'"'{"job": 5, "fail": true}'"'"' | "$BIN" publish --mount "$MNT" --queue jobs'

say "yirangmq consume: runs a handler per message; exit 0 acks, anything else nacks"
cat > "$VAR/handler.sh" <<'HANDLER'
#!/bin/sh
body=$(cat)
case "$body" in *'"fail": true'*) echo "cannot handle $body" >&2; exit 3;; esac
echo "handled $body"
HANDLER
chmod +x "$VAR/handler.sh"
run '"$BIN" consume --mount "$MNT" --queue jobs --drain -- "$VAR/handler.sh"'

say "The failing message spent its retries and is in dlq/ with the reason"
run '"$BIN" dlq list --mount "$MNT" --queue jobs'
run getfattr -d jobs/dlq/*-000-*

say "Redrive it and look at the queues"
run '"$BIN" dlq requeue --mount "$MNT" --queue jobs --filter reasonCode=HANDLER_FAILED'
run '"$BIN" status --mount "$MNT"'
run cat jobs/.stats

cd - >/dev/null
say "Unmount"
run "$BIN" umount "$MNT"
say "What the daemon logged ($VAR/daemon.log)"
sleep 0.2
cat "$VAR/daemon.log"
