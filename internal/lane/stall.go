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

// stalls is the stall rule of a key: it remembers the recent stretches
// in which the key's own process may have stalled (gaps), and nets them
// out of the answers that straddle them. A stall of the client's own
// process (a GC pause, CPU throttling, a VM's steal time) makes every
// answer in flight through it slow, and ends no attempt while it lasts.
// Its zero value is ready; the Set's mu guards it.
type stalls struct {
	lastDone int64   // ns: the latest end of an attempt
	meanGap  float64 // ns: the mean time between ends (see meanWindow)
	// quiet is the least stretch, ns, that counts as a gap whatever the
	// mean: quietFactor × the lowest typical latency of the key's lanes,
	// set by the health rules.
	quiet int64
	gaps  [gapRing]gap
	next  int // the slot of the next gap (the oldest, once full)
}

// gap is a stretch of time in which no attempt of a key ended, ns.
type gap struct{ from, to int64 }

// ended notes that an attempt sent at sent ended at t. latest is the
// key's latest send (within sentGrain), and inFlight reports whether
// another attempt of the key is in flight; it is asked only when needed.
// A stretch of stallGaps × the mean time between ends or more (and quiet
// or more) is remembered as a gap when an attempt was in flight through
// it and either
//   - no attempt ended in it: it runs from the last end, and this
//     attempt was sent before that, or another is still in flight; or
//   - no attempt was sent or ended in it: it runs from the latest send,
//     this attempt's or a later one, and the key was busy before that
//     (the latest send came within such a stretch of the last end).
//
// The second is the stall that catches one attempt alone, sent a moment
// after the last end. A key that was idle had nothing in flight, and one
// that went quiet was not busy before its next send. An end at or before
// the last one changes nothing.
func (st *stalls) ended(t, sent, latest int64, inFlight func() bool) {
	if t <= st.lastDone {
		return
	}
	d := float64(t - st.lastDone)
	switch {
	case st.lastDone == 0:
	case st.meanGap == 0:
		st.meanGap = d
	default:
		long := max(float64(st.quiet), stallGaps*st.meanGap)
		switch {
		case d >= long && (sent <= st.lastDone || inFlight()):
			st.gap(st.lastDone, t)
		case latest > st.lastDone && latest <= t && float64(latest-st.lastDone) < long && float64(t-latest) >= long:
			st.gap(latest, t)
		}
		// A stall is kept out of the mean it is judged by.
		st.meanGap += (min(d, stallGaps*st.meanGap) - st.meanGap) / meanWindow
	}
	st.lastDone = t
}

// gap remembers [from, to] as a gap, in place of the oldest.
func (st *stalls) gap(from, to int64) {
	st.gaps[st.next] = gap{from, to}
	st.next = (st.next + 1) % gapRing
}

// net returns x, the time (ns) an answer that came back at t took, less
// the gaps within it: how long it would have taken had the client not
// stalled. When more gaps came since than it remembers, x as it is.
func (st *stalls) net(t int64, x float64) float64 {
	from := t - int64(x)
	if st.gaps[st.next].to > from {
		return x
	}
	n := x
	for _, g := range st.gaps {
		if g.to > from {
			n -= float64(max(min(g.to, t)-max(g.from, from), 0))
		}
	}
	return max(n, 0)
}
