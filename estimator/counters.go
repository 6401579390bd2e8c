package estimator

import (
	"sync/atomic"
	"time"
)

// Counters is a fixed set of counters summed over a sliding window: breaker
// outcomes, throttler requests and accepts, hedges started and won, the
// traffic mix per priority, tenant admissions.
//
// Like [LatencyWindow], it keeps four rings, one per slice of window/4, each
// stamped with the epoch it holds (see the package doc): no timer or
// goroutine ever runs, a writer clears a stale ring when it first writes to
// it in a new slice, and a reader counts only the rings of the last four
// epochs. A sum therefore covers between 3/4 of the window and all of it.
//
// Construct with [NewCounters], which is the only allocation; Add, Sum and
// Sums do not allocate. Most callers want [Counters.Add] as things happen
// and [Counters.Sums] to read them together. A nil *Counters counts nothing
// and sums to zero. All methods are safe for concurrent use. Counters are 64
// bits wide and wrap around on overflow. As with LatencyWindow, adds that
// race with the clearing of a ring at the start of a slice may be lost.
type Counters struct {
	clock  clock
	n      int
	stamps [rings]stamp
	counts []atomic.Uint64 // rings × n: slot i of ring r is counts[r*n+i]
}

// NewCounters returns n counters, all zero, summed over the given window
// whose first slice starts at now. A window of zero or less means 30s; an n
// below zero means none.
func NewCounters(window time.Duration, n int, now time.Time) *Counters {
	n = max(n, 0)
	return &Counters{
		clock:  newClock(window, now),
		n:      n,
		counts: make([]atomic.Uint64, rings*n),
	}
}

// Slice returns how wide the slices are that a window of the given length
// is kept in (a window of zero or less means 30s). A count dated up to a
// slice early lands in its own slice or the one before it, and leaves the
// sums at most a slice sooner.
func Slice(window time.Duration) time.Duration { return orDefaultWindow(window) / rings }

// Len returns the number of counters.
func (c *Counters) Len() int {
	if c == nil {
		return 0
	}
	return c.n
}

// Add adds delta to counter i at now. i must be in [0, Len()); Add panics
// otherwise.
func (c *Counters) Add(now time.Time, i int, delta uint64) {
	if c == nil {
		return
	}
	if uint(i) >= uint(c.n) {
		panic("estimator: Counters.Add: counter index out of range")
	}
	e := c.clock.epoch(now)
	r := int(e % rings)
	if c.stamps[r].v.Load() != e+1 {
		c.turn(r, e+1)
	}
	c.counts[r*c.n+i].Add(delta)
}

// turn claims ring r for the epoch want-1 and clears it, unless it is
// already claimed (see stamp.claim).
func (c *Counters) turn(r int, want uint64) {
	if !c.stamps[r].claim(want) {
		return
	}
	ring := c.counts[r*c.n : (r+1)*c.n]
	for i := range ring {
		ring[i].Store(0)
	}
	c.stamps[r].release(want)
}

// Sum returns counter i summed over the window at now. i must be in
// [0, Len()); Sum panics otherwise.
func (c *Counters) Sum(now time.Time, i int) uint64 {
	if c == nil {
		return 0
	}
	if uint(i) >= uint(c.n) {
		panic("estimator: Counters.Sum: counter index out of range")
	}
	e := c.clock.epoch(now)
	var sum uint64
	for k := uint64(0); k < rings && k <= e; k++ {
		want := e - k + 1
		r := int((e - k) % rings)
		if c.stamps[r].v.Load() != want {
			continue
		}
		v := c.counts[r*c.n+i].Load()
		if c.stamps[r].v.Load() != want {
			continue
		}
		sum += v
	}
	return sum
}

// Sums stores into dst[i] counter i summed over the window at now, for every
// i below both len(dst) and Len(). Counters read together come from the same
// rings, so a slice boundary never splits them.
func (c *Counters) Sums(now time.Time, dst []uint64) {
	if c == nil {
		clear(dst)
		return
	}
	m := min(len(dst), c.n)
	dst = dst[:m]
	e := c.clock.epoch(now)
	// A ring claimed for a newer epoch while it is being read has left the
	// window; start again without it. Stamps only grow, so a ring that
	// changed is skipped next time round and this ends within rings+1 passes.
	for again := true; again; {
		clear(dst)
		again = false
		var seen [rings]uint64
		for k := uint64(0); k < rings && k <= e; k++ {
			want := e - k + 1
			r := int((e - k) % rings)
			if c.stamps[r].v.Load() != want {
				continue
			}
			seen[r] = want
			ring := c.counts[r*c.n : r*c.n+m]
			for i := range ring {
				dst[i] += ring[i].Load()
			}
		}
		for r, want := range seen {
			if want != 0 && c.stamps[r].v.Load() != want {
				again = true
			}
		}
	}
}
