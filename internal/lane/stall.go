package lane

// The stall rule.
const (
	// A gap is a stretch in which no attempt of the key ended for
	// stallGaps × the mean time between its ends or more (and
	// quietFactor × the lowest typical latency of its lanes or more)
	// while another attempt was in flight: with ends spread at random
	// (Poisson) at a steady rate, a stretch that long comes once in e^8,
	// about 3000; a stall of the client's own process ends none while it
	// lasts. quietFactor is half the latency rule's factor, so that a
	// stall that could make an answer look latencyFactor times slower is
	// caught.
	stallGaps   = 8.0
	quietFactor = latencyFactor / 2
	// meanWindow is the number of recent intervals between ends the mean
	// follows (an exponential moving average with weight 1/meanWindow).
	meanWindow = 16
	// gapRing is how many recent gaps a Set remembers, to take them out
	// of the answers that straddle them (see stalls.net).
	gapRing = 16
)

// gap is a stretch of time in which no attempt of a key ended, ns.
type gap struct{ from, to int64 }

// endedLocked notes that an attempt sent at sent ended at t. A stretch
// of stallGaps × the key's mean time between ends or more (and s.quiet
// or more) is remembered as a gap, the key's own process maybe stalled
// through it, when an attempt was in flight through it and either
//   - no attempt ended in it: it runs from the last end, and this
//     attempt was sent before that, or another is still in flight; or
//   - no attempt was sent or ended in it: it runs from the latest send,
//     this attempt's or a later one, and the key was busy before that
//     (the latest send came within such a stretch of the last end).
//
// The second is the stall that catches one attempt alone, sent a moment
// after the last end. A key that was idle had nothing in flight, and one
// that went quiet was not busy before its next send. s.mu is held.
func (s *Set[P]) endedLocked(t, sent int64) {
	if t <= s.lastDone {
		return
	}
	d := float64(t - s.lastDone)
	switch {
	case s.lastDone == 0:
	case s.meanGap == 0:
		s.meanGap = d
	default:
		long := max(float64(s.quiet), stallGaps*s.meanGap)
		switch ls := s.lastSent.Load(); {
		case d >= long && (sent <= s.lastDone || s.inFlightLocked()):
			s.gapLocked(s.lastDone, t)
		case ls > s.lastDone && ls <= t && float64(ls-s.lastDone) < long && float64(t-ls) >= long:
			s.gapLocked(ls, t)
		}
		// A stall is kept out of the mean it is judged by.
		s.meanGap += (min(d, stallGaps*s.meanGap) - s.meanGap) / meanWindow
	}
	s.lastDone = t
}

// gapLocked remembers [from, to] as a gap. s.mu is held.
func (s *Set[P]) gapLocked(from, to int64) {
	s.gaps[s.gapNext] = gap{from, to}
	s.gapNext = (s.gapNext + 1) % gapRing
}

// netLocked returns x, the time (ns) an answer that came back at t took,
// less the key's gaps within it (see endedLocked): how long it would have
// taken had the client not stalled. A stall of the client's own process
// (a GC pause, CPU throttling, a VM's steal time) makes every answer that
// straddles it slow, and ends no attempt while it lasts. When more gaps
// came since than the Set remembers, x as it is. s.mu is held.
func (s *Set[P]) netLocked(t int64, x float64) float64 {
	from := t - int64(x)
	if s.gaps[s.gapNext].to > from {
		return x
	}
	n := x
	for _, g := range s.gaps {
		if g.to > from {
			n -= float64(max(min(g.to, t)-max(g.from, from), 0))
		}
	}
	return max(n, 0)
}
