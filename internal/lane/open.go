package lane

import (
	"math"
	"time"
)

// OpenIn reports how long after now a lane will be open for a call that
// has sent on the lanes of used (bit Index): a lane it has not used and
// that is not blocked (ejected, held back by a Retry-After, or down), the
// lane Take would pick for its next attempt. It is zero when one is open
// at now, and ok is false when the call has used every lane. It reads,
// and changes nothing; it never allocates.
func (s *Set[P]) OpenIn(now time.Time, used uint64) (wait time.Duration, ok bool) {
	t := s.nanos(now)
	v := s.view.Load()
	first := int64(math.MaxInt64)
	for i := range bitsOf(v.mask &^ used) {
		first = min(first, v.lanes[i].until.Load())
	}
	if first == math.MaxInt64 {
		return 0, false
	}
	return time.Duration(max(first-t, 0)), true
}
