package gate

import (
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/estimator"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// Counter indexes in Throttler.win.
const (
	thrRequests  = iota                                  // Admit refused, or Done with evidence
	thrAccepts                                           // Done with accepted
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
// the backend accepted. An attempt it refuses is a request at once; one it
// admits becomes a request when its answer comes back (Done), in the same
// instant as its accept if it is accepted. Each new attempt is refused
// with probability
//
//	p = 0                                                                   if requests < MinRequests
//	p = min(MaxRejection, max(0, (requests − K·accepts) / (requests + 1)))  otherwise
//
// where requests and accepts are the window's counts before the attempt.
// The floor and the ceiling are not the book's. Without the floor, one 503
// from a host the client has just met (requests 1, accepts 0) gives
// p = 1/2; with the default MinRequests of 5, nothing is throttled until
// 5 requests are in the window, and again after a quiet spell has emptied
// it. Without the ceiling, p tends to 1 while the backend refuses
// everything, and the backend hears from the client about once per
// Window; with the default MaxRejection of 0.8, one attempt in 5 still
// goes through. A negative MinRequests and a MaxRejection of 1 leave the book's
// formula alone.
//
// While the backend accepts everything, p is 0. When it starts refusing,
// the client keeps sending about K requests per accept, so the backend
// still sees enough traffic to show it has recovered, and stops sending the
// rest, which never leave the process. K = 2 and two minutes of history
// are the book's choices; the defaults are K = 3 and a second, for a
// client among many of a server whose queue outgrows their deadlines
// (policy.Throttler has the reasons). A lower K throttles more
// aggressively, a higher one less; with K = 2 the backend receives about
// two requests per one it accepts, wasting some of its resources on
// refusals in exchange for noticing its recovery sooner, which the book
// prefers. Once the backend accepts everything again, the share let
// through grows about K-fold a window: each window's accepts are what the
// last one let through.
//
// The book counts a request when it is sent, and its two minutes span the
// latency of any reasonable request many times over, so that an accept
// lands in the window that holds its request. Counting an admitted
// request at its answer makes that so for any window and any latency: an
// attempt still on its way is no evidence either way, so a backend slower
// than the window (a 3 s call, a 1 s window) is not throttled while its
// first answers are on their way (TestThrottlerSlowHealthyBackend).
//
// # What counts as accepted
//
// The transport reports each admitted attempt's end with Done, with the
// outcome Classify gave it and whether Throttler.Accepted (DefaultAccepted
// unless set) says the backend accepted it: not for transport errors, 429,
// 502, 503 and 504; yes for every other status, 500 included. An attempt
// that ended Canceled (the caller gave up) or Discarded (a hedge loser that
// resilix cancelled) is not evidence either way: Done counts it as no
// request. But the transport reports an attempt its caller's deadline
// ended before any answer as a Failure, not accepted: the backend held it
// as long as the caller could wait, which is the evidence a fleet of small
// clients gets of a server whose queue outlasts their deadlines.
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
// allocate, but for pushback's state, once (see below). A refusal is
// reported to the caller as ErrThrottled.
//
// # Pushback
//
// Done also reads the answer: a 429 or 503 whose Retry-After (parsed by
// httpx.ParseRetryAfter) is positive and at most the bound holds the
// key's Bulk and BestEffort attempts back until it has passed
// (policy.Throttler's doc has the rule; Snapshot and Observer show it). A
// 503 stops them: Admit refuses them until then. A 429 paces them, with a
// token bucket of one token whose rate is the backend's accept rate times
// a headroom: Admit refills it, Bulk and BestEffort attempts need a whole
// token and take it, and Degraded and Critical attempts take one whether
// or not it is there (the bucket goes down to −1, no further), so what
// they use is what the others do without.
//
// The accept rate is measured from the instants of the accepts Done
// records while a 429's hold lasts, the last pbRing of them: over k ≥ 2
// of them, from the first to the last,
//
//	r = min((k − 1) / (last − first), (k + 1) / (now − first))
//
// the first term the rate between them, the second making r decay once no
// accept has come for two of their mean intervals. Before two accepts,
// r = (accepts + 1) / (now − start), start being the 429 that began the
// hold: there is no rate to go by yet, so r starts out unbounded and
// halves each time the time since start doubles, and attempts go out at
// instants ever further apart (each about 2.5 times as far from start)
// until the backend accepts some. The bucket is refilled with the integral
// of r since the last refill while there is no rate yet, and with the
// rate times the time since the last refill afterwards. A hold that lapses
// and is armed again starts over.
//
// The pace is r times pbHeadroom, 1.05, when the backend refused an attempt
// (429) since the first of the accepts measured: a backend at its rate
// refuses about one attempt in 21 at that pace, and one with room to spare
// accepts them all, so that the measured rate grows by a twentieth each
// turn of the ring. A larger headroom costs more refusals (one in 11 for
// 1.1) and keeps less of the strict bucket's rate below. When the backend
// has refused none of the last accepts' attempts, the pace is below what it takes, as it is after
// the sparse attempts that begin a hold, or after a lull in the client's
// own demand: it is then pbSlowStart (2) times r, up to the rate measured
// at the last refusal (no limit before one), and 1.05 times r beyond it;
// TCP's slow start and its threshold, on a rate. The limit keeps the pace
// from overshooting again where the backend refused it last.
//
// The pace keeps the whole rate of a token bucket that holds some tokens
// (an API limit's burst), whose refusals only say that the client is ahead
// of it. Against a bucket of one token (nginx's limit_req without burst,
// which admits one request per 1/rate exactly) it keeps less: a paced
// attempt a little early is refused, and the token it missed goes unused
// until the next attempt, so the measured rate falls and climbs back
// (TestPushbackPaceAgainstAStrictBucket; docs/propagation.md has the
// figures). A client that floods such a server keeps its rate, at tens of
// wire calls per success.
//
// The hold's end is one atomic word: an Admit or Done with no hold in
// force pays one atomic load (and, once a hold has been armed, a
// subtraction of instants), and the state of holds (about 200 bytes) is
// allocated by the first answer that arms one.
//
// A nil *Throttler is a throttler that is off: it admits
// everything. An Throttler is safe for concurrent use.
type Throttler struct {
	k       float64
	minReq  uint64  // the floor on requests; 0 for none
	maxRej  float64 // the ceiling on p, in (0, 1]
	win     *estimator.Counters
	tenants *Tenants

	origin  time.Time     // the instants pushback keeps are offsets from it
	maxPush time.Duration // the longest Retry-After obeyed; negative: pushback off
	// held is the end of the pushback's hold, stop or pace, as an offset
	// from origin, written under mu; 0 before the first hold.
	held atomic.Int64

	mu  sync.Mutex
	rng rand.PCG
	pb  *pushback // allocated by the first hold
}

// Pushback's parameters.
const (
	// pbRing is how many accepts the accept rate is measured over.
	pbRing = 16
	// pbHeadroom is the pace over the accept rate: one attempt in 21
	// beyond what the backend accepts, to find out whether it would take
	// more.
	pbHeadroom = 1.05
	// pbMinRetryAfter is the least RetryAfter of a paced refusal, so that
	// a caller who honours it does not come back at once.
	pbMinRetryAfter = time.Millisecond
	// pbSlowStart is the pace over the accept rate while the backend has
	// refused nothing since the first of the accepts measured, up to the
	// rate measured at its last refusal.
	pbSlowStart = 2
	// pbSlack is how far below a whole token the bucket may be and still
	// give one: what rounding loses when a refill lasts exactly the wait
	// a refusal asked for.
	pbSlack = 1e-9
)

// pushback is the state of the throttler's holds, guarded by its mutex.
// Instants are offsets from the throttler's origin.
type pushback struct {
	stop int64 // a 503's hold lasts until then
	pace int64 // a 429's hold lasts until then

	// The current pace: it started at start, with the 429 that armed it;
	// refused is the last 429 since, and ceil the accept rate measured
	// then (+Inf before the first measured one).
	start, refused int64
	ceil           float64
	tokens         float64
	filled         int64 // when tokens were last refilled
	// accepts[i%pbRing] is the instant of the i-th accept since start, for
	// the last pbRing of the n so far.
	accepts [pbRing]int64
	n       int
}

// NewThrottler returns the runtime state of cfg, with an empty
// window starting at now. cfg must be valid (Set.Validate checks it). seed
// seeds the random draws; give each throttler its own. tenants is the
// scope's tenant tracker, shared with its limiter. The bound on pushback is
// cfg.PushbackBound(nil): the transport sets cfg.MaxPushback to the bound
// the Set's Retry gives before calling it.
func NewThrottler(cfg policy.Throttler, now time.Time, seed uint64, tenants *Tenants) *Throttler {
	t := &Throttler{
		k:       max(cfg.K, 1),
		minReq:  uint64(max(cfg.MinRequests, 0)),
		maxRej:  cfg.MaxRejection,
		win:     estimator.NewCounters(cfg.Window, thrCounters, now),
		tenants: tenants,
		origin:  now,
		maxPush: cfg.PushbackBound(nil),
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
	// HeldBack is true when the attempt was refused by pushback rather
	// than by the estimate; RetryAfter then says when it would be let
	// through: what is left of a 503's Retry-After, or when a 429's pace
	// would let the next one go. Pressure and Probability are then zero
	// and one: the estimate was not asked.
	HeldBack   bool
	RetryAfter time.Duration
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
	paced := false
	if u := t.held.Load(); u != 0 && t.offset(now) < u {
		var ra time.Duration
		if paced, ra = t.holdBack(now, prio); ra > 0 {
			return ThrottleDecision{Probability: 1, HeldBack: true, RetryAfter: ra}
		}
	}
	var sums [thrCounters]uint64
	t.win.Sums(now, sums[:thrMix+shedding.NumPriorities])
	p := t.rejection(&sums)
	t.win.Add(now, thrMix+int(prio), 1)
	d := ThrottleDecision{OK: true, Pressure: p}
	if p > 0 {
		d = t.shed(now, p, prio, tenantID, &sums)
	}
	if !d.OK {
		t.win.Add(now, thrRequests, 1)
	}
	if d.OK && tenantID != "" {
		t.tenants.tracker(now).Add(now, tenantID)
	}
	if paced && !d.OK {
		t.untake()
	}
	return d
}

// offset returns now as an offset from the throttler's origin, never
// below 0, so that a hold's end is never 0.
func (t *Throttler) offset(now time.Time) int64 {
	return int64(max(now.Sub(t.origin), 0))
}

// holdBack applies the hold in force at now to an attempt of priority
// prio. It refuses a Bulk or BestEffort attempt with the wait before one
// would be let through (ra > 0), or lets it through (ra 0); paced says it
// took a token of the pace, which untake gives back if the estimate then
// refuses the attempt.
func (t *Throttler) holdBack(now time.Time, prio shedding.Priority) (paced bool, ra time.Duration) {
	off := t.offset(now)
	low := prio >= shedding.BestEffort
	t.mu.Lock()
	defer t.mu.Unlock()
	pb := t.pb
	if pb == nil {
		return false, 0
	}
	if low && off < pb.stop {
		return false, time.Duration(pb.stop - off)
	}
	if off >= pb.pace {
		return false, 0
	}
	rate := pb.refill(off)
	if !low {
		pb.tokens = max(pb.tokens-1, -1)
		return true, 0
	}
	if pb.tokens >= 1-pbSlack {
		pb.tokens--
		return true, 0
	}
	left := time.Duration(pb.pace - off)
	if !(rate > 0) {
		return false, left
	}
	wait := time.Duration(math.Ceil((1 - pb.tokens) / rate * float64(time.Second)))
	return false, min(max(wait, pbMinRetryAfter), left)
}

// untake gives back the token of an attempt the pace let through and the
// estimate refused.
func (t *Throttler) untake() {
	t.mu.Lock()
	if pb := t.pb; pb != nil {
		pb.tokens = min(pb.tokens+1, 1)
	}
	t.mu.Unlock()
}

// refill adds to the pace's tokens what its rate gives from the last
// refill to off, and returns that rate in attempts per second (+Inf when
// there is no limit yet, 0 when nothing can go).
func (pb *pushback) refill(off int64) float64 {
	elapsed := off - pb.filled
	rate := pb.rate(off)
	if elapsed <= 0 {
		return rate
	}
	if pb.n < 2 {
		// No rate yet: r(x) = c / (x − start), so the tokens are
		// c · ln((off − start) / (filled − start)), and a full bucket
		// when the last refill was at start.
		c := pbHeadroom * float64(pb.n+1)
		if from := pb.filled - pb.start; from <= 0 {
			pb.tokens = 1
		} else {
			pb.tokens = min(1, pb.tokens+c*math.Log(float64(off-pb.start)/float64(from)))
		}
	} else if math.IsInf(rate, 1) {
		pb.tokens = 1
	} else {
		pb.tokens = min(1, pb.tokens+rate*time.Duration(elapsed).Seconds())
	}
	pb.filled = off
	return rate
}

// rate returns the pace's rate at off, in attempts per second: the accept
// rate times the headroom (see Throttler).
func (pb *pushback) rate(off int64) float64 {
	if pb.n < 2 {
		since := off - pb.start
		if since <= 0 {
			return math.Inf(1)
		}
		return pbHeadroom * float64(pb.n+1) / time.Duration(since).Seconds()
	}
	r, first := pb.measured(off)
	if pb.refused >= first {
		return pbHeadroom * r
	}
	return min(pbSlowStart*r, max(pbHeadroom*r, pb.ceil))
}

// measured returns the accept rate at off, from the last pbRing accepts
// (pb.n ≥ 2), and the instant of the first of them.
func (pb *pushback) measured(off int64) (r float64, first int64) {
	k := min(pb.n, pbRing)
	first, last := pb.accepts[(pb.n-k)%pbRing], pb.accepts[(pb.n-1)%pbRing]
	r = math.Inf(1)
	if last > first {
		r = float64(k-1) / time.Duration(last-first).Seconds()
	}
	if off > first {
		r = min(r, float64(k+1)/time.Duration(off-first).Seconds())
	}
	return r, first
}

// shed is Admit's path under pressure p > 0: split p to prio, weight it by
// tenant, draw. sums holds the window's requests, accepts and mix before
// this attempt.
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
// It counts the attempt as a request, and as an accept if accepted, unless
// it is Canceled or Discarded: those are no evidence, whatever accepted
// says. resp is the attempt's response, nil if it had none: when
// it is a 429 or a 503 whose Retry-After asks for a positive wait of at
// most the bound, it arms pushback's hold until that wait has passed, or
// extends it, and Done returns what it armed; otherwise it returns the
// zero Pushback. Done does not read or close the body.
func (t *Throttler) Done(now time.Time, o policy.Outcome, accepted bool, resp *http.Response) Pushback {
	if t == nil {
		return Pushback{}
	}
	if o.Evidence() {
		t.win.Add(now, thrRequests, 1)
		if accepted {
			t.win.Add(now, thrAccepts, 1)
		}
	}
	if u := t.held.Load(); u != 0 && accepted && o.Evidence() && t.offset(now) < u {
		t.accepted(now)
	}
	v := httpx.PushbackValue(resp)
	if v == "" || t.maxPush <= 0 {
		return Pushback{}
	}
	ra, ok := httpx.ParseRetryAfter(v, now)
	if !ok || ra <= 0 || ra > t.maxPush {
		return Pushback{}
	}
	t.arm(now, resp.StatusCode == http.StatusServiceUnavailable, ra)
	return Pushback{StatusCode: resp.StatusCode, RetryAfter: ra}
}

// Pushback is what an answer armed: its status, 429 (pace) or 503 (stop),
// and the wait its Retry-After asked for. The zero Pushback armed nothing.
type Pushback struct {
	StatusCode int
	RetryAfter time.Duration
}

// Armed reports whether the answer armed a hold.
func (p Pushback) Armed() bool { return p.StatusCode != 0 }

// accepted records an accept at now in the pace's measure, if a 429's
// hold is in force.
func (t *Throttler) accepted(now time.Time) {
	off := t.offset(now)
	t.mu.Lock()
	if pb := t.pb; pb != nil && off < pb.pace && off >= pb.start {
		pb.accepts[pb.n%pbRing] = off
		pb.n++
	}
	t.mu.Unlock()
}

// arm holds Bulk and BestEffort back for ra from now: a stop, or a pace.
// A pace armed when none is in force starts over.
func (t *Throttler) arm(now time.Time, stop bool, ra time.Duration) {
	off := t.offset(now)
	until := off + int64(ra)
	t.mu.Lock()
	defer t.mu.Unlock()
	pb := t.pb
	if pb == nil {
		pb = new(pushback)
		t.pb = pb
	}
	if stop {
		pb.stop = max(pb.stop, until)
	} else {
		if off >= pb.pace {
			*pb = pushback{stop: pb.stop, start: off, filled: off, tokens: 1, ceil: math.Inf(1)}
		} else if pb.n >= 2 {
			pb.ceil, _ = pb.measured(off)
		}
		pb.refused = off
		pb.pace = max(pb.pace, until)
	}
	t.held.Store(max(pb.stop, pb.pace))
}

// Hold describes pushback's hold at an instant: Left is how long it
// still holds Bulk and BestEffort back (zero when it does not), Stopped
// whether they are stopped (a 503's), and Rate, while a 429's hold paces
// them, the pace in attempts per second, or zero while it has no limit
// yet.
type Hold struct {
	Left    time.Duration
	Stopped bool
	Rate    float64
}

// Hold returns pushback's hold at now.
func (t *Throttler) Hold(now time.Time) Hold {
	if t == nil {
		return Hold{}
	}
	off := t.offset(now)
	if u := t.held.Load(); u == 0 || off >= u {
		return Hold{}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	pb := t.pb
	h := Hold{Left: time.Duration(max(pb.stop, pb.pace) - off)}
	switch {
	case off < pb.stop:
		h.Stopped = true
	case off < pb.pace:
		if r := pb.rate(off); !math.IsInf(r, 1) {
			h.Rate = r
		}
	}
	return h
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
	req, acc := sums[thrRequests], sums[thrAccepts]
	if req < t.minReq {
		return 0
	}
	r := float64(req)
	p := (r - t.k*float64(acc)) / (r + 1)
	if !(p > 0) {
		return 0
	}
	return math.Min(p, t.maxRej)
}
