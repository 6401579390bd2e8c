package gate

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/resilix/resilix/estimator"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// Counter indexes in Throttler.win.
const (
	thrRequests  = iota                                  // every Admit, refused or not
	thrAccepts                                           // Done with accepted
	thrWithdrawn                                         // Done with Canceled or Discarded: not evidence
	thrMix                                               // + priority: Admit per bucket
	thrWeightSum = thrMix + shedding.NumPriorities       // + priority: tenant weights × thrWeightOne
	thrWeighed   = thrWeightSum + shedding.NumPriorities // + priority: weights summed
	thrCounters  = thrWeighed + shedding.NumPriorities
)

const (
	// thrWeightOne is a tenant weight of 1 in the fixed point of the
	// weight counters.
	thrWeightOne = 1 << 10
	// thrMaxWeight caps a tenant weight, so the weight counters cannot
	// overflow.
	thrMaxWeight = 1 << 20
	// thrMinShare is the least share a tenant counts with, so that a bucket
	// of tenants the tracker does not follow (new ones, or ids that change
	// with every request) is still shed: its weights are all equal.
	thrMinShare = 0.1
)

// Throttler is the runtime state of a Throttler, one per scope:
// client-side adaptive throttling from Google's SRE book, chapter 21
// ("Handling Overload", https://sre.google/sre-book/handling-overload/),
// shed bottom-up by priority and, within a priority, heaviest tenant first.
//
// # The rule
//
// Over a sliding Window (estimator.Counters: four slices of Window/4) the
// throttler counts requests, every attempt Admit is asked about, including
// the ones it refuses itself, as the book does, and accepts, the attempts
// the backend accepted. Each new attempt is refused with probability
//
//	p = 0                                                                   if requests < MinRequests
//	p = min(MaxRejection, max(0, (requests − K·accepts) / (requests + 1)))  otherwise
//
// where requests and accepts are the window's counts before the attempt.
// The floor and the ceiling are not the book's. Without the floor, one 503
// from a host the client has just met (requests 1, accepts 0) gives
// p = 1/2; with the default MinRequests of 20, nothing is throttled until
// 20 requests are in the window, and again after a quiet spell has emptied
// it. Without the ceiling, p tends to 1 while the backend refuses
// everything, and the backend hears from the client about once per
// Window; with the default MaxRejection of 0.95, one attempt in 20 still
// goes through. A negative MinRequests and a MaxRejection of 1 leave the book's
// formula alone.
//
// While the backend accepts everything, p is 0. When it starts refusing,
// the client keeps sending about K requests per accept, so the backend
// still sees enough traffic to show it has recovered, and stops sending the
// rest, which never leave the process. K = 2 and two minutes of history
// are the book's choices. A lower K throttles more aggressively, a higher
// one less; with K = 2 the backend receives about two requests per one it
// accepts, wasting some of its resources on refusals in exchange for
// noticing its recovery sooner, which the book prefers. Two minutes also
// spans the latency of any reasonable request many times over, so an
// accept lands in the window that holds its request.
//
// # What counts as accepted
//
// The transport reports each admitted attempt's end with Done, with the
// outcome Classify gave it and whether Throttler.Accepted (DefaultAccepted
// unless set) says the backend accepted it: not for transport errors, 429,
// 502, 503 and 504; yes for every other status, 500 included. An attempt
// that ended Canceled (the caller gave up) or Discarded (a hedge loser that
// resilix cancelled) is not evidence either way: Done withdraws it from the
// requests. (A withdrawal lands in the slice it happens in, so for a moment
// at a slice boundary the requests may be undercounted; the count is never
// taken below zero.)
//
// # Who is refused
//
// p is the fraction of all traffic to shed, floor and ceiling applied. It
// is split bottom-up by priority with shedding.Split over the window's mix
// of requests per bucket: Bulk first, then BestEffort, then Degraded, and
// Critical only when every lower bucket is fully shed (or p reaches 1,
// which takes a MaxRejection of 1). That gives each bucket b its
// probability q_b. A lower bucket's q_b may be 1 (Bulk refused outright
// while the backend refuses everything), but the split keeps the expected
// share of all attempts refused at p, so at most MaxRejection, and while
// p is below 1 so is Critical's q_b.
//
// Within a bucket, tenants are refused by weight. A tenant's share s is its
// recent admissions over its fair share (1 + tenant.Tracker.Excess, at
// least 0.1, which is also what a tenant the tracker does not follow gets;
// 1 for a request with no tenant), and its weight is w = s², so a tenant at
// twice its fair share weighs 4 and one at half of it 1/4. The request is refused with probability
//
//	min(1, q_b · w / W_b)
//
// where W_b is the mean weight of the bucket's recent requests (over the
// window, counted while the bucket is being shed). Dividing by W_b keeps the
// bucket's expected shed rate at q_b whatever the tenant mix, except where
// a tenant's probability is capped at 1; squaring makes the heavy absorb
// the shedding: with one tenant at ten times another, the light one is
// refused about 1/100 as often as the heavy one. Tenant admissions are
// tracked over 30 seconds by a tenant.Tracker of default capacity, so memory
// does not grow with the number of tenant ids; it is the scope's, shared
// with the limiter, and allocated by the first attempt that names a tenant
// (see Tenants).
//
// # Using it
//
// Call Admit for every attempt; if it admits, call Done once when the
// attempt's response headers (or its error) arrive: the accept is decided by
// the status, so the body plays no part. The random draw comes from a PCG
// seeded at construction, under the throttler's mutex, so a test with the
// same seed and instants sees the same refusals. Admit and Done do not
// allocate. A refusal is reported to the caller as ErrThrottled.
//
// A nil *Throttler is a throttler that is off: it admits
// everything. An Throttler is safe for concurrent use.
type Throttler struct {
	k       float64
	minReq  uint64  // the floor on requests; 0 for none
	maxRej  float64 // the ceiling on p, in (0, 1]
	win     *estimator.Counters
	tenants *Tenants

	mu  sync.Mutex
	rng rand.PCG
}

// NewThrottler returns the runtime state of cfg, with an empty
// window starting at now. cfg must be valid (Set.Validate checks it). seed
// seeds the random draws; give each throttler its own. tenants is the
// scope's tenant tracker, shared with its limiter.
func NewThrottler(cfg policy.Throttler, now time.Time, seed uint64, tenants *Tenants) *Throttler {
	t := &Throttler{
		k:       max(cfg.K, 1),
		minReq:  uint64(max(cfg.MinRequests, 0)),
		maxRej:  cfg.MaxRejection,
		win:     estimator.NewCounters(cfg.Window, thrCounters, now),
		tenants: tenants,
	}
	t.rng.Seed(seed, seed^0x9e3779b97f4a7c15)
	return t
}

// ThrottleDecision is Admit's answer.
type ThrottleDecision struct {
	// OK is true when the attempt is admitted; the caller must then call
	// Done once.
	OK bool
	// Pressure is the overall rejection probability p at the time of the
	// decision.
	Pressure float64
	// Probability is the probability this attempt had of being refused:
	// p split to its priority and weighted by its tenant.
	Probability float64
	// HeavyTenant is true when the attempt's tenant was above its fair
	// share.
	HeavyTenant bool
}

// Admit decides whether an attempt of priority prio for tenantID (empty for
// none) may go to the backend at now, and counts it as a request. An
// invalid priority counts as Critical.
func (t *Throttler) Admit(now time.Time, prio shedding.Priority, tenantID string) ThrottleDecision {
	if t == nil {
		return ThrottleDecision{OK: true}
	}
	if !prio.Valid() {
		prio = shedding.Critical
	}
	var sums [thrCounters]uint64
	t.win.Sums(now, sums[:thrMix+shedding.NumPriorities])
	p := t.rejection(&sums)
	t.win.Add(now, thrRequests, 1)
	t.win.Add(now, thrMix+int(prio), 1)
	d := ThrottleDecision{OK: true, Pressure: p}
	if p > 0 {
		d = t.shed(now, p, prio, tenantID, &sums)
	}
	if d.OK && tenantID != "" {
		t.tenants.tracker(now).Add(now, tenantID)
	}
	return d
}

// shed is Admit's path under pressure p > 0: split p to prio, weight it by
// tenant, draw. sums holds the window's requests, accepts, withdrawals and
// mix before this attempt.
func (t *Throttler) shed(now time.Time, p float64, prio shedding.Priority, tenantID string, sums *[thrCounters]uint64) ThrottleDecision {
	d := ThrottleDecision{Pressure: p}
	var mix [shedding.NumPriorities]float64
	for b := range mix {
		mix[b] = float64(sums[thrMix+b])
	}
	mix[prio]++ // this attempt
	q := shedding.Split(p, mix)[prio]
	if q <= 0 {
		d.OK = true
		return d
	}
	w := 1.0 // no tenant: neutral
	if tenantID != "" {
		e := t.tenants.tracker(now).Excess(now, tenantID)
		d.HeavyTenant = e > 0
		s := max(1+e, thrMinShare)
		w = min(s*s, thrMaxWeight)
	}
	if q >= 1 {
		d.Probability = 1
		return d
	}
	// Weigh the attempt against the bucket's mean weight, this attempt
	// included.
	fixed := uint64(w * thrWeightOne)
	t.win.Add(now, thrWeightSum+int(prio), fixed)
	t.win.Add(now, thrWeighed+int(prio), 1)
	t.win.Sums(now, sums[:])
	sum, n := sums[thrWeightSum+int(prio)], sums[thrWeighed+int(prio)]
	if n == 0 || sum == 0 { // a slice boundary cleared them: this attempt alone
		sum, n = fixed, 1
	}
	mean := float64(sum) / float64(n)
	d.Probability = min(1, q*float64(fixed)/mean)
	t.mu.Lock()
	u := float64(t.rng.Uint64()>>11) * 0x1p-53 // uniform in [0, 1)
	t.mu.Unlock()
	d.OK = u >= d.Probability
	return d
}

// Done records the end of an admitted attempt at now: o is its outcome as
// classified, accepted whether the backend accepted it (Throttler.Accepted).
// Canceled and Discarded attempts are withdrawn from the requests, whatever
// accepted says.
func (t *Throttler) Done(now time.Time, o policy.Outcome, accepted bool) {
	if t == nil {
		return
	}
	switch {
	case !o.Evidence():
		t.win.Add(now, thrWithdrawn, 1)
	case accepted:
		t.win.Add(now, thrAccepts, 1)
	}
}

// Pressure returns the rejection probability p at now, before the split by
// priority and tenant: the p the next Admit would start from, floor and
// ceiling applied.
func (t *Throttler) Pressure(now time.Time) float64 {
	if t == nil {
		return 0
	}
	var sums [thrCounters]uint64
	t.win.Sums(now, sums[:thrMix])
	return t.rejection(&sums)
}

// rejection computes p from the window's sums.
func (t *Throttler) rejection(sums *[thrCounters]uint64) float64 {
	req, acc, wd := sums[thrRequests], sums[thrAccepts], sums[thrWithdrawn]
	if wd >= req {
		return 0
	}
	n := req - wd
	if n < t.minReq {
		return 0
	}
	r := float64(n)
	p := (r - t.k*float64(acc)) / (r + 1)
	if !(p > 0) {
		return 0
	}
	return math.Min(p, t.maxRej)
}
