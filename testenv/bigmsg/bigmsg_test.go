// Package bigmsg measures 1 MiB messages through the mount against a
// plain go-fuse loopback mount of a directory (bench/loopbackd)
// for the same files, alternating in one run: publish (create, write,
// close of a 1 MiB file in inbox/) and read (open, read to the end,
// close), with several clients at once. Every byte read back is checked.
//
// By default it runs a short round (a few messages per store) as a test
// of the data path; the measurement of docs/performance-history.md is
//
//	go test -count=1 -run TestBigMessages -v ./testenv/bigmsg -args -n 64 -rounds 3
package bigmsg

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
)

var (
	flagN       = flag.Int("n", 8, "messages per phase")
	flagRounds  = flag.Int("rounds", 1, "rounds per store, mount and loopback alternating")
	flagClients = flag.Int("clients", 4, "writers and readers at once")
	flagSize    = flag.Int("size", 1<<20, "message size in bytes")
	flagStores  = flag.String("stores", "sqlite,fs", "stores to run, comma-separated")
	flagSync    = flag.String("sync", "full", "--sync of the daemon")
	flagProfile = flag.String("cpuprofile", "", "write the daemon's CPU profile to this file (STORE appended)")
	flagWarm    = flag.Bool("warm", false, "read without dropping the file's page cache first")
)

// target is one mount to measure: inbox is where files are published.
type target struct {
	name  string
	inbox string
	clear func(t *testing.T) // removes what a round published
	// disk: a plain directory, not a mount: each file is fdatasynced
	// before its close (what --sync full promises at close(2)), and read
	// from the page cache (as the loopback's passthrough reads are).
	disk bool
}

type result struct{ publish, read []float64 } // MB/s per round

func TestBigMessages(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts)")
	}
	lb := startLoopback(t)
	for _, store := range strings.Split(*flagStores, ",") {
		t.Run(store, func(t *testing.T) {
			var args []string
			if *flagProfile != "" {
				args = []string{"--cpuprofile", *flagProfile + "." + store}
			}
			d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: store, Sync: *flagSync, Args: args})
			if err := os.Mkdir(d.Path("big"), 0o755); err != nil {
				t.Fatal(err)
			}
			policy := fmt.Sprintf(`{"maxMessageBytes": %d}`, max(*flagSize, 262144))
			if err := os.WriteFile(d.Path("big", ".policy"), []byte(policy), 0o644); err != nil {
				t.Fatal(err)
			}
			mount := target{name: store, inbox: d.Path("big", "inbox"), clear: func(t *testing.T) { removeAll(t, d.Path("big", "inbox")) }}
			loop := target{name: "loopback", inbox: filepath.Join(lb, "inbox"), clear: func(t *testing.T) { removeAll(t, filepath.Join(lb, "inbox")) }}
			if err := os.MkdirAll(loop.inbox, 0o755); err != nil {
				t.Fatal(err)
			}
			plain := filepath.Join(filepath.Dir(d.Store), "plain")
			disk := target{name: "disk", inbox: plain, disk: true, clear: func(t *testing.T) { removeAll(t, plain) }}
			if err := os.MkdirAll(plain, 0o755); err != nil {
				t.Fatal(err)
			}
			res := map[string]*result{mount.name: {}, loop.name: {}, disk.name: {}}
			for r := 0; r < *flagRounds; r++ {
				// Alternate which goes first: the machine drifts.
				order := []target{loop, mount, disk}
				if r%2 == 1 {
					order = []target{disk, mount, loop}
				}
				for _, tg := range order {
					pub, rd := runRound(t, tg, r)
					res[tg.name].publish = append(res[tg.name].publish, pub)
					res[tg.name].read = append(res[tg.name].read, rd)
					tg.clear(t)
				}
			}
			m, l, k := res[mount.name], res[loop.name], res[disk.name]
			t.Logf("%d x %d B, %d clients, %d rounds, --sync %s, warm=%v (MB/s, median of rounds)",
				*flagN, *flagSize, *flagClients, *flagRounds, *flagSync, *flagWarm)
			t.Logf("%-8s publish: mount %7.1f loopback %7.1f ratio %.2f   rounds %v / %v",
				store, median(m.publish), median(l.publish), median(m.publish)/median(l.publish), fmtAll(m.publish), fmtAll(l.publish))
			t.Logf("%-8s read:    mount %7.1f loopback %7.1f ratio %.2f   rounds %v / %v",
				store, median(m.read), median(l.read), median(m.read)/median(l.read), fmtAll(m.read), fmtAll(l.read))
			t.Logf("%-8s plain directory of the store's disk, write+fdatasync: publish %7.1f (mount ÷ it %.2f), read %7.1f   rounds %v / %v",
				store, median(k.publish), median(m.publish)/median(k.publish), median(k.read), fmtAll(k.publish), fmtAll(k.read))
		})
	}
}

// runRound publishes N files into tg with the clients, then reads them all
// back, and returns both bandwidths in MB/s.
func runRound(t *testing.T, tg target, round int) (pubMBs, readMBs float64) {
	t.Helper()
	n, size := *flagN, *flagSize
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("m-%d-%04d", round, i)
	}
	bufs := make([][]byte, *flagClients)
	for c := range bufs {
		bufs[c] = make([]byte, size)
	}
	start := time.Now()
	parallel(t, n, func(c, i int) error {
		b := bufs[c]
		fill(b, round, i)
		f, err := os.OpenFile(filepath.Join(tg.inbox, names[i]), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		if _, err := f.Write(b); err != nil {
			f.Close()
			return err
		}
		if tg.disk {
			if err := unix.Fdatasync(int(f.Fd())); err != nil {
				f.Close()
				return err
			}
		}
		return f.Close()
	})
	pub := time.Since(start)
	want := make([][]byte, *flagClients)
	for c := range bufs {
		want[c] = make([]byte, size)
	}
	start = time.Now()
	parallel(t, n, func(c, i int) error {
		path := filepath.Join(tg.inbox, names[i])
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if !*flagWarm && !tg.disk {
			// The file's pages, left by its writer, would answer the read
			// without the daemon: drop them (FUSE invalidates its cache).
			if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
				return err
			}
		}
		b := bufs[c]
		got := 0
		for got < len(b) {
			k, err := f.Read(b[got:])
			if k == 0 || err != nil {
				return fmt.Errorf("%s: read %d of %d bytes: %v", path, got, len(b), err)
			}
			got += k
		}
		if k, _ := f.Read(make([]byte, 1)); k != 0 {
			return fmt.Errorf("%s: longer than %d bytes", path, len(b))
		}
		fill(want[c], round, i)
		if !bytes.Equal(b, want[c]) {
			return fmt.Errorf("%s: the bytes read differ from the bytes written", path)
		}
		return nil
	})
	rd := time.Since(start)
	mb := float64(n) * float64(size) / 1e6
	return mb / pub.Seconds(), mb / rd.Seconds()
}

// parallel runs do for 0..n-1 on the clients, client c taking every
// clients-th index from c.
func parallel(t *testing.T, n int, do func(c, i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, *flagClients)
	for c := 0; c < *flagClients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < n; i += *flagClients {
				if err := do(c, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// fill writes the bytes of message i of a round into b: distinct per
// message and per 8-byte word, so a block of the wrong message or at the
// wrong offset shows.
func fill(b []byte, round, i int) {
	seed := uint64(round)<<32 | uint64(i)<<16
	for off := 0; off+8 <= len(b); off += 8 {
		binary.LittleEndian.PutUint64(b[off:], seed^uint64(off)*0x9e3779b97f4a7c15)
	}
	for off := len(b) &^ 7; off < len(b); off++ {
		b[off] = byte(i)
	}
}

func removeAll(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

// startLoopback builds and mounts the bench's go-fuse loopback of a new
// directory and returns its mountpoint; it is unmounted when the test ends.
func startLoopback(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	dir := t.TempDir()
	bin := filepath.Join(dir, "loopbackd")
	// The benchmark tooling is a module of its own: build inside it.
	build := exec.Command("go", "build", "-o", bin, "./loopbackd")
	build.Dir = filepath.Join(root, "bench")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build loopbackd: %v\n%s", err, out)
	}
	mnt, backing := filepath.Join(dir, "mnt"), filepath.Join(dir, "backing")
	for _, p := range []string{mnt, backing} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var log testenv.SyncBuffer
	cmd := exec.Command(bin, backing, mnt)
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	exited, ready, err := testenv.StartReady(cmd, 20*time.Second)
	if err != nil {
		t.Fatalf("start loopback: %v", err)
	}
	t.Cleanup(func() {
		if err := testenv.StopDaemon(cmd, exited, mnt); err != nil {
			t.Errorf("stop loopback: %v\n%s", err, log.String())
		}
	})
	if !ready {
		t.Fatalf("loopback not ready:\n%s", log.String())
	}
	return mnt
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func fmtAll(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
