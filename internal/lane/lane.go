// Package lane is the runtime state of policy.Replicas: the lanes of one
// key, the picker, each lane's health and ejection, and the refresh of an
// Endpoints answer. It is a pure core: time is an input, and it starts no
// goroutine and no timer; the transport sends the wire attempts, asks the
// resolver and closes connections, as the answers of Set's methods tell it.
package lane

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/policy"
)

// The picking cost and the health rules, against their anchors.
const (
	// decay is the time constant of a lane's latency estimate: a sample
	// slower than the estimate replaces it at once, a faster one is
	// averaged in with weight 1 − e^(−Δt/decay), and the estimate read at
	// a pick has decayed towards zero by e^(−Δt/decay) since its last
	// sample, so that a lane left alone because it was slow is tried
	// again. Finagle's PeakEwma and Linkerd's default to 10 s, and so
	// does this. Shorter was tried and is worse: at 1 or 2 s, a replica
	// 20× slower, whose legs hedges cancel (so that the estimate sees only
	// their time to the hedge), was picked again as often as its estimate
	// decayed, and its calls, each hedged, took the p99 up to 12 ms
	// against a steady 7 (fleetops' slow scenario, 1 run of 3). The cost:
	// a peak one hiccup of a busy machine left (too short to count as a
	// stall: 30 ms against 6) keeps its lane unpicked for seconds.
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
	// slowStart is Envoy's slow start window: a lane nothing was known
	// of (new in the set, back from an ejection, a hold or a refused
	// dial, dialed anew) gets one probe at a time until it answers
	// (probeCost), then its cost is divided by a weight that grows
	// linearly from minWeight to 1 over slowStart since that answer, so
	// that its share ramps up rather than jumping from nothing to all
	// that its low estimate would draw.
	slowStart = time.Second
	minWeight = 0.1
	// downFor is how long a lane whose dial was refused or timed out
	// (nothing answers at its address) is out: then the next pick may
	// send it one probe. A refused dial is not an ejection: it counts
	// neither towards ConsecutiveFailures nor against MaxEjected, and
	// asks Endpoints again, at most once per refreshGap.
	downFor    = time.Second
	refreshGap = time.Second
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

	// A lane whose answers come slowRun in a row at least latencyFactor
	// times the lowest typical latency of the other lanes (those not
	// blocked and with an answer) is ejected for its latency. The picker
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
	// tens of seconds, hiding a replica 20× slower than the others.
	latencyFactor = 5.0
	slowRun       = 5
	typical       = time.Second
	// peakFactor: a sample slower than a lane's estimate replaces it at
	// once (the peak) only when another lane answered at least
	// peakFactor times faster over the same moments (see sampleLocked).
	peakFactor = 2.0
	// A gap is a stretch in which no attempt of the key ended for
	// stallGaps × the mean time between its ends or more (and
	// latencyFactor/2 × the lowest typical latency of its lanes or
	// more) while another attempt was in flight: with ends spread at
	// random (Poisson) at a steady rate, a stretch that long comes once
	// in e^8, about 3000; a stall of the client's own process ends none
	// while it lasts. gapRing is how many
	// recent gaps a Set remembers, to take them out of the answers that
	// straddle them (see netLocked).
	stallGaps = 8.0
	gapRing   = 16
	// sentGrain is how precisely a Set keeps the time of its latest
	// pick, for the stall rule (see endedLocked).
	sentGrain = int64(50 * time.Microsecond)

	// interval is the period over which failure rates are compared
	// (Envoy's outlier detection interval); minCalls is how many outcomes
	// a lane, and the other lanes together, need in it for its rate to
	// be judged (Envoy asks 100 for its success rate, the breaker's
	// MinCalls is 20).
	interval = 10 * time.Second
	minCalls = 20
	// firstRetry is the wait after a failed or empty Endpoints answer,
	// doubled after each one up to Refresh.
	firstRetry = time.Second
)

// Lane is one connection pool of a key: an address of Endpoints, or one of
// Connections pools to the request's own address. Pool is what the caller
// sends through, built by the open func given to New. A lane is safe for
// concurrent use; its fields other than Pool are the Set's.
type Lane[P any] struct {
	// Addr is the lane's address, "" for a connection lane, and for the
	// lane that dials the request's own address until Endpoints answers.
	Addr string
	// Index is the lane's slot in its Set, in [0, policy.MaxLanes): the
	// bit of a used mask, and the name of a connection lane.
	Index int
	Pool  P
	// Redial is true while a connection lane placed anew (see Set) has
	// not succeeded since: the caller should close its pool's idle
	// connections before each of its attempts, so that it dials. Its
	// next success clears it.
	Redial atomic.Bool

	outstanding atomic.Int64  // attempts taken and not done
	est         atomic.Uint64 // float64 bits: the latency estimate, ns
	stamp       atomic.Int64  // when est was last sampled, ns since the Set's epoch
	until       atomic.Int64  // blocked (ejected, held or down) until then, ns; 0: never blocked
	pen         atomic.Uint64 // float64 bits: the failure penalty, ns, as of penT
	penT        atomic.Int64  // when pen was last set, ns
	warm        atomic.Int64  // when its slow start began, ns; 0: not in one

	// Guarded by the Set's mu.
	answered        bool // some outcome was evidence
	lastOK          bool // the last outcome that was evidence was a Success
	consecutive     int
	slow            int              // answers in a row far slower than the other lanes' (see latencyFactor)
	wasOut          bool             // taken out for not answering (outLocked), and no success since
	blockedAs       policy.LaneState // LaneHeld or LaneDown: what set until last, when not an ejection
	typ             float64          // its typical latency, ns (see typical)
	typT            int64            // when typ was last sampled, ns; 0: never
	lastS           int64            // when its last success was sent, ns; 0: never
	lastX           float64          // and its latency net of the key's stalls, ns
	endT            int64            // when its last attempt ended, ns
	calls, failures int              // in the current interval
	ejections       int              // the multiplier of the next ejection's time, less one
	ejected         bool
	last            Ejection[P] // the last ejection
	back            bool        // returned from it, and not yet reported
	removed         bool        // its address left the set: draining
}

// cheaper reports whether a's picking cost at t is below b's.
func cheaper[P any](a, b *Lane[P], t int64) bool { return a.cost(t) < b.cost(t) }

// cost is l's picking cost at t: (outstanding + 1) × (its latency
// estimate decayed to t, at least minEstimate, plus its failure penalty
// decayed to t), divided by its slow start weight; for a lane with no
// sample yet, outstanding × probeCost (see probeCost).
func (l *Lane[P]) cost(t int64) float64 {
	o := float64(l.outstanding.Load())
	if l.est.Load() == 0 && o > 0 {
		return o * probeCost
	}
	c := (o + 1) * (max(l.estimate(t), minEstimate) + l.penalty(t))
	if w := l.warm.Load(); w != 0 && t-w < int64(slowStart) {
		c /= max(minWeight, float64(t-w)/float64(slowStart))
	}
	return c
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

// ejectedAt reports whether l is ejected at t. The Set's mu is held.
func (l *Lane[P]) ejectedAt(t int64) bool { return l.ejected && l.until.Load() > t }

// view is the set of lanes picks read, immutable once published.
type view[P any] struct {
	lanes [policy.MaxLanes]*Lane[P]
	mask  uint64 // the slots in use
	n     int
}

// Set is the lanes of one key (see policy.Replicas).
//
// Take picks a lane for a wire attempt by the power of two choices
// (Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing",
// 2001) over peak-EWMA cost (Finagle's PeakEwma, finagle-core
// loadbalancer/PeakEwma.scala): two distinct lanes drawn at random among
// those the call has not used and that are not blocked, the lower
// (outstanding + 1) × (latency estimate + failure penalty) wins. The
// estimate jumps to a slower sample at once, averages a faster one in,
// each sample net of the key's own stalls (see netLocked), and decays
// towards zero while a lane is left alone (see decay). Failures are kept out of it: each sets a penalty that fades in
// seconds (see failurePenalty). A lane nothing is known of (new in the
// set, back from an ejection, a hold or a refused dial, dialed anew)
// costs probeCost for each attempt in flight on it, so it gets one probe
// at a time until it answers, then ramps up to its share over slowStart.
// A lane whose last attempt ended with no answer (Answer.Silent: a hedge
// leg cut short, a timeout) is passed over by TakeOnce, the pick of a
// request that cannot be sent twice, until it answers again. Done tells
// the lane how the attempt went, and returns what the caller must act on.
//
// A lane's health: a Failure adds to its consecutive failures, a Success
// ends them; outcomes are also counted per interval of 10 s. A lane is
// ejected when its consecutive failures reach ConsecutiveFailures; when
// slowRun of its answers, with no fast one between, each took
// latencyFactor × the lowest typical latency of the other lanes or more,
// net of the key's own stalls (netLocked), and each overtaken by a faster
// lane's answer (or alone in flight: see overtakenLocked), so that a stall
// of the client's own process, which slows every lane at once, ejects
// nothing; or, at the end of an interval, when it had minCalls outcomes,
// the other lanes together as many, and its failure rate reached min(0.9,
// max(0.2, 3 × theirs)). An ejection lasts EjectFor × the lane's ejection
// count, at most MaxEjectFor; each interval a lane ends unejected takes
// one off the count. At most MaxEjected of the lanes are ejected at once
// (at least one of two or more, never all), on the set as it stands after
// each refresh too; the worst rate goes first. A lane whose dial was
// refused or timed out is down for downFor, no ejection. A lane held by a
// Retry-After, down, or ejected, is blocked: it is picked only when no
// other lane is left. When its time is up it is picked again, as a lane
// nothing is known of; an ejected lane's runs of failures and of slow
// answers are cleared.
//
// A connection lane (no Endpoints) whose failure it explains (see
// Report.Explained: two in a row while another lane is not known to fail)
// and that is not ejected is placed anew: Redial asks the caller to close
// its pool's idle connections before its attempts until one succeeds (the
// failed answer's connection is busy until its body is done with, so one
// close may miss it), so that a balancer places its next connection on a
// replica drawn again; its estimate, typical latency and run of slow
// answers start over as a new lane's (one probe at a time until it
// answers). Its failures in a row and its last outcome are kept: they are
// the key's evidence, and a lane placed on a failing replica again goes
// on to be ejected. Behind an L4 balancer a lane is where its connections
// landed, not a replica: without this, a client whose balancer put three
// of its four lanes on one bad replica keeps them there for as long as
// their connections live.
//
// Nothing here starts a goroutine or a timer: ejections, holds and downs
// end, intervals close and refreshes fall due lazily, from the now of the
// calls. Take takes no lock (a few atomic loads, one random word from
// math/rand/v2's per-thread source, one atomic add for the lane's
// outstanding count) except, once per block's end, to unblock; Done holds
// the Set's mutex briefly. A Set is safe for concurrent use. Its memory is
// under a kilobyte plus about 150 bytes a lane, and the caller's Pool.
type Set[P any] struct {
	consecutive int
	maxEjected  float64
	ejectFor    time.Duration
	maxEjectFor time.Duration
	refresh     time.Duration // 0: no Endpoints
	open        func(addr string, index int) P
	epoch       time.Time

	view         atomic.Pointer[view[P]]
	blocked      atomic.Uint64 // slots blocked (ejected or held), as of blockedUntil
	blockedUntil atomic.Int64  // the earliest end of a blocked slot's time, ns
	silent       atomic.Uint64 // slots whose last attempt to end was Silent
	refreshAt    atomic.Int64  // ns: a refresh is due from then; math.MaxInt64 while one runs, or with no Endpoints
	lastSent     atomic.Int64  // ns: the latest Take, within sentGrain

	mu        sync.Mutex
	intervalT int64   // ns: the start of the current interval
	askedT    int64   // ns: when the last refresh began
	lastDone  int64   // ns: the latest end of an attempt
	meanGap   float64 // ns: the mean time between ends, a moving average of 16
	quiet     int64   // ns: a stretch with no attempt ended this long is remembered in gaps
	gaps      [gapRing]gap
	gapNext   int // the slot of the next gap (the oldest, once full)
	draining  []*Lane[P]
	backoff   time.Duration
	ignored   int
}

// New returns the lanes of a key for cfg (policy.Replicas with its
// defaults applied) at now. With Endpoints, it has one
// lane, dialing the request's own address (Addr ""), and a refresh is due
// at once; without, cfg.Connections lanes. open builds a lane's pool; it is
// called with the Set's mutex held, and must not call the Set.
func New[P any](cfg policy.Replicas, now time.Time, open func(addr string, index int) P) *Set[P] {
	s := &Set[P]{
		consecutive: cfg.ConsecutiveFailures,
		maxEjected:  cfg.MaxEjected,
		ejectFor:    cfg.EjectFor,
		maxEjectFor: cfg.MaxEjectFor,
		open:        open,
		epoch:       now.Add(-1), // so that now itself is 1 ns, and 0 is before anything
		backoff:     firstRetry,
	}
	n := max(cfg.Connections, 1)
	s.refreshAt.Store(math.MaxInt64)
	if cfg.Endpoints != nil {
		s.refresh = cfg.Refresh
		n = 1
		s.refreshAt.Store(0)
	}
	v := new(view[P])
	for i := range n {
		v.lanes[i] = s.newLane("", i, 0)
		v.mask |= 1 << i
	}
	v.n = n
	s.view.Store(v)
	return s
}

func (s *Set[P]) newLane(addr string, index int, est float64) *Lane[P] {
	l := &Lane[P]{Addr: addr, Index: index, Pool: s.open(addr, index)}
	l.est.Store(math.Float64bits(est))
	s.silent.And(^(1 << index))
	return l
}

// nanos is now as the Set counts time: nanoseconds since its epoch, at
// least 1, so that 0 can mean never.
func (s *Set[P]) nanos(now time.Time) int64 { return max(int64(now.Sub(s.epoch)), 1) }

// Take picks a lane for a wire attempt at now, and counts it outstanding
// until Done. used is the mask of lane indexes the attempt's call has
// already sent on (bit Index); the pick is among the lanes neither used nor
// blocked, else among those not blocked, else among those not used, else
// any. It never returns nil, and never allocates.
func (s *Set[P]) Take(now time.Time, used uint64) *Lane[P] { return s.take(now, used, false) }

// TakeOnce is Take for an attempt of a request that cannot be sent twice
// (neither retried nor hedged once it may have reached a replica): it
// passes over the lanes whose last attempt was met with silence (see
// Answer.Silent) while another lane is left. A replica that stopped
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
	all := v.mask
	cand := all &^ used &^ blocked
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
		r := rand.Uint64()
		a := nth(cand, int((r&math.MaxUint32)*uint64(n)>>32))
		b := nth(cand&^(1<<a), int((r>>32)*uint64(n-1)>>32))
		l = v.lanes[a]
		if o := v.lanes[b]; cheaper(o, l, t) {
			l = o
		}
	}
	l.outstanding.Add(1)
	if t-s.lastSent.Load() >= sentGrain {
		s.lastSent.Store(t) // within sentGrain: parallel picks seldom write the Set's line
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

// reblockLocked recomputes the blocked slots at t: a lane whose time is up
// is unblocked, and an ejected one returns as a new lane would, its
// consecutive count cleared and its estimate the mean of the others' (its
// last, a failure's, would keep it from being picked long after it served
// its time). s.mu is held.
func (s *Set[P]) reblockLocked(t int64) uint64 {
	v := s.view.Load()
	var b uint64
	next := int64(math.MaxInt64)
	for m := v.mask; m != 0; m &= m - 1 {
		l := v.lanes[bits.TrailingZeros64(m)]
		u := l.until.Load()
		switch {
		case u > t:
			b |= 1 << l.Index
			next = min(next, u)
		case l.ejected:
			l.ejected, l.back, l.consecutive, l.slow = false, true, 0, 0
			l.forget(t)
		}
	}
	s.blockedUntil.Store(next)
	s.blocked.Store(b)
	return b
}

// gap is a stretch of time in which no attempt of a key ended, ns.
type gap struct{ from, to int64 }

// Ejection is a lane ejected, or back from an ejection, for the caller to
// act on and report.
type Ejection[P any] struct {
	Lane   *Lane[P]
	Reason policy.EjectionReason
	For    time.Duration
}

// Answer is what an attempt's answer, or its error, told of its lane
// beyond its outcome.
type Answer struct {
	// Hold is the answer's Retry-After on a 503 or 429, zero otherwise.
	Hold time.Duration
	// Hint is how long the server means to hold back, when it said so
	// in a header of its own beside Retry-After; zero otherwise.
	Hint time.Duration
	// Unreached is true when the attempt's dial was refused or timed
	// out: nothing answers at the lane's address.
	Unreached bool
	// Mute is true when the attempt's own timeout ended it before any
	// answer came: the replica took it and said nothing (frozen, hung).
	Mute bool
	// Silent is true when the attempt ended with no answer from a
	// replica that was reached: a hedge leg cut short, a connection
	// closed before the headers. Mute is Silent.
	Silent bool
}

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
	// that the key need not be: another lane is left to pick.
	Held bool
	// Ejected lists the lanes ejected by this outcome (one, or at the end
	// of an interval several); their pools' idle connections should be
	// closed, so that a balancer places the lane anew.
	Ejected []Ejection[P]
	// Returned is the ejection the lane came back from, when this was
	// the first evidence on it since: its Lane is nil otherwise.
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
// other outcome, or a zero latency, teaches nothing.
//
// A Failure whose dial was refused or timed out (a.Unreached) takes the
// lane out for downFor, not through an ejection, and asks Endpoints
// again early. A Failure with a.Hold (a Retry-After) holds the lane back
// when another lane is left, and no penalty: the hold is its penalty; the
// lane is tried again by one probe as soon as the hold could be shorter
// than it says: after a.Hint when the server gave one shorter than Hold,
// else after Hold less a second (Retry-After counts whole seconds), at
// most MaxEjectFor. Done allocates only to report an ejection.
func (s *Set[P]) Done(l *Lane[P], now time.Time, latency time.Duration, o policy.Outcome, a Answer) Report[P] {
	t := s.nanos(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	last := l.outstanding.Add(-1) == 0
	switch bit := uint64(1) << l.Index; {
	case l.removed: // its slot may be another lane's now
	case a.Silent || a.Mute:
		s.silent.Or(bit)
	case o == policy.Success || o == policy.Failure && !a.Unreached:
		s.silent.And(^bit)
	}
	rep := s.doneLocked(l, t, latency, o, a)
	l.endT = max(l.endT, t)
	switch {
	case !last:
	case l.removed:
		rep.Drained = l
		s.draining = slices.DeleteFunc(s.draining, func(d *Lane[P]) bool { return d == l })
	case l.ejectedAt(t):
		rep.Drained = l
	}
	return rep
}

// doneLocked is Done's learning, with s.mu held.
func (s *Set[P]) doneLocked(l *Lane[P], t int64, latency time.Duration, o policy.Outcome, a Answer) Report[P] {
	var rep Report[P]
	s.endedLocked(t, t-int64(latency))
	down, mute := false, false
	switch {
	case o == policy.Success:
		if latency > 0 {
			x := float64(latency)
			if l.est.Load() == 0 {
				l.warm.Store(t) // its first answer: the slow start begins
			}
			n := s.netLocked(t, x)
			if l.wasOut {
				// The first answer of a lane taken out for not answering
				// took as long as what kept it out (a frozen replica
				// answers at its thaw what it took since): it says the
				// lane answers, and is taken as no slower than the other
				// lanes' best; its next answers tell the rest.
				n = min(n, s.leastTypicalLocked(l, t))
			}
			s.sampleLocked(l, t, x, n)
			s.slowLocked(l, t, x, n, true, &rep)
			l.lastS, l.lastX = t-int64(latency), n
		}
		if p := l.penalty(t); p > 0 {
			l.pen.Store(math.Float64bits(p / 2))
			l.penT.Store(t)
		}
		l.answered, l.lastOK, l.wasOut = true, true, false
		l.consecutive = 0
		l.calls++
		if l.Redial.Load() {
			l.Redial.Store(false)
		}
	case o == policy.Failure && a.Unreached:
		l.answered, l.lastOK = true, false
		down = true
	case o == policy.Failure:
		// A lane held back by its answer's Retry-After is out until
		// then, which is its penalty.
		rep.Held = a.Hold > 0 && !l.ejectedAt(t) && s.otherOpenLocked(l, t, false)
		l.answered, l.lastOK = true, false
		l.consecutive++
		// A lane that said nothing before the attempt's timeout is out
		// for downFor, then probed, as one whose dial was refused:
		// what it will do next is unknown, not 2^k times its timeout.
		mute = a.Mute && !rep.Held
		if !rep.Held && !mute {
			x := max(float64(latency), minPenalty, s.slowestLocked(l, t))
			p := min(maxPenalty, x*math.Pow(failurePenalty, float64(min(l.consecutive, 64))))
			l.pen.Store(math.Float64bits(max(p, l.penalty(t))))
			l.penT.Store(t)
		}
		l.calls++
		l.failures++
	case o == policy.Discarded && l.wasOut && l.est.Load() == 0:
		// A lane taken out for not answering stays one nothing is known
		// of until it answers. Its probe lost to a hedge with no answer
		// is one more it did not answer: out again, else the next pick
		// would probe it at once, and every call would wait a hedge's
		// delay on it (150 legs in a frozen replica's last 3 s).
		if a.Silent && !l.removed {
			s.outLocked(l, t)
		}
		return rep
	case o == policy.Discarded && latency > 0:
		x := float64(latency)
		n := s.netLocked(t, x)
		s.sampleLocked(l, t, x, n)
		s.slowLocked(l, t, x, n, false, &rep)
		return rep
	default:
		return rep
	}
	if l.back {
		l.back, rep.Returned = false, l.last
	}
	if l.removed {
		return rep
	}
	if t-s.intervalT >= int64(interval) {
		rep.Ejected = append(rep.Ejected, s.closeIntervalLocked(t)...)
	}
	if o != policy.Failure {
		return rep
	}
	if down {
		s.downLocked(l, t)
		rep.Explained = s.otherOpenLocked(l, t, true)
		return rep
	}
	if s.consecutive > 0 && l.consecutive >= s.consecutive && !l.ejectedAt(t) {
		if e, ok := s.ejectLocked(l, t, policy.EjectConsecutive); ok {
			rep.Ejected = append(rep.Ejected, e)
		}
	}
	if rep.Held {
		s.holdLocked(l, t, a)
	}
	if mute && !l.ejectedAt(t) {
		s.outLocked(l, t)
	}
	rep.Explained = (l.ejectedAt(t) || l.consecutive >= 2 || rep.Held || mute) && s.otherOpenLocked(l, t, true)
	if rep.Explained && !rep.Held && s.refresh == 0 && !l.ejectedAt(t) {
		s.redialLocked(l, t)
	}
	return rep
}

// holdLocked holds l back at t for the pushback in a: until a probe may
// try it (see Done), from when it is a lane nothing is known of. s.mu is
// held.
func (s *Set[P]) holdLocked(l *Lane[P], t int64, a Answer) {
	d := max(a.Hold-time.Second, 0)
	if a.Hint > 0 && a.Hint < a.Hold {
		d = a.Hint
	}
	l.forget(t)
	if u := t + int64(min(d, s.maxEjectFor)); u > l.until.Load() {
		l.until.Store(u)
		l.blockedAs = policy.LaneHeld
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
// it answers. s.mu is held.
func (s *Set[P]) outLocked(l *Lane[P], t int64) {
	l.forget(t)
	l.wasOut = true
	if u := t + int64(downFor); u > l.until.Load() {
		l.until.Store(u)
		l.blockedAs = policy.LaneDown
		s.reblockLocked(t)
	}
}

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
		s.meanGap += (min(d, stallGaps*s.meanGap) - s.meanGap) / 16
	}
	s.lastDone = t
}

// gapLocked remembers [from, to] as a gap. s.mu is held.
func (s *Set[P]) gapLocked(from, to int64) {
	s.gaps[s.gapNext] = gap{from, to}
	s.gapNext = (s.gapNext + 1) % gapRing
}

// inFlightLocked reports whether any lane of the set has an attempt in
// flight. s.mu is held.
func (s *Set[P]) inFlightLocked() bool {
	v := s.view.Load()
	for m := v.mask; m != 0; m &= m - 1 {
		if v.lanes[bits.TrailingZeros64(m)].outstanding.Load() > 0 {
			return true
		}
	}
	return false
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
	for m := v.mask; m != 0; m &= m - 1 {
		o := v.lanes[bits.TrailingZeros64(m)]
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

// redialLocked places connection lane l anew at t: its pool is to dial
// again, and its estimate, typical latency and run of slow answers start
// over as a new lane's (one probe at a time until it answers), since
// they describe the replica it leaves. Its failures in a row and its last
// outcome stay until it answers: they are the key's evidence (see
// Report.Explained), and a lane placed on a failing replica again goes on
// to be ejected. s.mu is held.
func (s *Set[P]) redialLocked(l *Lane[P], t int64) {
	l.forget(t)
	l.slow, l.typ, l.typT = 0, 0, 0
	l.Redial.Store(true)
}

// slowLocked judges l's answer at t, which took x (ns) or, unless
// answered, at least x (a hedge leg cancelled as the loser), by the stall
// rule: n, its time net of the key's stalls (netLocked), is at least
// latencyFactor × the lowest typical latency of the other lanes not
// blocked and with an answer, and the other lanes answered latencyFactor
// times faster over the same moments (overtakenLocked). Such an answer
// counts in l's run of slow answers; if answered, one under that bound
// ends the run, and one over it that the other lanes do not confirm
// leaves the run as it is. A run of slowRun ejects l for its latency,
// reported in rep. An answer's net time is then averaged into l's typical
// latency. s.mu is held.
func (s *Set[P]) slowLocked(l *Lane[P], t int64, x, n float64, answered bool, rep *Report[P]) {
	v := s.view.Load()
	least, all := math.Inf(1), math.Inf(1)
	for m := v.mask; m != 0; m &= m - 1 {
		o := v.lanes[bits.TrailingZeros64(m)]
		if o.typT == 0 {
			continue
		}
		all = min(all, o.typ)
		if o != l && o.until.Load() <= t {
			least = min(least, o.typ)
		}
	}
	switch {
	case n >= latencyFactor*least:
		if s.overtakenLocked(l, t, x, n/latencyFactor) {
			l.slow++
		}
	case answered:
		l.slow = 0
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
		s.quiet = int64(latencyFactor / 2 * all)
	}
	if l.slow < slowRun || l.removed || l.ejectedAt(t) {
		return
	}
	l.slow = 0
	if e, ok := s.ejectLocked(l, t, policy.EjectLatency); ok {
		rep.Ejected = append(rep.Ejected, e)
	}
}

// sampleLocked folds an answer that came back at t into l's estimate:
// Finagle's peak EWMA over n, its time net of the key's stalls
// (netLocked), x as it was. The peak (a slower sample replacing the
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

// leastTypicalLocked returns the lowest typical latency at t of the lanes
// other than l that are not blocked and have an answer, +Inf if none.
// s.mu is held.
func (s *Set[P]) leastTypicalLocked(l *Lane[P], t int64) float64 {
	v := s.view.Load()
	least := math.Inf(1)
	for m := v.mask; m != 0; m &= m - 1 {
		if o := v.lanes[bits.TrailingZeros64(m)]; o != l && o.typT != 0 && o.until.Load() <= t {
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
	for m := v.mask; m != 0; m &= m - 1 {
		if o := v.lanes[bits.TrailingZeros64(m)]; o != l {
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
	for m := v.mask; m != 0; m &= m - 1 {
		o := v.lanes[bits.TrailingZeros64(m)]
		if o != l && o.until.Load() <= t && (!ok || o.lastOK || !o.answered) {
			return true
		}
	}
	return false
}

// ejectLocked ejects l at t for why, unless MaxEjected lanes are ejected
// already. s.mu is held.
func (s *Set[P]) ejectLocked(l *Lane[P], t int64, why policy.EjectionReason) (Ejection[P], bool) {
	v := s.view.Load()
	ejected := 0
	for m := v.mask; m != 0; m &= m - 1 {
		o := v.lanes[bits.TrailingZeros64(m)]
		if o.ejectedAt(t) {
			ejected++
		}
	}
	if ejected >= s.maxEject(v.n) {
		return Ejection[P]{}, false
	}
	l.ejections++
	d := min(s.ejectFor*time.Duration(l.ejections), s.maxEjectFor)
	l.ejected, l.last = true, Ejection[P]{Lane: l, Reason: why, For: d}
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
	for m := v.mask; m != 0; m &= m - 1 {
		l := v.lanes[bits.TrailingZeros64(m)]
		calls += l.calls
		failures += l.failures
	}
	var worst [policy.MaxLanes]*Lane[P]
	outliers := worst[:0]
	for m := v.mask; m != 0; m &= m - 1 {
		l := v.lanes[bits.TrailingZeros64(m)]
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
	for m := v.mask; m != 0; m &= m - 1 {
		l := v.lanes[bits.TrailingZeros64(m)]
		l.calls, l.failures = 0, 0
		// The intervals since the interval began, or since the lane's
		// last ejection ended if later.
		if free := t - max(start, l.until.Load()); free > 0 && !l.ejectedAt(t) {
			l.ejections = max(l.ejections-int(free/int64(interval)), 0)
		}
	}
	return ejected
}

// Counts is what Counts reports.
type Counts struct {
	Lanes    int // lanes picked from, those draining left out
	Ejected  int // of them, ejected now
	Ignored  int // addresses past policy.MaxLanes in Endpoints' last answer
	InFlight int // attempts taken and not done, on every lane, draining ones too
}

// Counts returns the Set's counts at now.
func (s *Set[P]) Counts(now time.Time) Counts {
	t := s.nanos(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.view.Load()
	c := Counts{Lanes: v.n, Ignored: s.ignored}
	for m := v.mask; m != 0; m &= m - 1 {
		l := v.lanes[bits.TrailingZeros64(m)]
		if l.ejectedAt(t) {
			c.Ejected++
		}
		c.InFlight += int(l.outstanding.Load())
	}
	for _, l := range s.draining {
		c.InFlight += int(l.outstanding.Load())
	}
	return c
}

// States writes into lanes, at the index of each lane picked from (those
// draining left out), its state and address at now, and the zero
// LaneSnapshot at every other index. It allocates nothing.
func (s *Set[P]) States(now time.Time, lanes *[policy.MaxLanes]policy.LaneSnapshot) {
	t := s.nanos(now)
	*lanes = [policy.MaxLanes]policy.LaneSnapshot{}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.view.Load()
	for m := v.mask; m != 0; m &= m - 1 {
		l := v.lanes[bits.TrailingZeros64(m)]
		lanes[l.Index] = policy.LaneSnapshot{State: l.stateLocked(t), Addr: l.Addr}
	}
}

// stateLocked returns l's state at t. A lane whose block is over is
// probing: it returns as a lane nothing is known of (an ejected one once
// the next pick unblocks it). The Set's mu is held.
func (l *Lane[P]) stateLocked(t int64) policy.LaneState {
	switch blocked := l.until.Load() > t; {
	case blocked && l.ejected:
		return policy.LaneEjected
	case blocked && l.blockedAs != 0:
		return l.blockedAs
	case blocked:
		return policy.LaneHeld
	case l.ejected, l.est.Load() == 0:
		return policy.LaneProbing
	}
	return policy.LaneOpen
}

// Pools calls f with the pool of every lane, those draining included, with
// no lock held while f runs.
func (s *Set[P]) Pools(f func(P)) {
	s.mu.Lock()
	v := s.view.Load()
	pools := make([]P, 0, v.n+len(s.draining))
	for m := v.mask; m != 0; m &= m - 1 {
		pools = append(pools, v.lanes[bits.TrailingZeros64(m)].Pool)
	}
	for _, l := range s.draining {
		pools = append(pools, l.Pool)
	}
	s.mu.Unlock()
	for _, p := range pools {
		f(p)
	}
}
