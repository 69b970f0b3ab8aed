#!/usr/bin/env bash
# make test-cross: the queue core's and the local stores' tests (sqlite, fs,
# the conformance suite and the in-process crash test), built for arm64 and
# for armv7 (GOARM=7) and run under qemu-user. The postgres store's runs are
# skipped (its server would be the host's, and they add nothing about the
# instruction set); FUSE mounts are not tested here (see docs/operations.md).
#
# Needs: apt-get install qemu-user gcc-aarch64-linux-gnu gcc-arm-linux-gnueabihf
#        libc6-dev-arm64-cross libc6-dev-armhf-cross
#
# CROSS_ARCHES="arm64 armv7" (default), CROSS_PKGS (default below),
# CROSS_RUN / CROSS_SKIP: -test.run / -test.skip patterns,
# CROSS_TIMEOUT: per package (default 30m).
# CROSS_MOUNT=1: also the FUSE tests of ./fusefs (the amd64 test binary;
# CROSS_MOUNT_RUN selects them) against the ARM daemon of make release
# (bin/release/yirangmq-linux-ARCH) serving its mount under qemu-user.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOWORK=off CGO_ENABLED=1

ARCHES=${CROSS_ARCHES:-arm64 armv7}
PKGS=${CROSS_PKGS:-./queuecore ./backends/backendtest ./backends/fs ./backends/sqlite ./fusefs}
RUN=${CROSS_RUN:-.}
SKIP=${CROSS_SKIP:-/postgres}
TIMEOUT=${CROSS_TIMEOUT:-30m}
OUT=$PWD/bin/cross
TAGS=sqlite_omit_load_extension,osusergo,netgo

need() { command -v "$1" >/dev/null || { echo "test-cross: no $1 (apt-get install $2)" >&2; exit 1; }; }

failed=()
for arch in $ARCHES; do
	case $arch in
	arm64) goenv=(GOARCH=arm64); cc=aarch64-linux-gnu-gcc; triple=aarch64-linux-gnu
		qemu=(qemu-aarch64 -L /usr/$triple -cpu "${QEMU_CPU_ARM64:-cortex-a53}") ;;
	armv7) goenv=(GOARCH=arm GOARM=7); cc=arm-linux-gnueabihf-gcc; triple=arm-linux-gnueabihf
		qemu=(qemu-arm -L /usr/$triple -cpu "${QEMU_CPU_ARMV7:-cortex-a7}") ;;
	*) echo "test-cross: unknown arch $arch (arm64, armv7)" >&2; exit 2 ;;
	esac
	need "$cc" "gcc-$triple libc6-dev-${arch/v7/hf}-cross"
	need "${qemu[0]}" qemu-user
	mkdir -p "$OUT/$arch"
	for pkg in $PKGS; do
		bin=$OUT/$arch/$(basename "$pkg").test
		start=$(date +%s)
		# The release's flags and tags: the build cache then holds one
		# cross-compiled SQLite per architecture for both.
		env "${goenv[@]}" CC=$cc go test -c -trimpath -tags "$TAGS" -o "$bin" "$pkg"
		built=$(date +%s)
		# A test that runs its own binary again (the crash test's child)
		# starts it through the same emulator (testenv.SelfCommand).
		run=$RUN
		# fusefs's other tests mount a daemon: here only its unit tests of
		# 32-bit limits (CROSS_MOUNT=1 runs the rest against the ARM daemon).
		if [ "$pkg" = ./fusefs ] && [ -z "${CROSS_RUN:-}" ]; then run='Fit32Bits|TruncatePast32Bits'; fi
		if (cd "$pkg" && YIRANGMQ_TEST_EMULATOR="${qemu[*]}" "${qemu[@]}" "$bin" \
			-test.run="$run" -test.skip="$SKIP" -test.timeout="$TIMEOUT" -test.count=1 2>&1 |
			sed "s|^|$arch $pkg: |"; exit "${PIPESTATUS[0]}"); then
			res=ok
		else
			res=FAIL; failed+=("$arch $pkg")
		fi
		end=$(date +%s)
		printf 'test-cross: %s %s %s (build %ds, run %ds)\n' "$res" "$arch" "$pkg" $((built - start)) $((end - built))
	done
	if [ "${CROSS_MOUNT:-0}" = 1 ]; then
		daemon=$PWD/bin/release/yirangmq-linux-$arch
		[ -x "$daemon" ] || { echo "test-cross: no $daemon: run make release first" >&2; exit 1; }
		# The daemon's pid is qemu's: exec, so that the tests' kills reach it.
		wrapper=$OUT/$arch/yirangmq-under-qemu
		printf '#!/bin/sh\nexec %s %s "$@"\n' "${qemu[*]}" "$daemon" > "$wrapper"
		chmod +x "$wrapper"
		start=$(date +%s)
		[ -x "$OUT/amd64/fusefs.test" ] && [ -z "$(find fusefs testenv -name '*.go' -newer "$OUT/amd64/fusefs.test")" ] ||
			{ mkdir -p "$OUT/amd64" && go test -c -o "$OUT/amd64/fusefs.test" ./fusefs; }
		built=$(date +%s)
		if (cd fusefs && YIRANGMQ_BIN=$wrapper "$OUT/amd64/fusefs.test" -test.run="${CROSS_MOUNT_RUN:-.}" \
			-test.timeout="$TIMEOUT" -test.count=1 2>&1 | sed "s|^|$arch mount: |"; exit "${PIPESTATUS[0]}"); then
			res=ok
		else
			res=FAIL; failed+=("$arch ./fusefs through the mount")
		fi
		end=$(date +%s)
		printf 'test-cross: %s %s ./fusefs through the mount of the %s daemon under qemu (build %ds, run %ds)\n' "$res" "$arch" "$arch" $((built - start)) $((end - built))
	fi
done
if [ ${#failed[@]} -gt 0 ]; then
	printf 'test-cross: FAILED: %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "test-cross: all passed ($ARCHES)"
