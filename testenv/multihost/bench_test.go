package multihost

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"yirangmq/testenv"
	"yirangmq/testenv/pgtest"
)

// BenchmarkThroughMount compares the postgres store with the sqlite store
// through real mounts, with 256-byte messages: publish
// (create+write+close), and the round trip of a message published on one
// mount and leased (.next) and acked (unlink) on the other, with 1 and 4
// producers (and as many consumers). "postgres-2"
// is two daemons on one database, producers on the first and consumers on
// the second, as two hosts would; the others are one daemon.
//
//	go test -run '^$' -bench ThroughMount -benchtime 2000x ./testenv/multihost
func BenchmarkThroughMount(b *testing.B) {
	pg := pgtest.Start(b)
	for _, setup := range []string{"sqlite", "postgres", "postgres-2"} {
		b.Run(setup, func(b *testing.B) {
			for _, op := range []string{"publish-1", "publish-4", "roundtrip-1", "roundtrip-4"} {
				b.Run(op, func(b *testing.B) {
					kind, n, _ := strings.Cut(op, "-")
					clients, _ := strconv.Atoi(n)
					prod, cons := mountsFor(b, setup, pg)
					qname := "bench"
					if err := os.Mkdir(prod.Path(qname), 0o755); err != nil {
						b.Fatal(err)
					}
					policy := `{"visibilityTimeoutSec": 600}`
					if err := os.WriteFile(prod.Path(qname, ".policy"), []byte(policy), 0o644); err != nil {
						b.Fatal(err)
					}
					if !testenv.RetryUntil(10*time.Second, func() bool {
						p, err := os.ReadFile(cons.Path(qname, ".policy"))
						return err == nil && samePolicy(p, []byte(policy))
					}) {
						b.Fatal("the consumers' mount does not see the queue")
					}
					runBench(b, prod, cons, qname, clients, kind == "roundtrip")
				})
			}
		})
	}
}

func mountsFor(b *testing.B, setup string, pg *pgtest.Server) (prod, cons *testenv.Daemon) {
	b.Helper()
	switch setup {
	case "sqlite":
		d := testenv.StartDaemon(b, testenv.DaemonOptions{Backend: "sqlite", Sync: "full"})
		return d, d
	}
	url := pg.CreateDB(b, fmt.Sprintf("bench_%d", time.Now().UnixNano()))
	opts := testenv.DaemonOptions{Backend: "postgres", Store: url, Sync: "full"}
	prod = testenv.StartDaemon(b, opts)
	if setup == "postgres-2" {
		return prod, testenv.StartDaemon(b, opts)
	}
	return prod, prod
}

func runBench(b *testing.B, prod, cons *testenv.Daemon, q string, clients int, roundTrip bool) {
	body := make([]byte, 256)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		if failed.Add(1) == 1 {
			firstErr.Store(err)
		}
	}
	per := (b.N + clients - 1) / clients
	b.ResetTimer()
	start := time.Now()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				name := fmt.Sprintf("m%d-%d", c, i)
				if err := publishRaw(prod.Path(q, "inbox", name), body); err != nil {
					fail(err)
					return
				}
			}
		}()
		if roundTrip {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < per; i++ {
					name, err := next(cons, q, false)
					if err != nil {
						fail(err)
						return
					}
					if err := unix.Unlink(cons.Path(q, "processing", name)); err != nil {
						fail(fmt.Errorf("ack %s: %w", name, err))
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d clients failed; first: %v", n, firstErr.Load())
	}
	b.ReportMetric(float64(per*clients)/elapsed.Seconds(), "msgs/s")
}

// publishRaw is create+write+close with raw system calls, as a C program.
func publishRaw(path string, body []byte) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := unix.Write(fd, body); err != nil {
		unix.Close(fd)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}
