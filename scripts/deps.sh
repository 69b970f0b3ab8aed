#!/usr/bin/env bash
# make deps: what `make test` needs besides Go 1.26, on a Debian or Ubuntu
# machine. Each missing tool is mapped to its package; as root with
# apt-get the packages are installed, otherwise one line says what to
# install. Nothing is done when everything is there (make test runs this
# first, every time). .ci/run uses it too.
set -euo pipefail
GO=${GO:-go}

if ! command -v "$GO" >/dev/null; then
	echo "make deps: Go 1.26 or later is needed and $GO is not on PATH: install it from https://go.dev/dl (Debian's golang package is older)" >&2
	exit 1
fi
v=$("$GO" env GOVERSION 2>/dev/null || true)
case "$v" in
go1.2[6-9]* | go1.[3-9][0-9]* | go[2-9]*) ;;
*)
	echo "make deps: Go 1.26 or later is needed, $GO is ${v:-unknown}: install it from https://go.dev/dl" >&2
	exit 1
	;;
esac

need=()
want() { command -v "$1" >/dev/null || need+=("$2"); }
want gcc gcc                   # cgo, for SQLite
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
want fusermount3 fuse3         # mounts in tests
want getfattr attr             # xattr tests, make demo
want setfattr attr
want rsync rsync               # commit-pattern tests
want cpio cpio                 # TestEverydayTools: the tools users publish with
want zip zip
want unzip unzip
want python3 python3
want perl perl
want sqlite3 sqlite3
want setpriv util-linux        # permission tests
want nsenter util-linux        # the network split, umount with another mount namespace
want unshare util-linux
want ip iproute2               # the network split
want systemd-analyze systemd   # the shipped units are verified
# The postgres store's tests start a server of their own (testenv/pgtest).
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
# Some of them put PgBouncer in front of it (testenv/pgtest/bouncer.go).
[ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null || need+=(pgbouncer)

if [ ${#need[@]} -eq 0 ]; then
	exit 0
fi
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
	echo "make deps: missing packages: ${need[*]} (as root on Debian: apt-get install ${need[*]}; or run make deps as root)" >&2
	exit 1
fi
echo "make deps: installing ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
