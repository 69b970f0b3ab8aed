package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Big messages: 1 MiB bodies, 4 clients (the most asked for), published
// and then read back, through the yirangmq mounts at the daemon's default
// options and through the go-fuse loopback, taking turns in a rotating
// order as the interleaved step does. The bytes are counted at the
// client: a publish is open(O_CREAT|O_EXCL), one write(2) of the whole
// body and close(2) (which returns once the message is committed); a
// read is open(2) of inbox/NAME (a peek: no lease), read(2) into a 1 MiB
// buffer until EOF, close(2), and the bytes must be the ones published.
// MiB/s is all clients' bytes over the phase's wall time.

const bigMsgSize = 1 << 20

// bigPolicy lets a queue take 1 MiB bodies (the default maxMessageBytes
// is 256 KiB).
const bigPolicy = `{"archive": {"enabled": false}, "visibilityTimeoutSec": 3600, "maxMessageBytes": 4194304}`

// bigRow is one system's bandwidth for one operation over all rounds.
type bigRow struct {
	System       string  `json:"system"`
	Op           string  `json:"op"` // publish or read
	Clients      int     `json:"clients"`
	Messages     int     `json:"messages"`
	MessageBytes int     `json:"message_bytes"`
	Seconds      float64 `json:"seconds"`
	MiBPerSec    float64 `json:"mib_per_sec"`
	P50MS        float64 `json:"p50_ms"`
	P99MS        float64 `json:"p99_ms"`
	// RoundMiBPerSec is each round's MiB/s (MiBPerSec is over all
	// rounds together).
	RoundMiBPerSec []float64 `json:"round_mib_per_sec,omitempty"`
}

func (s *suite) runBig(ctx context.Context) error {
	if s.cfg.bigMessages <= 0 {
		return nil
	}
	bin, err := buildLoopback(ctx, s.root, s.b.work)
	if err != nil {
		return err
	}
	c := slices.Max(s.cfg.clients)
	// The loopback (classic), then each transport's mounts.
	systems := []bigSystem{{name: sysLoopback}}
	for _, t := range s.transports {
		for _, store := range []string{"sqlite", "fs"} {
			systems = append(systems, bigSystem{name: sysMount(store, goalSync, t), spec: s.spec(store, goalSync, t)})
		}
	}
	type acc struct {
		ops    int
		wall   time.Duration
		lat    latencies
		rounds []float64 // MiB/s of each round
	}
	accs := map[string]*acc{}
	body := make([]byte, bigMsgSize)
	for i := range body {
		body[i] = byte('A' + (i*7+i/4096)%26)
	}
	for round := range s.cfg.rounds {
		for i := range systems {
			system := systems[(i+round)%len(systems)]
			inbox, stop, err := s.bigTarget(system, bin, round)
			if err != nil {
				return fmt.Errorf("%s: %w", system.name, err)
			}
			for _, op := range []string{"publish", "read"} {
				ph, err := runBigPhase(ctx, inbox, op, fmt.Sprintf("big-r%d", round), s.cfg.bigMessages, c, body)
				if err != nil {
					stop()
					return fmt.Errorf("%s %s: %w", system.name, op, err)
				}
				k := system.name + "\x00" + op
				if accs[k] == nil {
					accs[k] = &acc{}
				}
				a := accs[k]
				a.ops += len(ph.lat)
				a.wall += ph.wall
				a.lat = append(a.lat, ph.lat...)
				a.rounds = append(a.rounds, mibPerSec(len(ph.lat), ph.wall))
			}
			if err := stop(); err != nil {
				return fmt.Errorf("%s: %w", system.name, err)
			}
		}
	}
	for _, system := range systems {
		for _, op := range []string{"publish", "read"} {
			a := accs[system.name+"\x00"+op]
			sum := a.lat.summary()
			r := bigRow{System: system.name, Op: op, Clients: c, Messages: a.ops, MessageBytes: bigMsgSize, Seconds: round2(a.wall.Seconds()),
				P50MS: round2(sum.P50US / 1000), P99MS: round2(sum.P99US / 1000), MiBPerSec: mibPerSec(a.ops, a.wall), RoundMiBPerSec: a.rounds}
			s.res.Big = append(s.res.Big, r)
			s.logf("%-24s 1 MiB %-7s c=%d: %7.1f MiB/s p50 %.2f ms p99 %.2f ms; rounds %v", system.name, op, c, r.MiBPerSec, r.P50MS, r.P99MS, r.RoundMiBPerSec)
		}
	}
	s.note(fmt.Sprintf("1 MiB messages: %d clients, %d rounds of %d messages per system (the loopback and the mounts at --sync %s, taking turns, each round on a new directory or store and daemon); publish = open(O_CREAT|O_EXCL), one write(2) of 1 MiB, close(2); read = open(2) of inbox/NAME, read(2) to EOF into a 1 MiB buffer, close(2), bytes checked; MiB/s = the clients' bytes ÷ the phase's wall time (in the table: all rounds together; the read goal: the median of the rounds' ratios)", c, s.cfg.rounds, s.cfg.bigMessages, goalSync))
	return nil
}

// mibPerSec is n 1 MiB messages over wall.
func mibPerSec(n int, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return round1(float64(n) / wall.Seconds())
}

// bigSystem is a system of the 1 MiB step: the loopback (no spec) or a
// mount.
type bigSystem struct {
	name string
	spec mountSpec
}

// bigTarget mounts system for one round and returns the directory to
// publish into and how to stop it.
func (s *suite) bigTarget(system bigSystem, loopbackBin string, round int) (string, func() error, error) {
	label := fmt.Sprintf("big-r%d", round)
	if system.name == sysLoopback {
		dir, err := s.newWorkDir("loopback-" + label)
		if err != nil {
			return "", nil, err
		}
		d, err := startLoopback(loopbackBin, dir, s.cfg.cacheTimeout, false)
		if err != nil {
			return "", nil, err
		}
		s.b.atExit(func() { d.stop() })
		inbox := filepath.Join(d.mnt, "inbox")
		if err := unix.Mkdir(inbox, 0o755); err != nil {
			d.stop()
			return "", nil, err
		}
		return inbox, d.stop, nil
	}
	d, err := s.b.mount(system.spec, label)
	if err != nil {
		return "", nil, err
	}
	qdir := filepath.Join(d.mnt, "big")
	if err := unix.Mkdir(qdir, 0o755); err != nil {
		d.stop()
		return "", nil, err
	}
	if err := writeFile(filepath.Join(qdir, ".policy"), []byte(bigPolicy)); err != nil {
		d.stop()
		return "", nil, fmt.Errorf("policy: %w", err)
	}
	return filepath.Join(qdir, "inbox"), d.stop, nil
}

// runBigPhase publishes (or reads back) n big messages in inbox from
// clients goroutines, each with its own names, all released at once.
func runBigPhase(ctx context.Context, inbox, op, pass string, n, clients int, body []byte) (phaseResult, error) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	lats := make([]latencies, clients)
	errs := make([]error, clients)
	for c := range clients {
		count := n / clients
		if c < n%clients {
			count++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, len(body))
			<-start
			for i := range count {
				if ctx.Err() != nil {
					errs[c] = ctx.Err()
					return
				}
				path := filepath.Join(inbox, msgName(pass, c, i))
				t0 := time.Now()
				var err error
				if op == "publish" {
					err = publish(path, body, false, -1)
				} else {
					err = readBack(path, buf, body)
				}
				lats[c] = append(lats[c], time.Since(t0))
				if err != nil {
					errs[c] = fmt.Errorf("%s %s: %w", op, path, err)
					return
				}
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(t0)
	var all latencies
	for c := range clients {
		all = append(all, lats[c]...)
	}
	return phaseResult{wall: wall, lat: all}, errors.Join(errs...)
}

// readBack reads path to EOF into buf and checks it holds want.
func readBack(path string, buf, want []byte) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	got := 0
	for {
		if got == len(buf) {
			// One more read must say EOF.
			var one [1]byte
			k, err := unix.Read(fd, one[:])
			if err != nil {
				return err
			}
			if k != 0 {
				return fmt.Errorf("longer than the %d bytes published", len(want))
			}
			break
		}
		k, err := unix.Read(fd, buf[got:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if k == 0 {
			break
		}
		got += k
	}
	if !bytes.Equal(buf[:got], want) {
		return fmt.Errorf("read %d bytes, not the %d published", got, len(want))
	}
	return nil
}
