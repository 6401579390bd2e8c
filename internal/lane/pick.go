package lane

import (
	"iter"
	"math"
	"math/bits"
	"time"
)

// The picking cost.
const (
	// decay is the time constant of a lane's latency estimate: a faster
	// sample is averaged in with weight 1 − e^(−Δt/decay) (a slower one
	// too, unless it is taken as the new peak: see sampleLocked), and the
	// estimate read at a pick has decayed towards zero by e^(−Δt/decay)
	// since its last sample, so that a lane left alone because it was slow
	// is tried again. 10 s, as Finagle's PeakEwma and Linkerd: with a
	// shorter one, a replica many times slower whose legs hedges cancel
	// (its estimate sees only their time to the hedge) is picked again as
	// soon as its estimate decays, and each of its calls waits a hedge's
	// delay. The price: a peak too short to count as a stall keeps its
	// lane unpicked for seconds.
	decay = 10 * time.Second
	// failurePenalty: failures are kept out of the latency estimate
	// (failure accrual apart, as Finagle keeps it). A failure sets the
	// lane's penalty, added to its estimate at a pick, to at least the
	// slowest other lane's estimate (at least its own latency, at least
	// minPenalty) times failurePenalty to the power of the lane's
	// consecutive failures (at most maxPenalty): a lane that fails fast
	// costs more than any healthy one, and a run of failures more than
	// the outstanding attempts that load puts on the others (1 + about 4
	// at 16 callers on four lanes: three failures in a row outweigh it).
	// The penalty fades with the time constant failureDecay, the scale
	// of a failure (a timeout, a restart), not of the latency average,
	// and each success halves it: a lane that failed for a few seconds
	// and then answers is back to its share within 3 s
	// (TestALanesShareAfterA2sOutage).
	failurePenalty = 2.0
	minPenalty     = float64(time.Millisecond)
	maxPenalty     = float64(30 * time.Second)
	failureDecay   = time.Second
	// maxPenaltyPower caps the exponent of failurePenalty, so that the
	// power stays finite; maxPenalty caps the penalty long before it.
	maxPenaltyPower = 64
	// slowStart is Envoy's slow start window: a lane nothing was known
	// of (new in the set, back from an ejection, a hold or a refused
	// dial, dialed anew) gets one probe at a time until it answers
	// (probeCost), then its cost is divided by a weight that grows
	// linearly from minWeight to 1 over slowStart since that answer, so
	// that its share ramps up rather than jumping from nothing to all
	// that its low estimate would draw.
	slowStart = time.Second
	minWeight = 0.1
	// minEstimate is the least estimate a pick reads, so that among
	// lanes decayed to nothing the least loaded wins.
	minEstimate = float64(time.Microsecond)
	// probeCost is what each outstanding attempt of a lane with no
	// sample yet costs (Finagle's PeakEwma penalizes such a lane on its
	// first probe): a lane nothing is known of is tried once, and gets
	// more only when every other lane costs more than the probes in
	// flight on it, so that a key's first calls are not spread evenly
	// over a slow replica before any answer came back.
	probeCost = float64(time.Hour)
	// staleAfter and staleEnds: the estimate of a lane whose last
	// attempt ended with no answer (Silent or Mute: a hedge leg lost, a
	// connection closed before the headers) holds at most what that
	// silence said, a time the replica was slower than another lane
	// (taken as a peak when the others overtook it), and says nothing
	// of the replica once staleAfter has passed since and the key has
	// ended staleEnds attempts. Such a lane with no attempt in flight
	// then costs what a lane nothing is known of costs (minEstimate,
	// plus its failure penalty): the next pick that draws it sends it
	// one probe, whose answer is taken as such a lane's first (see
	// successLocked). Without it, a frozen replica whose legs lose to
	// hedges below the slow run's bar (latencyFactor) keeps the peak of
	// its first loss, is passed over by every pick that draws a cheaper
	// lane beside it, and gets no attempt through its thaw until the
	// peak decays (see decay); with it, it is back at the first probe
	// after its thaw. A probe of a replica slower than the others costs
	// its call a hedge's delay: one in staleEnds + 1 of the key's
	// attempts keeps those calls at half a percent, out of the p99, and
	// a key of 200 calls a second or more probes once a second.
	staleAfter = time.Second
	staleEnds  = 199
	// sentGrain is how precisely a Set keeps the time of its latest
	// pick, for the stall rule (see stalls.ended): parallel picks then
	// seldom write the Set's shared word.
	sentGrain = int64(50 * time.Microsecond)
)

// cheaper reports whether a's picking cost at t is below b's, their
// load reports read up to age ns old (0: none read), ends attempts of
// the key ended by then.
func cheaper[P any](a, b *Lane[P], t, age, ends int64) bool {
	return a.cost(t, age, ends) < b.cost(t, age, ends)
}

// cost is l's picking cost at t, with ends attempts of the key ended by
// then: its own cost (see ownCost) times max(1, u + Per), u its server's
// utilization (see util) when its last load report is at most age ns
// old, Per the attempt's own share of it. The estimate of a lane hushed
// long enough (see staleAfter) with none outstanding is read as
// minEstimate.
func (l *Lane[P]) cost(t, age, ends int64) float64 {
	o := l.outstanding.Load()
	est := max(l.estimate(t), minEstimate)
	own := est
	if o == 0 && l.staleAt(t, ends) {
		own = minEstimate
	}
	c := l.ownCost(t, float64(o), own)
	if u, ok := l.util(t, age, o, est); ok {
		c *= max(u+math.Float64frombits(l.repPer.Load()), 1)
	}
	return c
}

// queues reports whether an attempt sent on l at t would wait in its
// server's queue, as its last load report, at most age ns old, tells:
// whether the server's utilization (see util) and the attempt's own
// share of it (Per) come to more than 1. A lane with no such report, or
// whose server did not say its limit and reports 1 or less, does not.
func (l *Lane[P]) queues(t, age int64) bool {
	u, ok := l.util(t, age, l.outstanding.Load(), max(l.estimate(t), minEstimate))
	return ok && u+math.Float64frombits(l.repPer.Load()) > 1
}

// ownCost is l's picking cost at t by the client's own evidence, with o
// attempts outstanding on it and est its latency estimate decayed to t,
// at least minEstimate: (o + 1) × (est plus its failure penalty decayed
// to t), divided by its slow start weight; for a lane with no sample
// yet, o × probeCost (see probeCost).
func (l *Lane[P]) ownCost(t int64, o, est float64) float64 {
	if l.est.Load() == 0 && o > 0 {
		return o * probeCost
	}
	c := (o + 1) * (est + l.penalty(t))
	if w := l.warm.Load(); w != 0 && t-w < int64(slowStart) {
		c /= max(minWeight, float64(t-w)/float64(slowStart))
	}
	return c
}

// util is l's server's utilization at t (1 at its limit) as its last
// load report tells it, with o attempts outstanding on l and est its
// latency estimate: the reported utilization (less the request it
// answered, where it counted it: see Load.Served) less the time since the
// report over est, down to the limit and no further (a report at or
// under the limit is taken as it stands), plus Per for each attempt
// outstanding beyond those when it came; ok false when the report is
// older than age ns, or there is none (age 0: none read). A failure
// since the report needs no rule of its own here: a cost's factor is at
// least 1, and the failure's penalty is in the client's own cost.
//
// max(1, u + Per) is the time a new request would take at that server
// as a multiple of its service time, when its limit is its workers and
// its queue is served in order: with room under the limit (u + Per at
// most 1), one service time; else it waits for u + Per − 1 limits'
// worth of requests to leave, its own place in the queue included (a
// slot frees every 1/limit of a service time), then is served. So where
// the attempt finds room a report changes no cost, and the client's own
// peak-EWMA rules (the lanes' latency and failures, which a report can
// never lower); where it would queue (see queues), the lane costs more
// in proportion to the wait, a server at its limit a Per more, which the
// client's own outstanding count, its sliver of the server's load, sees
// late. The queue is taken to drain as
// time passes (at one limit per est, the lane's latency standing for the
// service time: an overestimate while it queues, so the drain is
// underestimated), or a lane that every client avoids for the queue it
// reported would stay avoided, unasked and idle, until its report grew
// stale; but only down to the limit: what keeps a server's workers busy
// is the fleet's other clients, whose sends a client does not see, so a
// server at its limit is taken to stay there, and an attempt sent to it
// to queue (see queues), until a newer report says otherwise. The
// client's own attempts sent since the report are added back (Prequal's
// client-side compensation: see Per).
func (l *Lane[P]) util(t, age, o int64, est float64) (u float64, ok bool) {
	if age == 0 {
		return 0, false
	}
	at := l.repAt.Load()
	if at == 0 || t-at > age {
		return 0, false
	}
	u = max(math.Float64frombits(l.repLoad.Load())-math.Float64frombits(l.repLeft.Load()), 0)
	u = max(u-float64(max(t-at, 0))/est, min(u, 1))
	if n := o - l.repOut.Load(); n > 0 {
		u += float64(n) * math.Float64frombits(l.repPer.Load())
	}
	return u, true
}

// report is l's last load report at t, and its age: its utilization,
// at least 1 when an attempt on the lane failed since the report came
// (the client's evidence bounds the server's word); ok false when it has
// none.
func (l *Lane[P]) report(t int64) (load float64, age time.Duration, ok bool) {
	at := l.repAt.Load()
	if at == 0 {
		return 0, 0, false
	}
	load = math.Float64frombits(l.repLoad.Load())
	if l.failAt.Load() >= at {
		load = max(load, 1)
	}
	return load, time.Duration(max(t-at, 0)), true
}

// staleAt reports whether l's estimate is stale at t, ends attempts of
// the key ended by then: its last attempt ended with no answer at least
// staleAfter ago, and the key has ended staleEnds attempts since (see
// staleAfter).
func (l *Lane[P]) staleAt(t, ends int64) bool {
	h := l.hushT.Load()
	return h != 0 && t-h >= int64(staleAfter) && ends-l.hushN.Load() >= staleEnds
}

// penalty is l's failure penalty at t (see failurePenalty).
func (l *Lane[P]) penalty(t int64) float64 {
	p := math.Float64frombits(l.pen.Load())
	if p == 0 {
		return 0
	}
	if dt := t - l.penT.Load(); dt > 0 {
		p *= math.Exp(-float64(dt) / float64(failureDecay))
	}
	return p
}

// forget makes l a lane nothing is known of: one probe at a time until
// it answers, then a slow start.
func (l *Lane[P]) forget(t int64) {
	l.est.Store(0)
	l.stamp.Store(t)
	l.warm.Store(0)
}

func (l *Lane[P]) estimate(t int64) float64 {
	return math.Float64frombits(l.est.Load()) * decayed(t-l.stamp.Load())
}

// decayed returns e^(−dt/decay), 1 for dt <= 0. Picks read it twice, so
// the common case, a lane sampled within the last half second, takes the
// series to its fourth term (relative error under 3e-7) rather than
// math.Exp.
func decayed(dt int64) float64 {
	x := float64(dt) / float64(decay)
	switch {
	case x <= 0:
		return 1
	case x < 0.05:
		return 1 - x*(1-x/2*(1-x/3))
	}
	return math.Exp(-x)
}

// Take picks a lane for a wire attempt at now, and counts it outstanding
// until Done. used is the mask of lane indexes the attempt's call has
// already sent on (bit Index); the pick is among the lanes neither used nor
// blocked, else among those not blocked, else among those not used, else
// any, a lane taken out for not answering whose one probe is in flight
// counting as blocked (see take). It never returns nil, and never
// allocates.
func (s *Set[P]) Take(now time.Time, used uint64) *Lane[P] { return s.take(now, used, false) }

// TakeOnce is Take for an attempt of a request that cannot be sent twice
// (neither retried nor hedged once it may have reached a replica): it
// passes over the lanes whose last attempt was met with silence (see
// Silent and Mute) while another lane is left. A replica that stopped
// answering (frozen, hung) loses its first attempts to their hedges at
// the hedge's delay, long before any timeout; an attempt that cannot be
// hedged would wait there for its timeout and fail.
func (s *Set[P]) TakeOnce(now time.Time, used uint64) *Lane[P] { return s.take(now, used, true) }

func (s *Set[P]) take(now time.Time, used uint64, once bool) *Lane[P] {
	t := s.nanos(now)
	v := s.view.Load()
	blocked := s.blocked.Load()
	if blocked != 0 && t >= s.blockedUntil.Load() {
		blocked = s.unblock(t)
	}
	// A lane out (see outLocked) whose probe is in flight is passed over
	// as a blocked one is while a lane neither blocked nor busy is left:
	// its cost alone (probeCost) would not keep it from the pick of a
	// call that used every other lane. Its probe is claimed by an atomic
	// or, so that of picks at once (those that waited on unblock's mutex
	// go on together) only one sends it: each reads its cost before any
	// of them counts its attempt outstanding, and would send one. A pick
	// that loses the claim picks again, without it.
	busy := s.probing.Load() & s.outs.Load()
	for {
		l := s.pick(v, t, used, blocked, busy, once)
		bit := uint64(1) << l.Index
		if bit&busy == 0 && s.outs.Load()&bit != 0 {
			if was := s.probing.Or(bit); was&bit != 0 {
				busy |= bit
				continue
			}
		}
		l.outstanding.Add(1)
		if t-s.lastSent.Load() >= sentGrain {
			s.lastSent.Store(t) // within sentGrain: parallel picks seldom write the Set's line
		}
		return l
	}
}

// pick is take's choice at t among v's lanes, the mask used of the call's
// and those blocked and busy (see take): among the lanes neither used,
// blocked nor busy, else neither blocked nor busy, else not blocked, else
// not used, else any.
func (s *Set[P]) pick(v *view[P], t int64, used, blocked, busy uint64, once bool) *Lane[P] {
	all := v.mask
	cand := all &^ used &^ blocked &^ busy
	if cand == 0 {
		cand = all &^ blocked &^ busy
	}
	if cand == 0 {
		cand = all &^ blocked
	}
	if cand == 0 {
		cand = all &^ used
	}
	if cand == 0 {
		cand = all
	}
	if once {
		if c := cand &^ s.silent.Load(); c != 0 {
			cand = c
		}
	}
	var l *Lane[P]
	if n := bits.OnesCount64(cand); n == 1 {
		l = v.lanes[bits.TrailingZeros64(cand)]
	} else {
		// One random word draws both: its low half the first lane, its
		// high half the second among the others, each scaled to the
		// count by a multiply and a shift (k = half × n / 2^32).
		r := s.rand()
		a := nth(cand, int((r&math.MaxUint32)*uint64(n)>>32))
		b := nth(cand&^(1<<a), int((r>>32)*uint64(n-1)>>32))
		l = v.lanes[a]
		if o := v.lanes[b]; cheaper(o, l, t, s.reportAge, s.ends.Load()) {
			l = o
		}
		if s.reportAge != 0 && l.queues(t, s.reportAge) {
			l = cheapest(v, cand, t, s.reportAge, s.ends.Load(), l)
		}
	}
	return l
}

// cheapest returns the lane of v in cand whose cost at t is the lowest,
// l if none is below its cost (see Set: a queue found widens the pick).
func cheapest[P any](v *view[P], cand uint64, t, age, ends int64, l *Lane[P]) *Lane[P] {
	c := l.cost(t, age, ends)
	for m := cand; m != 0; m &= m - 1 {
		if o := v.lanes[bits.TrailingZeros64(m)]; o != l {
			if oc := o.cost(t, age, ends); oc < c {
				l, c = o, oc
			}
		}
	}
	return l
}

// nth returns the index of the k-th set bit of m, counting from zero: for
// k of 8 or more, a binary search by population count down to a byte, then
// at most seven steps.
func nth(m uint64, k int) int {
	base := 0
	for _, w := range [...]int{32, 16, 8} {
		if k < 8 {
			break
		}
		lo := m & (1<<w - 1)
		if c := bits.OnesCount64(lo); k >= c {
			k -= c
			m >>= w
			base += w
		} else {
			m = lo
		}
	}
	for ; k > 0; k-- {
		m &= m - 1
	}
	return base + bits.TrailingZeros64(m)
}

// unblock ends the blocks whose time is up at t, and returns the slots
// still blocked.
func (s *Set[P]) unblock(t int64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reblockLocked(t)
}

// bitsOf yields the index of each set bit of m, lowest first.
func bitsOf(m uint64) iter.Seq[int] {
	return func(yield func(int) bool) {
		for ; m != 0; m &= m - 1 {
			if !yield(bits.TrailingZeros64(m)) {
				return
			}
		}
	}
}
