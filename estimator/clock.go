package estimator

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// rings is the number of slices a window is split into.
const rings = 4

// defaultWindow is used when a window of zero (or less) is asked for.
const defaultWindow = 30 * time.Second

// clock turns an instant into an epoch: the number of whole slices since the
// origin. It divides by multiplying with a reciprocal computed once.
type clock struct {
	origin time.Time
	slice  uint64 // nanoseconds per epoch, at least 1
	inv    uint64 // floor(2^64 / slice), or MaxUint64 when slice is 1
}

// orDefaultWindow returns window, or defaultWindow when it is zero or less.
func orDefaultWindow(window time.Duration) time.Duration {
	if window <= 0 {
		return defaultWindow
	}
	return window
}

// newClock returns the clock of a window of the given length starting at
// origin. A window of zero or less means defaultWindow.
func newClock(window time.Duration, origin time.Time) clock {
	slice := uint64(orDefaultWindow(window) / rings)
	if slice == 0 {
		slice = 1
	}
	inv := uint64(math.MaxUint64)
	if slice > 1 {
		inv, _ = bits.Div64(1, 0, slice)
	}
	return clock{origin: origin, slice: slice, inv: inv}
}

// epoch returns floor((now - origin) / slice), or 0 for a now before the
// origin. now.Sub uses the monotonic clock when both instants carry it.
//
// The quotient comes from the high word of now·inv, which is the exact
// quotient or one less (inv is at most one below 2^64/slice and the
// dividend is below 2^63); one comparison on the remainder fixes it up.
func (c *clock) epoch(now time.Time) uint64 {
	d := now.Sub(c.origin)
	if d <= 0 {
		return 0
	}
	x := uint64(d)
	q, _ := bits.Mul64(x, c.inv)
	if x-q*c.slice >= c.slice {
		q++
	}
	return q
}

// busy marks a stamp whose ring is being cleared.
const busy = 1 << 63

// stamp says which epoch a ring holds: epoch+1, so the zero value (0) is a
// ring that never held anything. While its claimant clears the ring the
// stamp carries busy, and readers skip it.
type stamp struct {
	v atomic.Uint64
}

// claim is the slow path of a writer whose ring is not stamped want (an
// epoch+1). It reports whether the caller now owns the ring, in which case
// it must clear the counts and then call release(want). It never waits:
//
//   - if the ring is stamped want, or stamped with a later epoch (the
//     caller's now is behind other writers'), the caller just adds;
//   - if another writer is clearing it, the caller adds without waiting (the
//     add may be wiped by the clear: the turnover loss);
//   - if the ring was never stamped, it is empty, and one writer stamps it
//     want without clearing anything;
//   - otherwise exactly one writer wins the compare-and-swap to want|busy.
func (s *stamp) claim(want uint64) bool {
	for {
		v := s.v.Load()
		if v == want || v&busy != 0 || v > want {
			return false
		}
		if v == 0 {
			// Never stamped, so never written: nothing to clear.
			if s.v.CompareAndSwap(0, want) {
				return false
			}
			continue
		}
		if s.v.CompareAndSwap(v, want|busy) {
			return true
		}
	}
}

// release publishes a cleared ring as holding the epoch want-1. No one else
// writes a busy stamp, so a plain store is enough.
func (s *stamp) release(want uint64) {
	s.v.Store(want)
}
