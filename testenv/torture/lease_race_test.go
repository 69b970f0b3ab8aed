package torture

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"yirangmq/testenv"
)

// TestRenameLeaseRace is the smallest reproduction of the rename anomaly
// the torture reports (doc.go), without any kill: consumers race for 600
// ready messages, half of them through .next, half through
// `mv inbox/NAME processing/`; a message may be leased once, as its lease
// lasts far longer than the test. It failed (a quarter of the messages
// leased twice) while every placement of a message was one kernel inode.
func TestRenameLeaseRace(t *testing.T) {
	for _, backend := range []string{"sqlite", "fs"} {
		t.Run(backend, func(t *testing.T) {
			d := testenv.StartDaemon(t, testenv.DaemonOptions{Backend: backend})
			qdir := d.Path("q")
			if err := os.Mkdir(qdir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := writePolicy(filepath.Join(qdir, ".policy"), `{"visibilityTimeoutSec": 600}`); err != nil {
				t.Fatal(err)
			}
			h, m := NewHistory(), newMountState()
			p := &client{name: "p", queue: qdir, h: h, m: m}
			rnd := rand.New(rand.NewPCG(1, 1))
			for i := 0; i < 600; i++ {
				name := fmt.Sprintf("x%04d", i)
				if e := p.publish(name, MakeBody(name, 10, rnd), 1, false, false); e.Outcome != OK {
					t.Fatal(e)
				}
			}
			var mu sync.Mutex
			leased := map[string][]Event{}
			var wg sync.WaitGroup
			for i := 0; i < 6; i++ {
				c := &client{name: fmt.Sprintf("c%d", i), queue: qdir, h: h, m: m}
				r := rand.New(rand.NewPCG(2, uint64(i)))
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						var e Event
						if i%2 == 0 {
							if e = c.leaseNext(true); e.Outcome == Failed {
								return // EAGAIN: nothing ready
							}
						} else {
							names, _ := c.inboxNames(4)
							if len(names) == 0 {
								return
							}
							e = c.leaseRename(names[r.IntN(len(names))])
						}
						if e.Outcome == OK {
							mu.Lock()
							leased[e.Name] = append(leased[e.Name], e)
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			twice := 0
			for _, name := range sortedKeys(leased) {
				if ls := leased[name]; len(ls) > 1 {
					if twice++; twice <= 3 {
						t.Errorf("%s leased %d times: %v", name, len(ls), ls)
					}
				}
			}
			if twice > 0 {
				stats, _ := readFile(filepath.Join(qdir, ".stats"))
				var s struct {
					Leased int `json:"leased_total"`
				}
				json.Unmarshal(stats, &s)
				n := 0
				for _, ls := range leased {
					n += len(ls)
				}
				t.Errorf("%d of %d messages leased more than once: %d leases seen by the clients, %d granted by the queue (.stats leased_total)",
					twice, len(leased), n, s.Leased)
			}
		})
	}
}

// TestNextThenReadAndAck: right after a .next read returned
// processing/NAME, the consumer can read and ack processing/NAME, even when
// the kernel had looked it up (and found it absent) just before. The
// torture saw consumers fail to read and ack the message .next had just
// leased to them (ENOENT from a cached negative entry), the lease then
// running out.
func TestNextThenReadAndAck(t *testing.T) {
	d := testenv.StartDaemon(t, testenv.DaemonOptions{})
	qdir := d.Path("q")
	if err := os.Mkdir(qdir, 0o755); err != nil {
		t.Fatal(err)
	}
	h, m := NewHistory(), newMountState()
	c := &client{name: "c", queue: qdir, h: h, m: m}
	rnd := rand.New(rand.NewPCG(1, 1))
	for _, name := range []string{"a", "b"} {
		if e := c.publish(name, MakeBody(name, 10, rnd), 1, false, false); e.Outcome != OK {
			t.Fatal(e)
		}
		// What a rename that lost the race to .next leaves behind.
		if _, err := os.Stat(filepath.Join(qdir, StateProcessing, name)); !os.IsNotExist(err) {
			t.Fatalf("processing/%s before its lease: %v", name, err)
		}
	}
	for _, name := range []string{"a", "b"} {
		l := c.leaseNext(true)
		if l.Outcome != OK || l.Name != name {
			t.Fatalf(".next: %v, want %s", l, name)
		}
		if r := c.read(l); r.Outcome != OK || r.BodyErr != "" {
			t.Errorf("read right after the lease: %v", r)
		}
		if a := c.ack(l); a.Outcome != OK {
			t.Errorf("ack right after the lease: %v", a)
		}
	}
}
