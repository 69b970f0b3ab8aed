#!/usr/bin/env bash
# make demo: mount a fresh SQLite store under ./var/demo (or $DEMO_DIR) and
# use it the way a device's shell scripts would. Everything it does is
# shown as it runs. `demo.sh --check` (make demo runs it before the build)
# checks what the demo needs and says in one line what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# check: Go 1.26 and a C compiler to build, root and /dev/fuse to mount.
# getfattr (Debian package attr) only shows the extended attributes: the
# demo does without it and says so.
check() {
	local missing=()
	local v
	v=$(${GO:-go} env GOVERSION 2>/dev/null || true)
	case "$v" in
	go1.2[6-9]* | go1.[3-9][0-9]* | go[2-9]*) ;;
	*) missing+=("Go 1.26 or later (https://go.dev/dl; found ${v:-none})") ;;
	esac
	command -v "${CC:-cc}" >/dev/null || command -v gcc >/dev/null || missing+=("a C compiler (apt-get install gcc libc6-dev)")
	[ "$(id -u)" -eq 0 ] || missing+=("root: it mounts a filesystem (sudo make demo)")
	[ -c /dev/fuse ] || missing+=("/dev/fuse (modprobe fuse; in a container, --device /dev/fuse)")
	if [ ${#missing[@]} -gt 0 ]; then
		local IFS=';'
		echo "make demo needs: ${missing[*]}" | sed 's/;/; /g' >&2
		exit 1
	fi
}
if [ "${1:-}" = --check ]; then
	check
	exit 0
fi
check
BIN=$(realpath "${BIN:-bin/yirangmq}")
VAR=$(realpath -m "${DEMO_DIR:-$PWD/var/demo}")
MNT=$VAR/mnt
STORE=$VAR/store
HAVE_ATTR=1
if ! command -v getfattr >/dev/null; then
	HAVE_ATTR=
	echo "make demo: getfattr is not installed (apt-get install attr): the demo shows the dead letters' reasons with yirangmq dlq list instead" >&2
fi

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

say "A body the queue's format refuses: close(2) fails with EINVAL, the message is kept in dlq/"
run 'echo "{not json" > jobs/inbox/broken.json    # exits 0: the shell'"'"'s builtin echo ignores the error of close(2)'
run 'echo "{not json" | cat > jobs/inbox/broken-2.json || echo "cat exited $?: it checks close(2)"'
run ls -l jobs/inbox jobs/dlq
if [ -n "$HAVE_ATTR" ]; then
	run getfattr -n user.yirangmq.reason --only-values jobs/dlq/broken.json; echo
else
	run '"$BIN" dlq list --mount "$MNT" --queue jobs'
fi

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
if [ -n "$HAVE_ATTR" ]; then
	run getfattr -d jobs/dlq/*-000-*
fi

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
