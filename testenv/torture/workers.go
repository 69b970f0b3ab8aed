package torture

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// produce publishes unique names until stop is closed.
func produce(c *client, rnd *rand.Rand, stop <-chan struct{}) {
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		if !c.m.waitUp() {
			return
		}
		name := fmt.Sprintf("m-%s-%06d", c.name, seq)
		size := 16 + rnd.IntN(2048)
		if rnd.IntN(20) == 0 {
			size = 16 + rnd.IntN(96<<10) // more than one FUSE write
		}
		body := MakeBody(name, size, rnd)
		e := c.publish(name, body, 1+rnd.IntN(3), rnd.IntN(10) == 0, rnd.IntN(10) == 0)
		c.h.Add(e)
		time.Sleep(time.Duration(rnd.IntN(3000)) * time.Microsecond)
	}
}

// consume leases, reads and acks (or nacks, or abandons) until the drain
// finds the queue empty or runs out of time.
func consume(c *client, rnd *rand.Rand, draining, drainOver *atomic.Bool) {
	for {
		if drainOver.Load() || !c.m.waitUp() {
			return
		}
		drain := draining.Load()
		var lease Event
		if !drain && rnd.IntN(7) == 0 {
			names, err := c.inboxNames(4)
			if err != nil || len(names) == 0 {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			lease = c.leaseRename(names[rnd.IntN(len(names))])
		} else {
			lease = c.leaseNext(drain)
		}
		lease.ID = c.h.Add(lease)
		if lease.Outcome != OK || lease.Name == "" {
			if drain && lease.Outcome == Failed {
				// Nothing ready: done once nothing can become ready.
				if n, err := c.liveCount(); err == nil && n == 0 {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			continue
		}
		c.h.Add(c.read(lease))
		time.Sleep(time.Duration(rnd.IntN(5000)) * time.Microsecond) // the work
		switch p := rnd.IntN(100); {
		case drain || p < 80:
			// An ack whose outcome is unknown is tried again once the
			// mount is back (the lease survives the restart); ENOENT
			// then means that the first one went through, or that the
			// lease ran out.
			for try := 0; try < 5; try++ {
				e := c.ack(lease)
				c.h.Add(e)
				if e.Outcome != Unknown || !c.m.waitUp() {
					break
				}
			}
		case p < 92:
			c.h.Add(c.nack(lease))
		default:
			now := c.h.Now()
			c.h.Add(Event{Kind: KindAbandon, Client: c.name, Name: lease.Name, Lease: lease.ID, Start: now, End: now, Outcome: OK})
		}
	}
}
