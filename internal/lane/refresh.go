package lane

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/resilix/resilix/policy"
)

// firstRetry is the wait after a failed or empty Endpoints answer,
// doubled after each one up to Refresh.
const firstRetry = time.Second

// StartRefresh reports whether Endpoints should be asked again at now: its
// last good answer is older than Refresh, or the last answer failed and its
// wait is over. When it returns true, a refresh is begun, no other is until
// it ends, and the caller must end it with Update. A Set without Endpoints
// never refreshes. When nothing is due it is one atomic load.
func (s *Set[P]) StartRefresh(now time.Time) bool {
	t := s.nanos(now)
	if t < s.refreshAt.Load() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t < s.refreshAt.Load() {
		return false
	}
	s.refreshAt.Store(math.MaxInt64)
	s.askedT = t
	return true
}

// Update ends the refresh StartRefresh began with Endpoints' answer at now.
// A good answer (no error, at least one address) becomes the set: a lane
// whose address is still in it keeps its slot, its estimate and its
// health; a new address gets a lane of its own, nothing known of it (one
// probe at a time until it answers, then a slow start); a lane whose
// address left (and, after the first good answer, the lane that dialed
// the request's own address) is draining. MaxEjected holds on the new
// set: when more of its lanes are ejected than it allows, those ejected
// the longest ago return first, as new lanes. The
// next refresh is due Refresh later. A failed or empty answer changes
// nothing, and the next refresh is due after a wait that starts at 1 s and
// doubles with each failure in a row, up to Refresh.
//
// Addresses are used as given, duplicates and empty ones dropped, the first
// policy.MaxLanes in the answer's order kept and the rest counted (Counts'
// ignored). Update returns what the answer changed (see Change).
func (s *Set[P]) Update(now time.Time, addrs []string, err error) (c Change[P]) {
	t := s.nanos(now)
	var uniq []string
	if err == nil {
		seen := make(map[string]bool, len(addrs))
		for _, a := range addrs {
			if a != "" && !seen[a] {
				seen[a] = true
				uniq = append(uniq, a)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(uniq) == 0 {
		s.refreshAt.Store(t + int64(s.backoff))
		s.backoff = min(2*s.backoff, max(s.refresh, firstRetry))
		return c
	}
	s.backoff = firstRetry
	s.refreshAt.Store(t + int64(s.refresh))
	s.ignored = max(len(uniq)-policy.MaxLanes, 0)
	uniq = uniq[:min(len(uniq), policy.MaxLanes)]

	old := s.view.Load()
	nv := new(view[P])
	var ejected []*Lane[P]
	for i := range bitsOf(old.mask) {
		l := old.lanes[i]
		if slices.Contains(uniq, l.Addr) { // never the first lane, dialing the request's own address ("")
			nv.lanes[l.Index] = l
			nv.mask |= 1 << l.Index
			if l.ejectedAt(t) {
				ejected = append(ejected, l)
			}
			continue
		}
		l.draining = true
		if l.Addr != "" {
			c.Removed = append(c.Removed, l.Addr)
		}
		if l.outstanding.Load() == 0 {
			c.Drained = append(c.Drained, l)
		} else {
			s.draining = append(s.draining, l)
		}
	}
	for _, a := range uniq {
		if slices.ContainsFunc(nv.lanes[:], func(l *Lane[P]) bool { return l != nil && l.Addr == a }) { // kept
			continue
		}
		i := bits.TrailingZeros64(^nv.mask)
		l := s.newLane(a, i, 0)
		l.stamp.Store(t)
		c.Added = append(c.Added, a)
		nv.lanes[i] = l
		nv.mask |= 1 << i
	}
	nv.n = bits.OnesCount64(nv.mask)
	if over := len(ejected) - s.maxEject(nv.n); over > 0 {
		// The longest ejected first: by when its ejection began.
		slices.SortFunc(ejected, func(a, b *Lane[P]) int {
			return cmp.Compare(a.until.Load()-int64(a.last.For), b.until.Load()-int64(b.last.For))
		})
		for _, l := range ejected[:over] {
			l.until.Store(t) // reblockLocked returns it
		}
	}
	s.view.Store(nv)
	s.reblockLocked(t)
	c.Lanes = nv.n
	return c
}

// Change is what an answer of Endpoints changed in a Set, as Update
// returns it.
type Change[P any] struct {
	// Added is the addresses that got a lane, in the answer's order;
	// Removed those whose lane is draining, in the lanes' order (the
	// lane that dialed the request's own address left out). At most
	// policy.MaxLanes each.
	Added, Removed []string
	// Lanes is how many lanes the set has after a good answer, 0 after
	// a failed or empty one, which changes nothing.
	Lanes int
	// Drained is the draining lanes that have no attempt in flight:
	// their pools' idle connections should be closed now; the others'
	// are reported by the Done of their last attempt.
	Drained []*Lane[P]
}
