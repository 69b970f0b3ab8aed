package fusefs_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"yirangmq/queuecore"
	"yirangmq/testenv"
)

// daemonDisk reads the "disk" object of MOUNT/.stats.
func daemonDisk(t *testing.T, d *testenv.Daemon) queuecore.DiskStats {
	t.Helper()
	var s queuecore.DaemonStats
	if err := json.Unmarshal([]byte(readFile(t, d.Path(".stats"))), &s); err != nil {
		t.Fatalf("parse MOUNT/.stats: %v", err)
	}
	if s.Disk == nil {
		t.Fatal("MOUNT/.stats has no disk object")
	}
	return *s.Disk
}

// A full disk never freezes a queue (issue: a device whose consumer was
// down fills its disk). On an 8 MiB tmpfs with the default floor, each
// local store: publishes of 4 KiB messages are refused with ENOSPC once
// free space is under the floor; every message then drains with mv and
// rm without one error, the archive giving way; publishing comes back
// without a restart. Then the same with the disk filled by a file from
// outside the mount and removed. Nothing committed is lost (checked after
// a restart too), and the log, on the same small disk, stays small.
func TestDiskFloorDrain(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			small := smallFS(t, "8m")
			store := filepath.Join(small, "store")
			logFile := filepath.Join(store, "yirangmq.log") // where --daemon puts it
			d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: backend, Sync: "full", Store: store,
				Args: []string{"--log-file", logFile, "--log-max-size", "64K"}})
			t.Cleanup(func() {
				if t.Failed() {
					b, _ := os.ReadFile(logFile)
					t.Logf("daemon log file:\n%s", b)
				}
			})
			q := mkq(t, d, "q", "") // default policy: the archive keeps acked messages
			inbox := filepath.Join(q, "inbox")
			body := func(name string) []byte {
				return bytes.Repeat([]byte(fmt.Sprintf("%-15s\n", name)), 4096/16)
			}
			want := map[string]bool{} // committed and not consumed
			publish := func(name string) string {
				o, w, c := rawPublish(filepath.Join(inbox, name), body(name))
				if o+w+c == "OKOKOK" {
					want[name] = true
					return "OK"
				}
				if o != "OK" {
					return "open=" + o
				}
				return fmt.Sprintf("write=%s close=%s", w, c)
			}
			check := func(when string) {
				t.Helper()
				got := ls(t, inbox)
				if !sameSet(got, keysOf(want)) {
					t.Fatalf("%s: inbox/ lists %d messages, want the %d committed", when, len(got), len(want))
				}
				for _, name := range got {
					if b, err := os.ReadFile(filepath.Join(inbox, name)); err != nil || !bytes.Equal(b, body(name)) {
						t.Fatalf("%s: inbox/%s reads %d bytes (%v), want its %d", when, name, len(b), err, len(body(name)))
					}
				}
			}
			// drain leases and acks every message with mv and rm, in one
			// shell, and fails on the first error.
			drain := func(when string) {
				t.Helper()
				n := len(want)
				out := testenv.MustSh(t, q, `set -e; k=0; for f in inbox/*; do [ -e "$f" ] || continue; mv "$f" processing/; rm "processing/${f#inbox/}"; k=$((k+1)); done; echo $k`)
				if got := strings.TrimSpace(out); got != fmt.Sprint(n) {
					t.Fatalf("%s: drained %s messages, want %d", when, got, n)
				}
				clear(want)
				if left := ls(t, inbox); len(left) != 0 {
					t.Fatalf("%s: inbox/ still lists %q", when, left)
				}
			}
			// resume waits until a publish succeeds again and says how long
			// it took; every failure until then must be ENOSPC.
			resume := func(when string) time.Duration {
				t.Helper()
				start := time.Now()
				i := 0
				if !testenv.RetryUntil(20*time.Second, func() bool {
					got := publish(fmt.Sprintf("%s-%d", when, i))
					i++
					if got != "OK" && !strings.HasSuffix(got, "=ENOSPC") {
						t.Fatalf("%s: publish = %s, want OK or ENOSPC", when, got)
					}
					return got == "OK"
				}) {
					t.Fatalf("%s: publishing has not resumed after %v", when, time.Since(start))
				}
				return time.Since(start)
			}

			// Acked messages wait in archive/, which must give way later.
			for i := 0; i < 40; i++ {
				if got := publish(fmt.Sprintf("old%02d", i)); got != "OK" {
					t.Fatalf("publish old%02d: %s", i, got)
				}
			}
			drain("archive")
			if n := stat(t, q, "archived"); n != 40 {
				t.Fatalf("archived = %v, want 40", n)
			}

			// 1. Fill until refused.
			refusal := ""
			for i := 0; i < 4000 && refusal == ""; i++ {
				if got := publish(fmt.Sprintf("m%04d", i)); got != "OK" {
					refusal = got
				}
			}
			disk := daemonDisk(t, d)
			t.Logf("%s: %d messages of 4 KiB published on an 8 MiB tmpfs, then %s; .stats disk %+v", backend, len(want), refusal, disk)
			if !strings.HasSuffix(refusal, "=ENOSPC") {
				t.Fatalf("publish on a full disk: %q, want ENOSPC", refusal)
			}
			if len(want) < 300 {
				t.Errorf("only %d messages fit before the floor", len(want))
			}
			if !disk.Low || disk.PublishesRefusedTotal == 0 || disk.MinFreeBytes != 2<<20 || disk.TotalBytes != 8<<20 {
				t.Errorf(".stats disk = %+v, want low, publishes refused, a floor of 2 MiB on 8 MiB", disk)
			}
			if m := readFile(t, d.Path(".metrics")); !strings.Contains(m, "\nyirangmq_disk_low 1\n") || !strings.Contains(m, "\nyirangmq_disk_min_free_bytes 2097152\n") {
				t.Errorf(".metrics while low:\n%s", m)
			}
			if st := testenv.MustSh(t, d.Mountpoint, testenv.Binary(t)+" status --mount ."); !strings.Contains(st, "LOW") {
				t.Errorf("status while low:\n%s", st)
			}
			// Refused again while low. The daemon also reclaims space at
			// once (the fs store checkpoints its journal, which holds every
			// body since the last checkpoint), and may be above the floor
			// again by now: then a publish is rightly accepted.
			for i := 0; i < 3; i++ {
				got := publish(fmt.Sprintf("again%d", i))
				if strings.HasSuffix(got, "=ENOSPC") {
					continue
				}
				if disk := daemonDisk(t, d); disk.Low || disk.FreeBytes < disk.MinFreeBytes {
					t.Errorf("publish again while low: %s, want ENOSPC (.stats disk %+v)", got, disk)
				} else {
					t.Logf("publish again: %s, the daemon reclaimed space and is above the floor (%d bytes free)", got, disk.FreeBytes)
					break
				}
			}
			check("full")

			// 2. Drain every message, zero errors; the archive gives way
			// if the disk is still low when the drain begins. (The fs
			// store's checkpoint after the refusal can free more than the
			// floor: then nothing needs trimming, and nothing is.)
			lowAtDrain := daemonDisk(t, d).Low
			drain("drain")
			if disk := daemonDisk(t, d); lowAtDrain && disk.ArchiveTrimmedTotal == 0 {
				t.Errorf("after the drain: archive_trimmed_total = 0, want the archive trimmed (%+v)", disk)
			} else if !lowAtDrain {
				t.Logf("the disk was above the floor when the drain began: archive_trimmed_total %d", disk.ArchiveTrimmedTotal)
			}

			// 3. Publishing resumes without a restart.
			took := resume("resume")
			t.Logf("%s: publishing resumed %v after the drain", backend, took)
			for i := 0; i < 20; i++ {
				if got := publish(fmt.Sprintf("n%02d", i)); got != "OK" {
					t.Fatalf("publish after the drain: %s", got)
				}
			}
			check("resumed")

			// 4. The disk filled from outside the mount, then freed.
			// The free-space tick runs every 200 ms while commits come and
			// stops after a tick that saw none. Fill only once it has
			// stopped: a tick that sees the disk go under half the floor
			// while FillDisk still writes gives the reserve back, and
			// FillDisk takes it too (a writer outside the store that keeps
			// writing defeats any reserve: docs/reliability.md), so the
			// drain below would find no room at all.
			time.Sleep(600 * time.Millisecond)
			lowEvents := daemonDisk(t, d).LowEventsTotal
			filler := filepath.Join(small, "filler")
			testenv.FillDisk(t, filler)
			// The daemon measures at least every 200 ms, and a read of
			// .stats measures for itself when the last measure is over
			// 100 ms old: past this sleep every reading is of the full
			// disk. Low may not last until we look: the daemon trims the
			// archive as soon as it is low, which can bring it back above
			// the floor, so a new low event counts as seen. Nor need it
			// go low at all: what free pages the database holds counts
			// as room (and the reserve, which is the store's), so the
			// daemon may rightly be above the floor on a full disk, as
			// long as the room it counts beyond the file system's free
			// space is its own.
			time.Sleep(300 * time.Millisecond)
			var outsideFill string
			if !testenv.RetryUntil(5*time.Second, func() bool {
				disk, raw := daemonDisk(t, d), freeBytes(t, small)
				switch {
				case disk.Low || disk.LowEventsTotal > lowEvents:
					outsideFill = "low"
				case disk.FreeBytes >= disk.MinFreeBytes && disk.FreeBytes > raw+disk.ReserveBytes:
					outsideFill = fmt.Sprintf("above the floor with %d bytes of its own room (the file system has %d free, the reserve %d)",
						disk.FreeBytes-raw-disk.ReserveBytes, raw, disk.ReserveBytes)
				default:
					return false
				}
				return true
			}) {
				t.Fatalf("the disk filled from outside: .stats disk %+v with %d bytes free in the file system, want low (or a low event after %d)", daemonDisk(t, d), freeBytes(t, small), lowEvents)
			}
			t.Logf("%s: the disk filled from outside: %s", backend, outsideFill)
			// Refused; or admitted because the store had given space back
			// meanwhile (a WAL truncated, free pages inside the database
			// count as room), which the daemon's next measure must show.
			switch got := publish("outside-full"); {
			case strings.HasSuffix(got, "=ENOSPC"):
			case got == "OK":
				if !testenv.RetryUntil(time.Second, func() bool { return !daemonDisk(t, d).Low }) {
					t.Errorf("publish with the disk filled from outside: OK while .stats disk says low (%+v), want ENOSPC", daemonDisk(t, d))
				}
				t.Logf("%s: a publish fitted into space the store gave back after the outside fill", backend)
			default:
				t.Errorf("publish with the disk filled from outside: %s, want ENOSPC", got)
			}
			check("filled from outside")
			drain("drain after outside fill")
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			took = resume("outside")
			t.Logf("%s: publishing resumed %v after the outside file was removed", backend, took)
			for i := 0; i < 5; i++ {
				if got := publish(fmt.Sprintf("z%02d", i)); got != "OK" {
					t.Fatalf("publish after the outside file was removed: %s", got)
				}
			}
			check("space back")

			// Nothing committed is lost across a restart.
			if err := d.Stop(); err != nil {
				t.Fatal(err)
			}
			d.Restart(t)
			check("after a restart")

			// The log stayed small: refusals are rate-limited.
			var size int64
			for _, p := range []string{logFile, logFile + ".1"} {
				if fi, err := os.Stat(p); err == nil {
					size += fi.Size()
				}
			}
			b, _ := os.ReadFile(logFile)
			refused := strings.Count(string(b), "create refused")
			t.Logf("%s: log %d bytes, %d lines of create refused", backend, size, refused)
			if size > 128<<10 || refused > 30 {
				t.Errorf("log: %d bytes with %d lines of create refused, want at most 128 KiB and 30", size, refused)
			}
		})
	}
}

// freeBytes is what statfs(2) says is free under dir, to anyone.
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

func keysOf(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
