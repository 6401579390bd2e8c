package lane

import (
	"math/bits"
	"time"
)

// Open reports whether the set has a lane at now that a call which has
// sent on the lanes of used (bit Index) has not used, and that is not
// blocked (ejected, or held by a Retry-After): the lane Take would pick
// for that call's next attempt if one is left. It reads, and changes
// nothing; it never allocates.
func (s *Set[P]) Open(now time.Time, used uint64) bool {
	t := s.nanos(now)
	v := s.view.Load()
	for m := v.mask &^ used; m != 0; m &= m - 1 {
		if v.lanes[bits.TrailingZeros64(m)].until.Load() <= t {
			return true
		}
	}
	return false
}
