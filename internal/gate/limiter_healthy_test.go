package gate

import (
	"container/heap"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// busyClient is the loopback case of a healthy upstream in virtual time:
// the upstream answers at once, and what a call's latency holds is the
// client's own CPU, cores that take work a call each, first come first
// served (a fifoServer). Its latency never rises with anything but the
// calls in flight and the machine's other load: a neighbour that
// multiplies the work of a call by neighbourFactor for the first third of
// every neighbourPeriod, and a stall (a pause of the whole process) of
// stallLength every stallPeriod.
type busyClient struct {
	cpu  fifoServer
	work time.Duration // a call's CPU
	// spin is the CPU a refused caller that calls again at once burns
	// before its next call; zero: it waits pauseAfterRefusal instead.
	spin time.Duration
}

const (
	neighbourPeriod   = 300 * time.Millisecond
	neighbourFactor   = 3
	stallPeriod       = 47 * time.Millisecond
	stallLength       = 3 * time.Millisecond
	pauseAfterRefusal = time.Millisecond
)

// admit starts work on the client's cores at now and returns when it
// ends: later while the neighbour is busy, and not before a stall that
// covers now has ended.
func (c *busyClient) admit(now time.Time, work time.Duration) time.Time {
	since := now.Sub(lmStart)
	if since%neighbourPeriod < neighbourPeriod/3 {
		work *= neighbourFactor
	}
	if into := since % stallPeriod; into < stallLength {
		resume := now.Add(stallLength - into)
		for i := range c.cpu.free {
			c.cpu.free[i] = later(c.cpu.free[i], resume)
		}
	}
	c.cpu.work = work
	return c.cpu.admit(now)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// healthyClosedLoop runs callers closed-loop callers through a default
// Limiter in front of c for d, and returns the calls answered and refused
// after warm, the lowest limit after warm, its mean over the arrivals
// after warm and the share of those arrivals that found the limit
// reached.
func healthyClosedLoop(c *busyClient, callers int, d, warm time.Duration) (ok, refused, lowest int, mean, atLimit float64) {
	l := newLimiter(policy.Limiter{}, lmStart)
	var events crowdEvents
	seq := 0
	schedule := func(e crowdEvent) {
		seq++
		e.seq = seq
		heap.Push(&events, e)
	}
	for range callers {
		schedule(crowdEvent{at: lmStart})
	}
	end, warmed := lmStart.Add(d), lmStart.Add(warm)
	arrivals, sum, reached := 0, 0, 0
	for len(events) > 0 && events[0].at.Before(end) {
		e := heap.Pop(&events).(crowdEvent)
		now := e.at
		if e.held {
			l.Release(e.p, now, now.Sub(e.start), policy.Success)
			if now.After(warmed) {
				ok++
			}
			schedule(crowdEvent{at: now})
			continue
		}
		if now.After(warmed) {
			n := l.Limit()
			if arrivals == 0 || n < lowest {
				lowest = n
			}
			arrivals++
			sum += n
			if l.InFlight() >= n {
				reached++
			}
		}
		p, dec := l.TryAcquire(now, shedding.Critical, "")
		if dec.OK {
			schedule(crowdEvent{at: c.admit(now, c.work), held: true, p: p, start: now})
			continue
		}
		if now.After(warmed) {
			refused++
		}
		if c.spin > 0 {
			schedule(crowdEvent{at: c.admit(now, c.spin)})
		} else {
			schedule(crowdEvent{at: now.Add(pauseAfterRefusal)})
		}
	}
	return ok, refused, lowest, float64(sum) / float64(max(arrivals, 1)), float64(reached) / float64(max(arrivals, 1))
}

// TestLimiterKeepsAHealthyClosedLoop: 16 closed-loop callers of an
// upstream that answers at once, through a client of 2 cores at 30 µs of
// CPU a call, whose latency rises only with its own calls in flight, a
// neighbour's spells and stalls of the whole process. Nothing is
// overloaded: after the first 100 ms the limiter must refuse nothing and
// keep its limit above the 16 calls it is offered, whether a refused
// caller waits 1 ms or calls again at once.
func TestLimiterKeepsAHealthyClosedLoop(t *testing.T) {
	const callers = 16
	for _, tt := range []struct {
		name string
		spin time.Duration
	}{
		{"refused-waits-1ms", 0},
		{"refused-calls-again-at-once", 20 * time.Microsecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &busyClient{cpu: fifoServer{free: make([]time.Time, 2)}, work: 30 * time.Microsecond, spin: tt.spin}
			ok, refused, lowest, mean, atLimit := healthyClosedLoop(c, callers, 1500*time.Millisecond, 100*time.Millisecond)
			t.Logf("%d answered, %d refused; limit at least %d, mean %.1f; %.2f%% of arrivals found it reached", ok, refused, lowest, mean, 100*atLimit)
			if refused != 0 {
				t.Errorf("%d calls refused in front of a healthy upstream", refused)
			}
			if lowest <= callers {
				t.Errorf("limit down to %d with %d callers, want above %d", lowest, callers, callers)
			}
		})
	}
}
