package lane

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/policy"
)

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
// each sample net of the key's own stalls (see stalls), and decays
// towards zero while a lane is left alone (see decay). Failures are kept out of it: each sets a penalty that fades in
// seconds (see failurePenalty). Where a lane's server reported its load
// on an answer (see Answer.Load) at most LoadReportAge ago, the cost is
// multiplied by max(1, u + Per), the time the attempt would take there in
// service times: u is the reported utilization less the queue drained
// since (down to the limit), plus the lane's attempts sent since the
// report (Prequal's client-side compensation), and Per the attempt's own
// place; see util. When the lane the two
// choices pick would queue the attempt by its report (see queues), the
// pick is the cheapest of every lane it may take: two draws among four
// lanes miss the one lane with room half the time, and a queued attempt
// waits a service time for each limit's worth ahead of it; below a
// queue, the two choices' randomness keeps clients that act on the same
// reports from moving together. A replica whose queue grows is then
// avoided before it refuses;
// under its limit, a report changes nothing (the same random draws give
// the same lanes), and it never lowers a cost. A lane nothing is known of (new in the
// set, back from an ejection, a hold or a refused dial, dialed anew)
// costs probeCost for each attempt in flight on it, so it gets one probe
// at a time until it answers, then ramps up to its share over slowStart;
// for a lane taken out for not answering (a refused dial, a timeout with
// no answer), the one probe is a claim that picks at once, and the legs
// of a call that used every other lane, respect too (see take).
// So does a lane whose last attempt ended with no answer staleAfter ago
// and staleEnds attempts of the key ago: its estimate is only what that
// silence said, and stale.
// A lane whose last attempt ended with no answer (Silent or Mute: a hedge
// leg cut short, a timeout) is passed over by TakeOnce, the pick of a
// request that cannot be sent twice, until it answers again. Done tells
// the lane how the attempt went, and returns what the caller must act on.
//
// A lane's health: a Failure adds to its consecutive failures, a Success
// ends them; outcomes are also counted per interval of 10 s. A lane is
// ejected when its consecutive failures reach ConsecutiveFailures; when
// slowRun of its answers, with no fast one between, each took
// latencyFactor × the lowest typical latency of the other lanes or more,
// net of the key's own stalls (see stalls), and each overtaken by a faster
// lane's answer (or alone in flight: see overtakenLocked), so that a stall
// of the client's own process, which slows every lane at once, ejects
// nothing; or, at the end of an interval, when it had minCalls outcomes,
// the other lanes together as many, and its failure rate reached min(0.9,
// max(0.2, 3 × theirs)). An ejection lasts EjectFor × the lane's ejection
// count, at most MaxEjectFor; each interval a lane ends unejected takes
// one off the count. At most MaxEjected of the lanes are ejected at once
// (at least one of two or more, never all), on the set as it stands after
// each refresh too; the worst rate goes first. A slow run made only of
// hedge losses with no answer is a lane that answers nothing: it is down,
// as below, not ejected. A lane whose dial was
// refused or timed out is down for downFor, no ejection; so is one whose
// attempt its timeout ended with no answer (Mute), which counts in its
// failures too, unless the client ended that timeout late enough after
// its deadline to be its own stall (timing.Stalled), which is no outcome
// of the lane (see Answer.Late). A lane held by a
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
// its source, math/rand/v2's per-thread one, one atomic add for the lane's
// outstanding count) except, once per block's end, to unblock; Done holds
// the Set's mutex briefly. A Set is safe for concurrent use. Its memory is
// under a kilobyte plus about 280 bytes a lane, and the caller's Pool.
type Set[P any] struct {
	consecutive int
	maxEjected  float64
	ejectFor    time.Duration
	maxEjectFor time.Duration
	refresh     time.Duration // 0: no Endpoints
	reportAge   int64         // ns: how old a load report picks read; 0: none
	open        func(addr string, index int) P
	epoch       time.Time
	// rand is the random source of the two choices: math/rand/v2's
	// per-thread one, which takes no lock, unless a test sets its own
	// before the Set is used.
	rand func() uint64

	view         atomic.Pointer[view[P]]
	blocked      atomic.Uint64 // slots blocked (ejected or held), as of blockedUntil
	blockedUntil atomic.Int64  // the earliest end of a blocked slot's time, ns
	silent       atomic.Uint64 // slots whose last attempt to end was Silent or Mute
	outs         atomic.Uint64 // slots whose lane is out (health out), written with mu held
	probing      atomic.Uint64 // of those, the slots a Take claimed for their one probe (see take)
	refreshAt    atomic.Int64  // ns: a refresh is due from then; math.MaxInt64 while one runs, or with no Endpoints
	lastSent     atomic.Int64  // ns: the latest Take, within sentGrain
	ends         atomic.Int64  // attempts ended (Done), written with mu held

	mu        sync.Mutex
	intervalT int64 // ns: the start of the current interval
	askedT    int64 // ns: when the last refresh began
	stalls    stalls
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
		reportAge:   int64(max(cfg.LoadReportAge, 0)),
		open:        open,
		rand:        rand.Uint64,
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
	s.outs.And(^(1 << index))
	s.probing.And(^(1 << index))
	return l
}

// nanos is now as the Set counts time: nanoseconds since its epoch, at
// least 1, so that 0 can mean never.
func (s *Set[P]) nanos(now time.Time) int64 { return max(int64(now.Sub(s.epoch)), 1) }

// Counts returns the Set's counts at now.
func (s *Set[P]) Counts(now time.Time) Counts {
	t := s.nanos(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.view.Load()
	c := Counts{Lanes: v.n, Ignored: s.ignored}
	for i := range bitsOf(v.mask) {
		l := v.lanes[i]
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
// draining left out), its state, address and load report at now, and the zero
// LaneSnapshot at every other index. It allocates nothing.
func (s *Set[P]) States(now time.Time, lanes *[policy.MaxLanes]policy.LaneSnapshot) {
	t := s.nanos(now)
	*lanes = [policy.MaxLanes]policy.LaneSnapshot{}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.view.Load()
	for i := range bitsOf(v.mask) {
		l := v.lanes[i]
		ls := policy.LaneSnapshot{State: l.stateLocked(t), Addr: l.Addr}
		ls.Load, ls.LoadAge, ls.HasLoad = l.report(t)
		lanes[l.Index] = ls
	}
}

// Pools calls f with the pool of every lane, those draining included, with
// no lock held while f runs.
func (s *Set[P]) Pools(f func(P)) {
	s.mu.Lock()
	v := s.view.Load()
	pools := make([]P, 0, v.n+len(s.draining))
	for i := range bitsOf(v.mask) {
		pools = append(pools, v.lanes[i].Pool)
	}
	for _, l := range s.draining {
		pools = append(pools, l.Pool)
	}
	s.mu.Unlock()
	for _, p := range pools {
		f(p)
	}
}
