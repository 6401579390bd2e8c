package gate

import (
	"container/heap"
	"context"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// fifoServer is a dependency of a fixed capacity with a queue of its own:
// workers that take work a call each, first come first served. Calls that
// find every worker busy wait in its FIFO, so a call's latency is the work
// of everything admitted before it, divided among the workers.
type fifoServer struct {
	work time.Duration
	free []time.Time // when each worker is next free
}

// admit starts a call at now and returns when it ends.
func (s *fifoServer) admit(now time.Time) time.Time {
	w := 0
	for i := range s.free {
		if s.free[i].Before(s.free[w]) {
			w = i
		}
	}
	start := now
	if s.free[w].After(start) {
		start = s.free[w]
	}
	s.free[w] = start.Add(s.work)
	return s.free[w]
}

// simCall is a call admitted by the limiter, in the dependency.
type simCall struct {
	p          LimiterPermit
	start, end time.Time
}

// simCalls is a min-heap of calls by end.
type simCalls []simCall

func (h simCalls) Len() int           { return len(h) }
func (h simCalls) Less(i, j int) bool { return h[i].end.Before(h[j].end) }
func (h simCalls) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *simCalls) Push(x any)        { *h = append(*h, x.(simCall)) }
func (h *simCalls) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// floodSim drives l with an open-loop load in front of s: arrivals every
// gap from from to to, each admitted at once or refused (no wait in the
// limiter's queue). A call is released, with its latency, when s ends it.
type floodSim struct {
	l     *Limiter
	s     *fifoServer
	calls simCalls
	last  time.Duration // latency of the last call released
}

// run offers calls of prio every gap over [from, to), releasing what ends
// in between, and returns to.
func (f *floodSim) run(t *testing.T, from, to time.Time, gap time.Duration, prio shedding.Priority, each func(now time.Time)) time.Time {
	t.Helper()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for now := from; now.Before(to); now = now.Add(gap) {
		f.releaseUntil(now)
		if p, d := f.l.Acquire(done, now, prio, ""); d.OK {
			heap.Push(&f.calls, simCall{p: p, start: now, end: f.s.admit(now)})
		}
		if each != nil {
			each(now)
		}
	}
	f.releaseUntil(to)
	return to
}

func (f *floodSim) releaseUntil(now time.Time) {
	for len(f.calls) > 0 && !f.calls[0].end.After(now) {
		c := heap.Pop(&f.calls).(simCall)
		f.last = c.end.Sub(c.start)
		f.l.Release(c.p, c.end, f.last, policy.Success)
	}
}

// TestLimiterHoldsAFloodNearTheKnee: a dependency of 2 workers at 10 ms a
// call with a FIFO queue of its own (the examples/fleet back tier), calm at
// half its capacity for a second, then offered 12 times its capacity. The
// limiter is its only defence: what it admits beyond the 2 workers waits in
// the FIFO, and a call's latency is the work admitted before it. The first
// round of the flood straddles its onset, a ramp whose mean is below the
// latency the old limit leads to; judged against it, the first shrink
// seemed to raise the latency as it lowered the limit, its round became
// the baseline, and the limit grew to 30 with 150 ms latencies. The limit
// must instead come down near the knee, a few times the workers, within
// about a second (rounds of 20 calls take 100 ms at this capacity), and
// stay there.
func TestLimiterHoldsAFloodNearTheKnee(t *testing.T) {
	const workers, work = 2, 10 * time.Millisecond
	capacity := time.Duration(workers) * time.Second / work // calls a second
	l := newLimiter(policy.Limiter{}, lmStart)
	f := &floodSim{l: l, s: &fifoServer{work: work, free: make([]time.Time, workers)}}
	onset := f.run(t, lmStart, lmStart.Add(time.Second), time.Second/(capacity/2), shedding.Critical, nil)
	settle := onset.Add(time.Second)
	var (
		trace   []int
		settled time.Time // since when the limit has stayed within 4 × workers
		hi      int
		worst   time.Duration
	)
	f.run(t, onset, onset.Add(3*time.Second), time.Second/(12*capacity), shedding.Bulk, func(now time.Time) {
		n := l.Limit()
		if len(trace) == 0 || trace[len(trace)-1] != n {
			trace = append(trace, n)
		}
		if n > 4*workers {
			settled = time.Time{}
		} else if settled.IsZero() {
			settled = now
		}
		if now.After(settle) {
			hi, worst = max(hi, n), max(worst, f.last)
		}
	})
	t.Logf("limit %v, within %d from %v after the onset; after %v: limit <= %d, latency <= %v",
		trace, 4*workers, settled.Sub(onset), settle.Sub(onset), hi, worst)
	if hi > 4*workers {
		t.Errorf("limit up to %d %v into a flood on %d workers, want <= %d (limit %v)", hi, settle.Sub(onset), workers, 4*workers, trace)
	}
	if worst > 4*work {
		t.Errorf("latency up to %v %v into the flood, want <= %v", worst, settle.Sub(onset), 4*work)
	}
}
