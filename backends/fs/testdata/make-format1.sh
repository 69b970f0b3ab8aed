#!/usr/bin/env bash
# Writes a format-1 fs store with the build given as $1, through a real mount:
# queue q with 10 ready (one of 300 KiB, one of priority 3 via envelope in queue e),
# 5 leased, 3 dead letters with reasons, 2 archived; then stops it cleanly
# ($2=clean) or with kill -9 ($2=crash). Leaves the store in $3.
set -euo pipefail
bin=$1 how=$2 store=$3
mnt=$(mktemp -d)
rm -rf "$store"
"$bin" mount --backend fs --store "$store" --daemon "$mnt"
cd "$mnt"
mkdir q v
# q: retry limit 0 so that one nack dead-letters.
printf '{"retry":{"limit":0},"maxMessageBytes":1048576}' > q/.policy
printf '{"format":"json"}' > v/.policy
for i in $(seq -w 0 19); do printf 'body of m%s\n' "$i" > q/inbox/m$i; done
head -c 307200 /dev/zero | tr "\\0" b > q/inbox/big
for i in 00 01 02 03 04; do mv q/inbox/m$i q/processing/; done
# dead letters: a nack past the retry limit with a reason set, one by hand, one from validation
mv q/inbox/m05 q/processing/
setfattr -n user.yirangmq.reason -v BAD_INPUT -n user.yirangmq.reason_message -v "field x missing" q/processing/m05 2>/dev/null || { setfattr -n user.yirangmq.reason -v BAD_INPUT q/processing/m05; setfattr -n user.yirangmq.reason_message -v "field x missing" q/processing/m05; }
mv q/processing/m05 q/inbox/
mv q/inbox/m06 q/dlq/
mv q/inbox/m07 q/processing/ && mv q/processing/m07 q/inbox/
# archive: two acks
for i in 08 09; do mv q/inbox/m$i q/processing/ && rm q/processing/m$i; done
# v: one valid, one invalid (to dlq with VALIDATION_ERROR)
printf '{"a":1}' > v/inbox/ok
printf 'not json' > v/inbox/bad 2>/dev/null || true
ls -l q/* v/*
cd /
pid=$(awk "{print \$2}" "$store/LOCK" | tr -d ,)
if [ "$how" = crash ]; then
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fusermount3 -u "$mnt" || umount "$mnt"
else
  "$bin" umount "$mnt"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
fi
rmdir "$mnt"
