#!/usr/bin/env bash
# The budget of docs/backends.md, measured on this machine for the binaries
# of make release: stripped size, the daemon's RSS idle and with 100,000
# ready messages on the sqlite store (through a real mount, the ARM
# binaries under qemu-user), and the core's throughput in process under
# qemu as a ratio to amd64 (the test binaries of make test-cross).
# As root. BUDGET_MESSAGES (default 100000), BUDGET_ARCHES.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${BUDGET_MESSAGES:-100000}
ARCHES=${BUDGET_ARCHES:-amd64 arm64 armv7}
REL=$PWD/bin/release
WORK=$(mktemp -d /tmp/yirangmq-budget.XXXXXX)
pid=

emu() {
	case $1 in
	amd64) ;;
	arm64) echo "qemu-aarch64 -cpu ${QEMU_CPU_ARM64:-cortex-a53}" ;;
	armv7) echo "qemu-arm -cpu ${QEMU_CPU_ARMV7:-cortex-a7}" ;;
	esac
}

# start ARCH STORE MNT: the daemon in the foreground (its pid in $pid; for
# ARM, the pid of qemu, which is the daemon's process), until it serves.
start() {
	mkdir -p "$3"
	# shellcheck disable=SC2046
	$(emu "$1") "$REL/yirangmq-linux-$1" mount --store "$2" --sync normal --log-file "$WORK/$1.log" "$3" &
	pid=$!
	for _ in $(seq 600); do
		grep -qs " $3 fuse" /proc/mounts && return 0
		kill -0 "$pid" 2>/dev/null || { echo "budget: the $1 daemon exited:" >&2; cat "$WORK/$1.log" >&2; return 1; }
		sleep 0.2
	done
	echo "budget: the $1 daemon did not mount within 120 s" >&2
	return 1
}

# stop: SIGTERM unmounts; then wait for the process to exit.
stop() {
	kill -TERM "$pid"
	wait "$pid" || true
	pid=
}

cleanup() {
	if [ -n "$pid" ]; then stop; fi
	rm -rf "$WORK"
}
trap cleanup EXIT

# mem ARCH: VmRSS and VmHWM of the process; under qemu also "guest", the
# resident pages of the emulated program's own mappings (what a board
# would count, near enough): the 4 GiB window of a 32-bit guest, or for
# arm64 (guest addresses are host addresses) every mapping below qemu's
# binary. The rest is qemu: its heap, translation cache and libraries.
mem() {
	awk '/^VmRSS|^VmHWM/ {printf "%s %.1f MiB  ", $1, $2/1024}' "/proc/$pid/status"
	[ "$1" = amd64 ] && return 0
	python3 - "$pid" "$1" "$REL/yirangmq-linux-$1" <<'PY'
import sys
pid, arch, binary = sys.argv[1], sys.argv[2], sys.argv[3]
maps, cur = [], None
for line in open(f"/proc/{pid}/smaps"):
    f = line.split()
    if "-" in f[0] and len(f) >= 5 and ":" not in f[0]:
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        cur = [lo, f[5] if len(f) > 5 else "", 0]
        maps.append(cur)
    elif f[0] == "Rss:":
        cur[2] = int(f[1])
if arch == "armv7":
    base = min(m[0] for m in maps if m[1] == binary) - 0x10000  # Go's arm text starts at 0x10000
    guest = sum(m[2] for m in maps if base <= m[0] < base + (1 << 32))
else:
    qemu = min(m[0] for m in maps if "/qemu-" in m[1])
    guest = sum(m[2] for m in maps if m[0] < qemu)
print(f"guest {guest / 1024:.1f} MiB", end="")
PY
}

echo "== size (stripped, static; every store, then nopostgres)"
for a in $ARCHES; do
	for f in "yirangmq-linux-$a" "yirangmq-nopostgres-linux-$a"; do
		printf '%-6s %6.2f MB  %s  %s\n' "$a" "$(stat -c %s "$REL/$f" | awk '{print $1/1e6}')" "$(cd "$REL" && sha256sum "$f" | cut -c1-16)" "$f"
	done
done

echo "== fill $N ready messages (amd64 daemon, through the mount)"
start amd64 "$WORK/full" "$WORK/mnt"
mkdir "$WORK/mnt/q"
python3 - "$WORK/mnt/q/inbox" "$N" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
body = b"x" * 255 + b"\n"
for i in range(n):
    with open(os.path.join(d, "m%07d" % i), "wb") as f:
        f.write(body)
PY
stop

echo "== RSS (VmRSS now, VmHWM peak; under qemu the emulator's own memory counts too)"
for a in $ARCHES; do
	rm -rf "$WORK/idle" && start "$a" "$WORK/idle" "$WORK/mnt"
	mkdir "$WORK/mnt/q" && cat "$WORK/mnt/q/.stats" >/dev/null
	sleep 2
	printf '%-6s idle:        %s\n' "$a" "$(mem "$a")"
	stop
	rm -rf "$WORK/copy" && cp -a "$WORK/full" "$WORK/copy"
	start "$a" "$WORK/copy" "$WORK/mnt"
	cat "$WORK/mnt/q/.stats" >/dev/null
	for i in $(seq 0 99); do
		m=$(printf 'm%07d' "$i")
		mv "$WORK/mnt/q/inbox/$m" "$WORK/mnt/q/processing/$m" && rm "$WORK/mnt/q/processing/$m"
	done
	ready=$(sed -n 's/.*"ready": *\([0-9]*\).*/\1/p' "$WORK/mnt/q/.stats" | head -1)
	sleep 2
	printf '%-6s %s ready: %s\n' "$a" "$ready" "$(mem "$a")"
	stop
done
