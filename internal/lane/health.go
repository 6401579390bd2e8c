package lane

import (
	"math"
	"slices"
	"time"

	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/policy"
)

// The health rules.
const (
	// downFor is how long a lane whose dial was refused or timed out
	// (nothing answers at its address), or that said nothing before an
	// attempt's timeout, is out: then the next pick may send it one
	// probe. Being out is not an ejection: it counts neither towards
	// ConsecutiveFailures nor against MaxEjected. A refused dial asks
	// Endpoints again, at most once per refreshGap.
	downFor    = time.Second
	refreshGap = time.Second
	// failingRun is the failures in a row that make a lane failing, so
	// that it explains its failures (see Report.Explained): one failure
	// is no pattern.
	failingRun = 2
	// retryAfterGrain is the unit Retry-After counts in: a hold may be
	// shorter than it says by up to one.
	retryAfterGrain = time.Second

	// A lane whose answers come slowRun in a row at least latencyFactor
	// times the lowest typical latency of the other lanes (those not
	// blocked and with an answer) is ejected for its latency; an address
	// lane is first taken out slowOuts times and probed after each,
	// and ejected only when such a run follows the last with no fast
	// answer between (see slowLocked). The picker
	// alone keeps a slow lane's share small only while a faster lane is
	// drawn beside it: with two slow lanes of four, one pick in six draws
	// both, with three one in two (behind an L4 balancer, where each
	// connection lane lands on a replica drawn at random, a client has
	// three of four on one replica about one time in twenty). The
	// lowest, not the median: the baseline is the lane a pick could
	// have had. latencyFactor is well above the spread of healthy
	// replicas, and slowRun answers in a row make one stall on one lane
	// no reason. A lane's typical latency is a plain moving average of its
	// answers with the time constant typical, not the picking estimate:
	// that is a peak, which one stall of a noisy host (tens of
	// milliseconds, on every lane at once) would hold near the stall for
	// tens of seconds, hiding a replica many times slower than the others.
	latencyFactor = 5.0
	slowRun       = 5
	typical       = time.Second

	// An answer whose time the key's stalls (see stalls) took more than
	// stalledShare of says nothing of its lane's latency: it neither
	// counts in a slow run nor ends one, and is no sample of the lane's
	// typical latency. With one attempt in flight at a time (a client
	// that sends its next call as its last ends), a slow replica's answer
	// is such a stretch, netted to nothing; as a typical latency of zero
	// it would make every other lane's answer latencyFactor times slower,
	// and eject the fast lanes.
	stalledShare = 0.5

	// slowOuts is how many slow runs with no fast answer between take an
	// address lane out before the next ejects it: the first for as long
	// as the run's last answer took, about as long as a replica's queue
	// takes to drain once the clients send elsewhere; the second for
	// downFor, so that a replica slow for a moment longer than its queue
	// (its workers cut for up to a second) is not ejected.
	slowOuts = 2

	// peakFactor: a sample slower than a lane's estimate replaces it at
	// once (the peak) only when another lane answered at least
	// peakFactor times faster over the same moments (see sampleLocked).
	peakFactor = 2.0

	// interval is the period over which failure rates are compared
	// (Envoy's outlier detection interval); minCalls is how many outcomes
	// a lane, and the other lanes together, need in it for its rate to
	// be judged (Envoy asks 100 for its success rate, the breaker's
	// MinCalls is 20).
	interval = 10 * time.Second
	minCalls = 20
)

// A lane's state is two named states that change apart: its health, what
// its outcomes have shown, and its block, what keeps it from being picked
// and until when (Lane.until; a block whose time is up ends at the next
// reblockLocked, the next pick's at the latest). They are two because a
// lane is in one of each at once: an ejected lane keeps what its outcomes
// showed for when it returns, and a lane blocked as down may answer a
// pick that had no other lane while its block lasts. Beside them, a lane is draining
// once its address left the set (Update), and for good.

// health is what a lane's outcomes have shown: the evidence that a
// failure is the lane's and not the key's (see Report.Explained).
//
//	from                         event                                to
//	any                          a Success                            answering
//	unknown, answering, failing  a Failure                            failing
//	out                          a Failure                            out
//	any                          taken out (outLocked): its dial      out
//	                             refused or timed out; mute until
//	                             its timeout, not held, not ejected;
//	                             a slow run of hedge losses with no
//	                             answer (silenceLocked); or, out with
//	                             no answer since, its probe lost to a
//	                             hedge in silence
type health uint8

const (
	unknown   health = iota // no outcome was evidence yet
	answering               // its last evidence was a Success
	failing                 // its last evidence was a Failure
	out                     // taken out for not answering, and no Success since; failing too
)

// fails reports whether h is evidence that the lane fails.
func (h health) fails() bool { return h == failing || h == out }

// block is what keeps a lane from being picked until Lane.until. An
// ejection outranks the others: a hold or a down on an ejected lane
// lengthens its block, and it stays ejected. A lane returned from an
// ejection and ejected again before any attempt of its ended is not
// reported back from the first: it went from one ejection to the next.
//
//	from                    event                                to
//	unblocked, held, down   ejected (ejectLocked)                ejected
//	unblocked, held, down   held by a Retry-After, ending later  held
//	unblocked, held, down   taken out (outLocked or              down
//	                        slowOutLocked), ending later
//	ejected                 held or taken out, ending later      ejected, until the later end
//	ejected                 its time up (reblockLocked)          unblocked, returned (reported by
//	                                                             the end of its next attempt), its
//	                                                             failures in a row and slow run
//	                                                             cleared, its latency unknown
//	held, down              its time up (reblockLocked)          unblocked
type block uint8

const (
	unblocked block = iota // not blocked
	held                   // held back by a Retry-After (holdLocked)
	down                   // out for not answering (outLocked)
	ejected                // ejected (ejectLocked)
)

// ejectedAt reports whether l is ejected at t. The Set's mu is held.
func (l *Lane[P]) ejectedAt(t int64) bool { return l.block == ejected && l.until.Load() > t }

// stateLocked returns l's state at t. A lane whose block is over is
// probing: it returns as a lane nothing is known of (an ejected one once
// the next pick unblocks it). The Set's mu is held.
func (l *Lane[P]) stateLocked(t int64) policy.LaneState {
	switch blocked := l.until.Load() > t; {
	case blocked && l.block == ejected:
		return policy.LaneEjected
	case blocked && l.block == down:
		return policy.LaneDown
	case blocked:
		return policy.LaneHeld
	case l.block == ejected, l.est.Load() == 0:
		return policy.LaneProbing
	}
	return policy.LaneOpen
}

// blockLocked blocks l as b until u, unless it is blocked until then
// already; an ejection stays one. It reports whether it did. The Set's
// mu is held.
func (l *Lane[P]) blockLocked(b block, u int64) bool {
	if u <= l.until.Load() {
		return false
	}
	l.until.Store(u)
	if l.block != ejected {
		l.block = b
	}
	return true
}

// reblockLocked recomputes the blocked slots at t: a lane whose time is up
// is unblocked, and an ejected one returns as a lane nothing is known of
// (one probe at a time until it answers), its failures in a row and its
// run of slow answers cleared: its estimate, a failure's, would keep it
// from being picked long after it served its time. s.mu is held.
func (s *Set[P]) reblockLocked(t int64) uint64 {
	v := s.view.Load()
	var b uint64
	next := int64(math.MaxInt64)
	for i := range bitsOf(v.mask) {
		l := v.lanes[i]
		u := l.until.Load()
		switch {
		case u > t:
			b |= 1 << l.Index
			next = min(next, u)
		case l.block == ejected:
			l.block, l.back, l.consecutive, l.slow, l.silentSlow = unblocked, true, 0, 0, 0
			l.forget(t)
		default:
			l.block = unblocked
		}
	}
	s.blockedUntil.Store(next)
	s.blocked.Store(b)
	return b
}

// slowLocked judges l's answer at t, which took x (ns) or, unless
// answered, at least x (a hedge leg cancelled as the loser), by the stall
// rule: n, its time net of the key's stalls (see stalls), is at least
// latencyFactor × the lowest typical latency of the other lanes not
// blocked and with an answer, and the other lanes answered latencyFactor
// times faster over the same moments (overtakenLocked). Such an answer
// counts in l's run of slow answers; if answered, one under that bound
// ends the run, and one over it that the other lanes do not confirm
// leaves the run as it is. A run of slowRun ejects l for its latency,
// reported in rep; on an address lane, only when slowOuts runs before it,
// with no fast answer since, took l out (slowOutLocked), and of answers
// to attempts sent after the last out ended. An address
// lane is its replica, which a slow run may be slow for its queue alone
// (its workers cut for a moment while every client sends to it): all the
// clients would eject it at once, for EjectFor, far longer than its queue
// lasts once they send elsewhere, and take so much of the fleet's
// capacity that the replicas left refuse the rest. Out for a moment, it
// is probed, and answers fast if it was its queue; a replica slow for
// itself is slow again. A connection lane's ejection places it anew, which is
// what a lane on a slow replica needs. An answer's net time is then
// averaged into l's typical latency. An answer the key's stalls took
// most of (see stalledShare) is none of this. s.mu is held.
func (s *Set[P]) slowLocked(l *Lane[P], t int64, x, n float64, answered bool, rep *Report[P]) {
	v := s.view.Load()
	least, all := math.Inf(1), math.Inf(1)
	for i := range bitsOf(v.mask) {
		o := v.lanes[i]
		if o.typT == 0 {
			continue
		}
		all = min(all, o.typ)
		if o != l && o.until.Load() <= t {
			least = min(least, o.typ)
		}
	}
	if n < stalledShare*x {
		return
	}
	switch {
	case n >= latencyFactor*least:
		// Sent before its out ended, an answer of a lane a slow run
		// took out was queued behind that run: no evidence of the
		// next.
		if s.overtakenLocked(l, t, x, n/latencyFactor) && !(l.slowOuts > 0 && t-int64(x) < l.outEnd) {
			l.slow++
		}
	case answered:
		l.slow, l.silentSlow, l.slowOuts = 0, 0, 0
	}
	if answered {
		w := 0.0
		if l.typT != 0 {
			w = math.Exp(-float64(t-l.typT) / float64(typical))
		}
		l.typ, l.typT = l.typ*w+n*(1-w), t
		all = min(all, l.typ)
	}
	if !math.IsInf(all, 1) {
		s.stalls.quiet = int64(quietFactor * all)
	}
	if l.slow < slowRun || l.draining || l.ejectedAt(t) {
		return
	}
	l.slow, l.silentSlow = 0, 0
	if s.refresh > 0 && l.slowOuts < slowOuts {
		s.slowOutLocked(l, t, x)
		return
	}
	if e, ok := s.ejectLocked(l, t, policy.EjectLatency); ok {
		rep.Ejected = append(rep.Ejected, e)
	}
}

// slowOutLocked takes address lane l out at t for a slow run whose last
// answer took x (ns), fewer than slowOuts runs having taken it out since
// its last fast answer (see slowLocked): for x, at most downFor, the
// first time, for downFor the next; then one probe at a time until it
// answers. A replica slow for its queue is slow by about the time its
// queue takes to drain once the clients send elsewhere, and every client
// sees that queue and takes it out at once: out longer, it is capacity
// lost to the fleet when the fleet may have none to spare. Its health
// stays what its answers showed. s.mu is held.
func (s *Set[P]) slowOutLocked(l *Lane[P], t int64, x float64) {
	d := int64(downFor)
	if l.slowOuts == 0 {
		d = min(int64(x), d)
	}
	l.slowOuts++
	l.outEnd = t + d
	l.forget(t)
	if l.blockLocked(down, l.outEnd) {
		s.reblockLocked(t)
	}
}

// silenceLocked learns from a hedge loss of l at t with no answer, x on
// the wire, n net of the key's stalls, when it is one of the slow run's:
// far slower than the other lanes' least typical latency and overtaken
// (see slowLocked). It is one more in the run, but no sample: it says
// only that the replica was slower than the winner, and as a peak it
// would leave the lane unpicked, and so unprobed, for as long as the
// peak takes to decay. A run made of such losses alone is a lane that
// answers nothing while the others answer (a frozen or hung replica):
// it is out, then probed one attempt at a time until it answers (see
// outLocked), rather than ejected for a latency nobody saw, for
// EjectFor and through its recovery; a connection lane is placed anew
// as well. A run with answers in it ejects as slowLocked does. It
// reports whether the loss was the run's; s.mu is held.
func (s *Set[P]) silenceLocked(l *Lane[P], t int64, x, n float64, rep *Report[P]) bool {
	if n < latencyFactor*s.leastTypicalLocked(l, t) || !s.overtakenLocked(l, t, x, n/latencyFactor) {
		return false
	}
	l.slow++
	l.silentSlow++
	if l.slow < slowRun || l.draining || l.ejectedAt(t) {
		return true
	}
	if l.silentSlow < l.slow {
		l.slow, l.silentSlow = 0, 0
		if e, ok := s.ejectLocked(l, t, policy.EjectLatency); ok {
			rep.Ejected = append(rep.Ejected, e)
		}
		return true
	}
	l.slow, l.silentSlow = 0, 0
	s.outLocked(l, t)
	if s.refresh == 0 {
		s.redialLocked(l, t)
	}
	return true
}

// sampleLocked folds an answer that came back at t into l's estimate:
// Finagle's peak EWMA over n, its time net of the key's stalls
// (see stalls), x as it was. The peak (a slower sample replacing the
// estimate at once) is taken only for the lane's first sample, or when
// the other lanes answered peakFactor times faster over the same moments
// (overtakenLocked); otherwise a slower sample is averaged in like a
// faster one. After a stall of the client's own process, the calls it
// held back go out at once and come back slowed in the order they were
// sent, none overtaking another: averaged in, they move no traffic,
// where a peak would keep a healthy lane from being picked for as long
// as the estimate takes to decay (tens of seconds). A lane slower than
// the others has them overtake it while it is awaited. s.mu is held, so
// that samples do not race.
func (s *Set[P]) sampleLocked(l *Lane[P], t int64, x, n float64) {
	e := math.Float64frombits(l.est.Load())
	if n > e && (e == 0 || s.overtakenLocked(l, t, x, n/peakFactor)) {
		e = n
	} else {
		w := decayed(t - l.stamp.Load())
		e = e*w + n*(1-w)
	}
	l.est.Store(math.Float64bits(e))
	l.stamp.Store(t)
}

// overtakenLocked reports whether the other lanes answered faster than
// l's answer that came back at t after x (ns), over the same moments:
// another lane's last success was sent after it (by at least half its own
// time), came back by t, and took (net of stalls) at most y; or whether no other lane had an attempt in
// flight at any moment of [t−x, t], so that there is nothing to compare
// it with, and it is judged as it stands. A lane slower than the others
// has them overtake it while it is awaited; a burst of calls queued in
// the client (after a stall) slows them in the order they were sent, and
// none overtakes another. s.mu is held.
func (s *Set[P]) overtakenLocked(l *Lane[P], t int64, x, y float64) bool {
	from := t - int64(x)
	v := s.view.Load()
	alone := true
	for i := range bitsOf(v.mask) {
		o := v.lanes[i]
		if o == l {
			continue
		}
		// Sent after it by at least half what it took itself: in a
		// burst sent within a millisecond (the calls a stall held
		// back), which comes back in no particular order, a quick
		// answer sent a moment later is no evidence.
		if o.lastS > max(from, 0) && o.lastX <= y && float64(o.lastS-from) >= o.lastX/2 {
			return true
		}
		alone = alone && o.outstanding.Load() == 0 && o.endT <= from
	}
	return alone
}

// leastTypicalLocked returns the lowest typical latency at t of the lanes
// other than l that are not blocked and have an answer, +Inf if none.
// s.mu is held.
func (s *Set[P]) leastTypicalLocked(l *Lane[P], t int64) float64 {
	v := s.view.Load()
	least := math.Inf(1)
	for i := range bitsOf(v.mask) {
		if o := v.lanes[i]; o != l && o.typT != 0 && o.until.Load() <= t {
			least = min(least, o.typ)
		}
	}
	return least
}

// slowestLocked returns the largest estimate at t of the lanes other than
// l. s.mu is held.
func (s *Set[P]) slowestLocked(l *Lane[P], t int64) float64 {
	v := s.view.Load()
	slowest := 0.0
	for i := range bitsOf(v.mask) {
		if o := v.lanes[i]; o != l {
			slowest = max(slowest, o.estimate(t))
		}
	}
	return slowest
}

// otherOpenLocked reports whether a lane other than l is in the set and
// not blocked at t, and, with ok, not known to be failing: its last
// outcome that was evidence succeeded, or it has had none yet. s.mu is
// held.
func (s *Set[P]) otherOpenLocked(l *Lane[P], t int64, ok bool) bool {
	v := s.view.Load()
	for i := range bitsOf(v.mask) {
		o := v.lanes[i]
		if o != l && o.until.Load() <= t && (!ok || !o.health.fails()) {
			return true
		}
	}
	return false
}

// ejectLocked ejects l at t for why, unless MaxEjected lanes are ejected
// already. s.mu is held.
func (s *Set[P]) ejectLocked(l *Lane[P], t int64, why policy.EjectionReason) (Ejection[P], bool) {
	v := s.view.Load()
	n := 0
	for i := range bitsOf(v.mask) {
		if v.lanes[i].ejectedAt(t) {
			n++
		}
	}
	if n >= s.maxEject(v.n) {
		return Ejection[P]{}, false
	}
	l.ejections++
	d := min(s.ejectFor*time.Duration(l.ejections), s.maxEjectFor)
	// A return not reported yet is dropped: reported now, it would be
	// this ejection's (l.last).
	l.block, l.last, l.back = ejected, Ejection[P]{Lane: l, Reason: why, For: d}, false
	l.until.Store(max(l.until.Load(), t+int64(d)))
	s.reblockLocked(t)
	return l.last, true
}

// maxEject returns how many of n lanes may be ejected at once.
func (s *Set[P]) maxEject(n int) int {
	if s.maxEjected < 0 || n < 2 {
		return 0
	}
	return min(max(int(s.maxEjected*float64(n)), 1), n-1)
}

// closeIntervalLocked ends the interval at t: it ejects the lanes whose
// failure rate is far above the others', the worst first, takes one off
// the ejection count of every lane for each whole interval it spent
// unblocked, and starts the next interval. s.mu is held.
func (s *Set[P]) closeIntervalLocked(t int64) []Ejection[P] {
	v := s.view.Load()
	start := s.intervalT
	s.intervalT = t
	var calls, failures int
	for i := range bitsOf(v.mask) {
		l := v.lanes[i]
		calls += l.calls
		failures += l.failures
	}
	var worst [policy.MaxLanes]*Lane[P]
	outliers := worst[:0]
	for i := range bitsOf(v.mask) {
		l := v.lanes[i]
		oc, of := calls-l.calls, failures-l.failures
		if l.calls >= minCalls && oc >= minCalls && !l.ejectedAt(t) {
			theirs := float64(of) / float64(oc)
			trip := gate.RelativeTrip(theirs) // the breaker's rule, the other lanes as the baseline
			if float64(l.failures)/float64(l.calls) >= trip {
				outliers = append(outliers, l)
			}
		}
	}
	slices.SortFunc(outliers, func(a, b *Lane[P]) int {
		// a.failures/a.calls > b.failures/b.calls, without division
		return b.failures*a.calls - a.failures*b.calls
	})
	var ejected []Ejection[P]
	for _, l := range outliers {
		e, ok := s.ejectLocked(l, t, policy.EjectRate)
		if !ok {
			break
		}
		ejected = append(ejected, e)
	}
	for i := range bitsOf(v.mask) {
		l := v.lanes[i]
		l.calls, l.failures = 0, 0
		// The intervals since the interval began, or since the lane's
		// last ejection ended if later.
		if free := t - max(start, l.until.Load()); free > 0 && !l.ejectedAt(t) {
			l.ejections = max(l.ejections-int(free/int64(interval)), 0)
		}
	}
	return ejected
}

// inFlightLocked reports whether any lane of the set has an attempt in
// flight. s.mu is held.
func (s *Set[P]) inFlightLocked() bool {
	v := s.view.Load()
	for i := range bitsOf(v.mask) {
		if v.lanes[i].outstanding.Load() > 0 {
			return true
		}
	}
	return false
}
