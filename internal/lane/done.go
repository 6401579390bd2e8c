package lane

import (
	"math"
	"slices"
	"time"

	"github.com/resilix/resilix/internal/timing"
	"github.com/resilix/resilix/policy"
)

// Answer is what an attempt's answer, or its error, told of its lane
// beyond its outcome.
type Answer struct {
	// Hold is the answer's Retry-After on a 503 or 429, zero otherwise.
	Hold time.Duration
	// Hint is how long the server means to hold back, when it said so
	// in a header of its own beside Retry-After; zero otherwise.
	Hint time.Duration
	// Kind is whether the lane's replica answered, and if not, how it
	// kept silent.
	Kind Kind
	// Late is, for a Mute attempt, how long after its timeout's deadline
	// the client ended it: zero when on time. A timeout late enough to be
	// the client's own stall (timing.Stalled) is no outcome of the lane.
	Late time.Duration
	// Load is the load report the answer carried, if Reported.
	Load     Load
	Reported bool
}

// Load is a server's load as it reported it on an answer (ORCA's
// endpoint-load-metrics: see package orca).
type Load struct {
	// Util is the load as a utilization: 1 at the server's limit, above
	// it as its queue fills.
	Util float64
	// Per is what one more request adds to Util: 1/limit when the server
	// said its limit, 0 when it did not.
	Per float64
	// Served is true when Util counts the request the answer is for
	// (admission counts it in flight as its answer's headers go out):
	// once answered it holds no slot, and picking reads Util − Per.
	Served bool
}

// Kind is how an attempt ended on its lane, as far as an answer goes.
type Kind uint8

const (
	// Answered: the replica answered (its headers came), or the attempt
	// ended in a way that says nothing of the replica's silence.
	Answered Kind = iota
	// Silent: the attempt ended with no answer from a replica that was
	// reached: a hedge leg cut short, a connection closed before the
	// headers.
	Silent
	// Mute: the attempt's own timeout ended it before any answer came:
	// the replica took it and said nothing (frozen, hung), unless the
	// client ended it late (see Answer.Late). A mute lane is silent too
	// (see Set.TakeOnce).
	Mute
	// Unreached: the attempt's dial was refused or timed out: nothing
	// answers at the lane's address.
	Unreached
)

// silent reports whether k leaves its lane silent (see Set.TakeOnce).
func (k Kind) silent() bool { return k == Silent || k == Mute }

// Report is what Done tells the caller.
type Report[P any] struct {
	// Explained is true when the attempt failed and its lane explains
	// the failure: the lane is ejected, or is failing (two failures in a
	// row, held by the answer's Retry-After, or its dial refused), and
	// another lane that is not blocked is not known to fail (its last
	// outcome succeeded, or it has had none yet). The key's breaker should
	// then learn nothing from it, unless the attempt was a half-open
	// breaker's probe: every lane failing, or the last lane open failing,
	// is the host failing, and reaches it.
	Explained bool
	// Held is true when the answer's Retry-After held its lane back, so
	// that the key need not be: another lane is left to pick. A lane that
	// left the set (see Set.Update) is never held.
	Held bool
	// Ejected lists the lanes ejected by this outcome (one, or at the end
	// of an interval several); their pools' idle connections should be
	// closed, so that a balancer places the lane anew.
	Ejected []Ejection[P]
	// Returned is the ejection the lane came back from, when this was
	// the first of its attempts to end since, whatever its outcome: its
	// Lane is nil otherwise. It comes before what the outcome taught,
	// which may eject the lane again (Ejected).
	Returned Ejection[P]
	// Drained is the lane, when it had left the set or is ejected and
	// this was its last attempt in flight: its pool's idle connections
	// should be closed (an ejected lane then comes back with none, so
	// that a balancer places its next connection anew). Nil otherwise.
	Drained *Lane[P]
}

// Done ends an attempt that Take counted on lane l, at now, with its
// latency to headers (or error), its outcome as the key's Classify gave
// it, and what its answer told of the lane (a). A Success is evidence of
// the lane's health and a latency sample; a Failure is evidence, and adds
// to the lane's failure penalty (see failurePenalty), not to its
// estimate; a Discarded outcome with a latency (a hedge leg cancelled as
// the loser) is a sample of at least that latency, and no evidence; any
// other outcome, or a zero latency, teaches nothing. A load report
// (a.Reported) becomes the lane's last, with the attempts then
// outstanding on it; a Failure bounds the report it came with, and the
// lane's last, by the client's evidence (see Set).
//
// A timeout the client ended late enough after its deadline (a.Late) to
// be its own stall (timing.Stalled) is the client's, and teaches the lane
// nothing: neither a failure in a row nor in its rate, no penalty, no
// silence, and its lane is not taken out. A Failure whose dial was
// refused or timed out (Unreached) takes the lane out for downFor, not
// through an ejection, and asks Endpoints again early. A Failure with
// a.Hold (a Retry-After) holds the lane back when it is still in the set
// and another lane is left, and no penalty:
// the hold is its penalty, and the failure counts neither towards
// ConsecutiveFailures nor in the lane's failure rate; the
// lane is tried again by one probe as soon as the hold could be shorter
// than it says: after a.Hint when the server gave one shorter than Hold,
// else after Hold less a second (Retry-After counts whole seconds), at
// most MaxEjectFor. Done allocates only to report an ejection.
func (s *Set[P]) Done(l *Lane[P], now time.Time, latency time.Duration, o policy.Outcome, a Answer) Report[P] {
	t := s.nanos(now)
	if a.Kind == Mute && timing.Stalled(a.Late) {
		// The client's own stall ended it: it says nothing of the
		// lane, as a call its caller cancelled says nothing.
		o, a.Kind = policy.Canceled, Answered
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	last := l.outstanding.Add(-1) == 0
	ends := s.ends.Add(1)
	// Sent while its estimate was stale (see staleAfter): its answer is
	// a probe's.
	stale := l.hushT.Load() != 0 && t-int64(latency)-l.hushT.Load() >= int64(staleAfter)
	switch bit := uint64(1) << l.Index; {
	case l.draining: // its slot may be another lane's now
	case a.Kind.silent():
		s.silent.Or(bit)
		l.hushT.Store(t)
		l.hushN.Store(ends)
	case o == policy.Success || o == policy.Failure && a.Kind != Unreached:
		s.silent.And(^bit)
		l.hushT.Store(0)
	}
	if a.Reported {
		l.repLoad.Store(math.Float64bits(a.Load.Util))
		l.repPer.Store(math.Float64bits(a.Load.Per))
		left := 0.0
		if a.Load.Served {
			left = a.Load.Per
		}
		l.repLeft.Store(math.Float64bits(left))
		l.repOut.Store(l.outstanding.Load())
		l.repAt.Store(t)
	}
	if o == policy.Failure {
		l.failAt.Store(t)
	}
	rep := s.doneLocked(l, t, latency, o, a, stale)
	if bit := uint64(1) << l.Index; !l.draining && (last || l.health != out) {
		// Its probe, if this was it, is over; a lane that answered is
		// out no more.
		s.probing.And(^bit)
		if l.health != out {
			s.outs.And(^bit)
		}
	}
	l.endT = max(l.endT, t)
	switch {
	case !last:
	case l.draining:
		rep.Drained = l
		s.draining = slices.DeleteFunc(s.draining, func(d *Lane[P]) bool { return d == l })
	case l.ejectedAt(t):
		rep.Drained = l
	}
	return rep
}

// doneLocked is Done's learning, with s.mu held; stale is whether the
// attempt was sent while l's estimate was stale (see staleAfter).
func (s *Set[P]) doneLocked(l *Lane[P], t int64, latency time.Duration, o policy.Outcome, a Answer, stale bool) (rep Report[P]) {
	if l.back {
		l.back, rep.Returned = false, l.last
	}
	s.stalls.ended(t, t-int64(latency), s.lastSent.Load(), s.inFlightLocked)
	switch o {
	case policy.Success:
		s.successLocked(l, t, latency, stale, &rep)
		s.evidenceLocked(l, t, &rep)
	case policy.Failure:
		s.failureLocked(l, t, latency, a, &rep)
	case policy.Discarded:
		s.discardedLocked(l, t, latency, a, &rep)
	}
	return rep
}

// successLocked learns from a Success of l at t that took latency, sent
// while l's estimate was stale or not: a latency sample, when it has one,
// the penalty halved, and the lane answering. s.mu is held.
func (s *Set[P]) successLocked(l *Lane[P], t int64, latency time.Duration, stale bool, rep *Report[P]) {
	if latency > 0 {
		x := float64(latency)
		if stale {
			// A probe of a lane whose estimate is what its silence
			// said, long ago: the lane answers as one nothing is
			// known of.
			l.forget(t)
		}
		if l.est.Load() == 0 {
			l.warm.Store(t) // its first answer: the slow start begins
		}
		n := s.stalls.net(t, x)
		if l.health == out || stale {
			// The first answer of a lane taken out for not answering,
			// or of one silent long enough, took as long as what kept
			// it silent (a frozen replica answers at its thaw what it
			// took since): it says the lane answers, and is taken as
			// no slower than the other lanes' best; its next answers
			// tell the rest.
			n = min(n, s.leastTypicalLocked(l, t))
		}
		s.sampleLocked(l, t, x, n)
		s.slowLocked(l, t, x, n, true, rep)
		l.lastS, l.lastX = t-int64(latency), n
	}
	if p := l.penalty(t); p > 0 {
		l.pen.Store(math.Float64bits(p / 2))
		l.penT.Store(t)
	}
	l.health = answering
	l.consecutive = 0
	l.calls++
	if l.Redial.Load() {
		l.Redial.Store(false)
	}
}

// failureLocked learns from a Failure of l at t that took latency, and
// what its answer told: a refused dial takes the lane out; a Retry-After
// holds it back, and counts no further; else the failure counts in its
// run and its interval, and it is taken out when mute, or else
// penalized; a run of ConsecutiveFailures ejects it; and the report says
// whether the lane explains the failure, a connection lane that does
// being placed anew.
// s.mu is held.
func (s *Set[P]) failureLocked(l *Lane[P], t int64, latency time.Duration, a Answer, rep *Report[P]) {
	l.failed()
	if a.Kind == Unreached {
		if s.evidenceLocked(l, t, rep) {
			s.downLocked(l, t)
			rep.Explained = s.otherOpenLocked(l, t, true)
		}
		return
	}
	// A lane held back by its answer's Retry-After is out until then,
	// which is its penalty: the answer is the server's pushback, which
	// says how busy it is, not that it fails, and counts neither in its
	// failures in a row nor in its failure rate. Counted, a replica
	// pushing back at every client in a moment of overload would be
	// ejected by all of them for EjectFor, and the replicas left would
	// refuse what it served. A lane that left the set is held by nothing:
	// the Retry-After is the key's.
	rep.Held = a.Hold > 0 && !l.draining && !l.ejectedAt(t) && s.otherOpenLocked(l, t, false)
	if rep.Held {
		if s.evidenceLocked(l, t, rep) {
			s.holdLocked(l, t, a)
			rep.Explained = s.otherOpenLocked(l, t, true)
		}
		return
	}
	l.consecutive++
	// A lane that said nothing before the attempt's timeout is out for
	// downFor, then probed, as one whose dial was refused: what it will
	// do next is unknown, not 2^k times its timeout.
	mute := a.Kind == Mute
	if !mute {
		x := max(float64(latency), minPenalty, s.slowestLocked(l, t))
		p := min(maxPenalty, x*math.Pow(failurePenalty, float64(min(l.consecutive, maxPenaltyPower))))
		l.pen.Store(math.Float64bits(max(p, l.penalty(t))))
		l.penT.Store(t)
	}
	l.calls++
	l.failures++
	if !s.evidenceLocked(l, t, rep) {
		return
	}
	if s.consecutive > 0 && l.consecutive >= s.consecutive && !l.ejectedAt(t) {
		if e, ok := s.ejectLocked(l, t, policy.EjectConsecutive); ok {
			rep.Ejected = append(rep.Ejected, e)
		}
	}
	if mute && !l.ejectedAt(t) {
		s.outLocked(l, t)
	}
	rep.Explained = (l.ejectedAt(t) || l.consecutive >= failingRun || mute) && s.otherOpenLocked(l, t, true)
	if rep.Explained && s.refresh == 0 && !l.ejectedAt(t) {
		s.redialLocked(l, t)
	}
}

// evidenceLocked ends what a Success or a Failure of l at t teaches
// alike: the close of the interval when it is due. It reports whether
// the lane is still in the set, so that the rules about it go on. s.mu is
// held.
func (s *Set[P]) evidenceLocked(l *Lane[P], t int64, rep *Report[P]) bool {
	if l.draining {
		return false
	}
	if t-s.intervalT >= int64(interval) {
		rep.Ejected = append(rep.Ejected, s.closeIntervalLocked(t)...)
	}
	return true
}

// discardedLocked learns from a Discarded attempt of l at t (a hedge
// leg cancelled as the loser): a lane taken out for not answering and
// still unanswered is taken out again if it kept silent; else its time
// on the wire is a sample of at least that latency, and no evidence.
// s.mu is held.
func (s *Set[P]) discardedLocked(l *Lane[P], t int64, latency time.Duration, a Answer, rep *Report[P]) {
	switch {
	case l.health == out && l.est.Load() == 0:
		// A lane taken out for not answering stays one nothing is known
		// of until it answers. Its probe lost to a hedge with no answer
		// is one more it did not answer: out again, else the next pick
		// would probe it at once, and every call would wait a hedge's
		// delay on it for as long as the replica stays silent.
		if a.Kind == Silent && !l.draining {
			s.outLocked(l, t)
		}
	case latency > 0:
		x := float64(latency)
		n := s.stalls.net(t, x)
		if a.Kind == Silent && s.silenceLocked(l, t, x, n, rep) {
			return
		}
		s.sampleLocked(l, t, x, n)
		s.slowLocked(l, t, x, n, false, rep)
	}
}

// holdLocked holds l back at t for the pushback in a: until a probe may
// try it (see Done), from when it is a lane nothing is known of. s.mu is
// held.
func (s *Set[P]) holdLocked(l *Lane[P], t int64, a Answer) {
	d := max(a.Hold-retryAfterGrain, 0)
	if a.Hint > 0 && a.Hint < a.Hold {
		d = a.Hint
	}
	l.forget(t)
	if l.blockLocked(held, t+int64(min(d, s.maxEjectFor))) {
		s.reblockLocked(t)
	}
}

// downLocked takes l out at t, its dial refused or timed out: for
// downFor, then one probe at a time until it answers; and Endpoints is
// asked again as soon as refreshGap has passed since it was last asked.
// s.mu is held.
func (s *Set[P]) downLocked(l *Lane[P], t int64) {
	s.outLocked(l, t)
	if r := s.refreshAt.Load(); s.refresh > 0 && r != math.MaxInt64 {
		s.refreshAt.Store(min(r, max(t, s.askedT+int64(refreshGap))))
	}
}

// outLocked takes l out at t for downFor, then one probe at a time until
// it answers: a probe each pick claims (see take), so that neither two
// picks at once nor a call that used every other lane sends it a second
// while one is in flight. s.mu is held.
func (s *Set[P]) outLocked(l *Lane[P], t int64) {
	l.forget(t)
	l.health = out
	bit := uint64(1) << l.Index
	s.outs.Or(bit)
	s.probing.And(^bit) // the next probe is the first after this block
	if l.blockLocked(down, t+int64(downFor)) {
		s.reblockLocked(t)
	}
}

// redialLocked places connection lane l anew at t: its pool is to dial
// again, and its estimate, typical latency and run of slow answers start
// over as a new lane's (one probe at a time until it answers), since
// they describe the replica it leaves. Its failures in a row and its last
// outcome stay until it answers: they are the key's evidence (see
// Report.Explained), and a lane placed on a failing replica again goes on
// to be ejected. s.mu is held.
func (s *Set[P]) redialLocked(l *Lane[P], t int64) {
	l.forget(t)
	l.slow, l.silentSlow, l.typ, l.typT = 0, 0, 0, 0
	l.Redial.Store(true)
}

// failed notes a Failure in l's health (see health). The Set's mu is held.
func (l *Lane[P]) failed() {
	if l.health != out {
		l.health = failing
	}
}
