package gate

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/estimator"
	"github.com/resilix/resilix/policy"
)

// The relative trip. A failure rate is judged against the dependency's own
// baseline: a service that always fails 10% of calls is healthy at 12% and
// broken at 50%, while one that never fails is broken well before 50%.
const (
	// breakerTripFactor: the relative trip point is this multiple of the
	// baseline. At the default MinCalls (20) and a 10% baseline, the
	// standard deviation of a window's rate is about 0.067, so 3× (0.3) is
	// three standard deviations away: noise does not trip it, a real
	// change does.
	breakerTripFactor = 3.0
	// breakerTripFloor: the trip point never goes below this, so a
	// near-zero baseline does not make a couple of unlucky calls a trip.
	breakerTripFloor = 0.2
	// breakerTripCeiling: the trip point never goes above this, so a
	// dependency that routinely fails a third of its calls still trips
	// when nearly everything fails.
	breakerTripCeiling = 0.9
	// WarmupTrip is the trip point until the first baseline sample is
	// measured (Hystrix's classic 50%): a fresh scope that fails 25% of
	// the time from the start is learned, not tripped into a loop.
	WarmupTrip = 0.5
	// breakerConfidence is the z of the bounds a rate is judged with: a
	// window trips on its rate only when the rate's lower Wilson bound at
	// z = 3 (one-sided 99.87%) is past the trip point, so that a window
	// of a host steadily failing 35% does not cross 0.5 by chance (a bare
	// rate over 20 calls does about one fresh window in ten).
	breakerConfidence = 3.0
	// breakerRunConfidence is the z of the upper bound that stands in for
	// the baseline in the run rule before one is learned (97.7%): a host
	// that looks healthy over a few calls is not yet trusted to be.
	breakerRunConfidence = 2.0
	// breakerBaselineSamples: the baseline is the plain mean of its first
	// samples, then an EWMA with weight 1/breakerBaselineSamples. A sample
	// is one slice of the window (Window/4) holding at least MinCalls
	// outcomes, so the memory is about twenty slices (two and a half
	// minutes at the default Window).
	breakerBaselineSamples = 20
	// breakerJitter: an opening lasts its length × [1, 1+breakerJitter).
	breakerJitter = 0.25
)

// The run rule. With the zero ConsecutiveFailures, a run of failures trips
// only when it is improbable for the dependency's own failure rate p: the
// run that trips is the shortest k with p^k at most breakerRunOdds, so that
// at that rate a false trip comes less than once in a million attempts.
// At p = 0.05 that is 5 failures, at 0.2 it is 9, at 0.35 it is 14, at 0.5
// it is 20.
const (
	breakerRunOdds = 1e-6
	// breakerRunMin: a run never trips shorter than this, however low the
	// rate: a dead host trips after five calls, as the classic
	// ConsecutiveFailures of 5 does.
	breakerRunMin = 5
	// breakerRunMax caps the run length, which grows without bound as p
	// nears 1; the rate rule decides such a host.
	breakerRunMax = 1 << 10
	// breakerRunPrior is the rate that stands in for a host of which the
	// window knows nothing but the run itself: low enough that its run is
	// breakerRunMin, so that a host dead from its first call trips after
	// five.
	breakerRunPrior = 0.06
)

// breakerOpenShare: after the first opening, each opening lasts this share
// of the time the dependency has been failing (since the trip that began
// the openings), between FirstOpenFor and OpenFor. So each failed probe
// lengthens the next opening, an outage is over for callers at most an
// eighth of its length (and at least FirstOpenFor) after it ends, and a
// long one costs a probe round every OpenFor.
const breakerOpenShare = 1.0 / 8

// Counter indexes in Breaker.win.
const (
	breakerCalls = iota
	breakerFailures
	breakerCounters
)

// Breaker is the runtime state of a Breaker, one per scope: the
// classic closed → open → half-open → closed machine
// (https://martinfowler.com/bliki/CircuitBreaker.html), with trip rules
// that learn what normal looks like for the dependency.
//
// # Admission
//
// Allow asks whether a call may go to the dependency now. Closed, it admits
// everything. Open, it refuses everything, every priority alike (the core
// never sees priority), with a RetryAfter of the time left until half-open.
// Half-open, it admits Probes calls at once and refuses the rest with a
// zero RetryAfter (a slot frees when a probe ends). The transport turns a
// refusal into a *RejectedError matching ErrCircuitOpen.
//
// # Release and evidence
//
// An admitted call holds a BreakerPermit, which the transport releases once
// with Done when the attempt's response headers (or its error) arrive, with
// the outcome Classify gave them; the body plays no part. Success and
// Failure are evidence. Canceled (the caller gave up), Discarded (resilix
// cancelled a hedge loser) and Invalid (net/http refused to send the
// request) record nothing, but give back a half-open probe slot. Each state change starts a new generation, and a
// permit from an earlier generation is ignored by Done: a call admitted
// while closed that fails after the breaker opened counts for nothing, and
// neither does a probe that finishes after another probe already decided.
//
// # Tripping (closed → open)
//
// The breaker counts outcomes over a sliding Window (estimator.Counters:
// four slices of Window/4, a sum covering the last three to four of them).
// After a Failure it opens when any of these holds:
//
//   - a run of failures: ConsecutiveFailures in a row when that is set;
//     with the zero value, the run rule below;
//   - the window's failure rate is at or above FailureRatio, when that is
//     set, as written;
//   - the window's failure rate is, with confidence, above the relative
//     trip point.
//
// The run rule. The failures in a row that trip are the fewest k with
// p^k ≤ 10⁻⁶, and never fewer than five, where p is the baseline (below)
// or, before there is one, the upper Wilson bound (z = 2) of the window's
// failure rate outside the run itself (0.06, five failures, when the
// window holds nothing else): a dead host trips after five calls, a
// dependency that fails 20% of the time needs nine, one at 35% fourteen,
// and a jump from a 5% baseline to 60% trips within some thirty calls.
// Runs are counted so that concurrency alone does not make them: a
// failure extends the run only when its attempt was admitted after the
// run's last counted failure came back (or at that instant). Attempts that were in flight
// together and failed together (a dropped connection under many callers)
// are one failure of the run, not many; they still count in the rate.
// An explicit ConsecutiveFailures counts plain failures in a row.
//
// A rate is judged only when the window holds at least MinCalls outcomes.
// Against FailureRatio it is the bare rate, failures / outcomes, as the
// caller wrote it: FailureRatio 0.5 with MinCalls 4 trips a host failing
// every call at its fourth call. Against the relative trip point, which
// the breaker derives, it needs at least two failures and is judged by its
// lower Wilson bound
// (https://en.wikipedia.org/wiki/Binomial_proportion_confidence_interval#Wilson_score_interval)
// at z = 3: with 20 calls a host steadily failing 35% would need 17
// failures to pass 0.5 (about once in a million windows), and a dead host
// passes it at the first judgement.
//
// The relative trip point is
//
//	trip = min(0.9, max(0.2, 3 × baseline))
//
// or 0.5 while no baseline has been measured yet. The factor 3 puts the
// trip about three standard deviations above a 10% baseline at 20 calls;
// the floor 0.2 keeps a near-zero baseline from tripping on a couple of
// unlucky calls; the ceiling 0.9 lets a dependency that routinely fails a
// third of its calls still trip when nearly everything fails.
//
// The baseline is the dependency's normal failure rate, learned
// continuously while the breaker is closed. Outcomes are tallied per
// period of one slice of the window (Window/4, extended until it holds
// MinCalls outcomes); when a period ends, its failure rate, clamped to the
// trip point, is a sample (before the first sample, a period above the
// warm-up trip point is none): the baseline is the mean of the first twenty
// samples, then an EWMA giving each new sample a weight of 1/20. A period
// cut short by a trip is a sample too, without the run of failures that
// ended it, when what is left holds MinCalls outcomes: a host whose normal
// has moved is learned through its trips, while an outage, which trips on
// its run, teaches nothing. Nothing is learned while open
// or half-open, and the baseline is kept across openings. A dependency
// whose normal changes is followed within minutes; FailureRatio is the
// absolute backstop. All of this is computed lazily from the now passed
// in; no timer or goroutine runs. Rate reports the window, the baseline
// and the trip point.
//
// # Recovering
//
// The first opening lasts FirstOpenFor; after a failed probe, the next
// lasts an eighth of the time since that first trip, at least FirstOpenFor
// and at most OpenFor. So a short outage is over for callers about
// FirstOpenFor after it ends, an outage of a minute at most eight seconds
// after, and a long one costs one probe round per OpenFor. Each opening is
// jittered by a uniform draw in [1, 1.25), from a PCG seeded at
// construction, so breakers that opened together do not probe in lockstep.
// With a negative FirstOpenFor every opening lasts OpenFor. The move to
// half-open is lazy: the first Allow at or after that instant makes it and
// reports it. A probe's Success closes the breaker (with an empty window
// and run; the baseline is kept), its Failure opens it again.
//
// # By hand
//
// Isolate, Release and Reset are an operator's moves. Isolate puts the
// breaker in BreakerIsolated from any state: Allow refuses every call with
// d.Isolated and no RetryAfter, nothing is learned, and no rule and no
// time leaves it; only Release does, which closes the breaker with an empty
// window and run, as a probe's success does (what the window held predates
// the isolation). Reset closes an open or half-open breaker the same way,
// at once, and leaves a closed or isolated one as it is. Each keeps the
// baseline, and each change of state is a new generation, so that a call
// admitted before it, still in flight, finishes and counts for nothing.
//
// A breaker from NewManualBreaker, for a key without a Breaker, has only
// those moves: closed, it admits everything and learns nothing.
//
// # Transitions
//
// The breaker calls nothing. Allow, Done, Isolate, Release and Reset
// return a BreakerChange when they moved the state, and the caller reports
// it (to Observer.BreakerTransition) after they return, with no lock held. State and Rate never move it.
//
// Allow and Done do not allocate, except that Done allocates a fresh window
// when a probe closes the breaker (as Release and Reset do). A nil *Breaker is a breaker that
// is off: it admits everything. A Breaker is safe for concurrent use;
// each method holds one mutex for a few dozen instructions.
type Breaker struct {
	consecutive  int // explicit: trip after this many failures in a row; 0: the run rule; < 0 off
	ratio        float64
	minCalls     uint64
	window       time.Duration
	slice        time.Duration // a baseline period's least length
	openFor      time.Duration
	firstOpenFor time.Duration // < 0: every opening is openFor
	probes       int
	manual       bool // NewManualBreaker's: only Isolate, Release and Reset move it

	// closedGen is gen while the breaker is closed, zero otherwise, so
	// that Allow admits a call to a closed breaker with one atomic load.
	// Written under mu, with state and gen.
	closedGen atomic.Uint64
	// isolated is state == BreakerIsolated, for Isolated's one atomic
	// load. Written under mu, with state.
	isolated atomic.Bool

	mu        sync.Mutex
	state     policy.BreakerState
	gen       uint64 // changes with every state change; permits carry it
	win       *estimator.Counters
	openUntil time.Time // while open: when half-open begins
	failedAt  time.Time // the trip that began the current openings
	probesOut int       // while half-open: probes admitted and not done
	rng       rand.PCG

	// The run of failures while closed: run counts those that extend it
	// (all of them with an explicit ConsecutiveFailures; with the run rule,
	// those admitted after runAt, when the run's last counted failure came
	// back), runAll every failure since the last success.
	run, runAll int
	runAt       time.Time

	// The baseline, and the period being tallied for its next sample.
	baseline                    float64
	samples                     int // samples folded into baseline, up to breakerBaselineSamples
	periodStart                 time.Time
	periodCalls, periodFailures uint64
}

// NewBreaker returns the runtime state of cfg, closed, with an empty
// window and no baseline. cfg must be valid (Set.Validate checks it) and
// have its defaults applied. seed seeds the opening jitter; give each
// breaker its own (e.g. from a hash of its key), so that breakers that
// open together probe apart.
func NewBreaker(cfg policy.Breaker, now time.Time, seed uint64) *Breaker {
	b := &Breaker{
		consecutive:  cfg.ConsecutiveFailures,
		ratio:        cfg.FailureRatio,
		minCalls:     uint64(max(cfg.MinCalls, 1)),
		window:       cfg.Window,
		slice:        estimator.Slice(cfg.Window),
		openFor:      cfg.OpenFor,
		firstOpenFor: cfg.FirstOpenFor,
		probes:       max(cfg.Probes, 1),
		gen:          1, // the zero BreakerPermit is never current
		win:          estimator.NewCounters(cfg.Window, breakerCounters, now),
		periodStart:  now,
	}
	b.rng.Seed(seed, seed^0x9e3779b97f4a7c15)
	b.closedGen.Store(b.gen)
	return b
}

// NewManualBreaker returns a closed breaker that only Isolate, Release and
// Reset move: the breaker of a key with no Breaker configured, made when an
// operator isolates it. Closed, it admits everything and learns nothing;
// its permits need no Done (Done ignores them).
func NewManualBreaker() *Breaker {
	b := &Breaker{manual: true, gen: 1}
	b.closedGen.Store(b.gen)
	return b
}

// BreakerPermit is what Allow hands an admitted call, to be given back to
// Done exactly once. It is a small value; the zero BreakerPermit is never
// current, so Done ignores it.
type BreakerPermit struct {
	gen   uint64
	probe bool
	at    time.Time // when Allow admitted it
}

// Probe reports whether p admitted a half-open breaker's probe.
func (p BreakerPermit) Probe() bool { return p.probe }

// BreakerDecision is Allow's answer.
type BreakerDecision struct {
	// OK is true when the call is admitted.
	OK bool
	// RetryAfter, on a refusal, is the time until the breaker goes
	// half-open; zero when it is half-open already and every probe slot
	// is taken, or isolated.
	RetryAfter time.Duration
	// Isolated, on a refusal, says that the breaker is isolated (Isolate).
	Isolated bool
	// Change is the state change Allow made, if any (open → half-open).
	Change BreakerChange
}

// BreakerChange is a state change made by Allow or Done, for the caller to
// report. The zero value, like any value with From == To, is no change.
type BreakerChange struct {
	From, To policy.BreakerState
}

// Changed reports whether c is a change of state.
func (c BreakerChange) Changed() bool { return c.From != c.To }

// BreakerRate is the breaker's view of the dependency's failure rate, from
// Rate. Hedging reads it to stop hedging a dependency that is heading for a
// trip (Hedge.SuppressAt).
type BreakerRate struct {
	// Calls and Failures are the outcomes in the window, counted while
	// closed. The window is emptied when the breaker closes.
	Calls, Failures uint64
	// ErrorRate is Failures/Calls, or 0 with no calls.
	ErrorRate float64
	// TripPoint is the failure rate at which the breaker trips: the
	// relative trip point, or FailureRatio when set and lower.
	TripPoint float64
	// Baseline is the measured normal failure rate; BaselineKnown is
	// false, and Baseline 0, until the first period is measured.
	Baseline      float64
	BaselineKnown bool
	// MinCalls is the configured number of outcomes a rate needs
	// before it is judged.
	MinCalls int
}

// Judged reports whether the window holds enough evidence for its rate to
// be judged: MinCalls outcomes, two of them failures.
func (r BreakerRate) Judged() bool {
	return r.Calls >= uint64(r.MinCalls) && r.Failures >= 2
}

// Reached reports whether the rate is judged and has reached fraction of
// the trip point.
func (r BreakerRate) Reached(fraction float64) bool {
	return r.Judged() && r.ErrorRate >= fraction*r.TripPoint
}

// Allow reports whether a call may go to the dependency at now. When it
// admits (d.OK), the caller must call Done once with the permit and the
// call's outcome. d.Change reports a move from open to half-open, which
// Allow makes lazily when the opening has run out.
func (b *Breaker) Allow(now time.Time) (p BreakerPermit, d BreakerDecision) {
	if b == nil {
		return BreakerPermit{}, BreakerDecision{OK: true}
	}
	if gen := b.closedGen.Load(); gen != 0 {
		return BreakerPermit{gen: gen, at: now}, BreakerDecision{OK: true}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case policy.BreakerClosed:
		return BreakerPermit{gen: b.gen, at: now}, BreakerDecision{OK: true}
	case policy.BreakerIsolated:
		return BreakerPermit{}, BreakerDecision{Isolated: true}
	case policy.BreakerOpen:
		if now.Before(b.openUntil) {
			return BreakerPermit{}, BreakerDecision{RetryAfter: b.openUntil.Sub(now)}
		}
		b.setState(policy.BreakerHalfOpen)
		d.Change = BreakerChange{From: policy.BreakerOpen, To: policy.BreakerHalfOpen}
	}
	if b.probesOut >= b.probes {
		return BreakerPermit{}, d
	}
	b.probesOut++
	d.OK = true
	return BreakerPermit{gen: b.gen, probe: true, at: now}, d
}

// Done releases a permit from Allow with the outcome of its call, and
// returns the state change it caused, if any. A permit from an earlier
// generation (issued before the last state change) is ignored.
func (b *Breaker) Done(now time.Time, p BreakerPermit, o policy.Outcome) BreakerChange {
	if b == nil {
		return BreakerChange{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if p.gen != b.gen {
		return BreakerChange{}
	}
	switch b.state {
	case policy.BreakerClosed:
		if !o.Evidence() || b.manual {
			return BreakerChange{}
		}
		b.fold(now)
		b.win.Add(now, breakerCalls, 1)
		b.periodCalls++
		if o == policy.Success {
			b.run, b.runAll = 0, 0
			return BreakerChange{}
		}
		b.win.Add(now, breakerFailures, 1)
		b.periodFailures++
		b.runAll++
		if b.consecutive != 0 || b.run == 0 || !p.at.Before(b.runAt) {
			b.run++
			b.runAt = now
		}
		if b.shouldTrip(now) {
			b.failedAt = now
			b.open(now)
			return BreakerChange{From: policy.BreakerClosed, To: policy.BreakerOpen}
		}
	case policy.BreakerHalfOpen:
		switch o {
		case policy.Success:
			b.close(now)
			return BreakerChange{From: policy.BreakerHalfOpen, To: policy.BreakerClosed}
		case policy.Failure:
			b.open(now)
			return BreakerChange{From: policy.BreakerHalfOpen, To: policy.BreakerOpen}
		default:
			b.probesOut = max(b.probesOut-1, 0)
		}
	}
	return BreakerChange{}
}

// Isolate moves the breaker to BreakerIsolated at now, from any state, and
// returns the change (none when it is isolated already). Calls admitted
// before it are of an earlier generation: they finish, and Done ignores
// them.
func (b *Breaker) Isolate(now time.Time) BreakerChange {
	if b == nil {
		return BreakerChange{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	from := b.state
	if from == policy.BreakerIsolated {
		return BreakerChange{}
	}
	if from == policy.BreakerClosed && !b.manual {
		b.fold(now) // a period over before now is a sample of the host as it was
	}
	b.setState(policy.BreakerIsolated)
	return BreakerChange{From: from, To: policy.BreakerIsolated}
}

// Isolated reports whether the breaker is isolated, with one atomic load:
// the transport asks it before any gate, so that no gate's state moves for
// a call an operator refuses. A nil *Breaker is not isolated.
func (b *Breaker) Isolated() bool { return b != nil && b.isolated.Load() }

// Release ends an isolation at now: the breaker closes with an empty window
// and run, its baseline kept, and is back to its own rules. It returns the
// change, none when the breaker was not isolated (it is then left as it
// is).
func (b *Breaker) Release(now time.Time) BreakerChange {
	if b == nil {
		return BreakerChange{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != policy.BreakerIsolated {
		return BreakerChange{}
	}
	b.close(now)
	return BreakerChange{From: policy.BreakerIsolated, To: policy.BreakerClosed}
}

// Reset closes an open or half-open breaker at now with an empty window and
// run, its baseline kept, and returns the change. A closed breaker is left
// as it is, window and all, and so is an isolated one: only Release ends
// an isolation. An opening whose time has run out is closed from open (the
// move to half-open had not been made).
func (b *Breaker) Reset(now time.Time) BreakerChange {
	if b == nil {
		return BreakerChange{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	from := b.state
	if from != policy.BreakerOpen && from != policy.BreakerHalfOpen {
		return BreakerChange{}
	}
	b.close(now)
	return BreakerChange{From: from, To: policy.BreakerClosed}
}

// State returns the breaker's state at now. It reports half-open once the
// opening has run out, though the move itself is made (and reported) by
// the next Allow.
func (b *Breaker) State(now time.Time) policy.BreakerState {
	if b == nil {
		return policy.BreakerClosed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == policy.BreakerOpen && !now.Before(b.openUntil) {
		return policy.BreakerHalfOpen
	}
	return b.state
}

// Rate returns the window's failure rate at now with the baseline and the
// trip point.
func (b *Breaker) Rate(now time.Time) BreakerRate {
	if b == nil {
		return BreakerRate{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.manual {
		return BreakerRate{}
	}
	if b.state == policy.BreakerClosed {
		b.fold(now)
	}
	var sums [breakerCounters]uint64
	b.win.Sums(now, sums[:])
	r := BreakerRate{
		Calls:         sums[breakerCalls],
		Failures:      sums[breakerFailures],
		TripPoint:     b.tripPoint(),
		Baseline:      b.baseline,
		BaselineKnown: b.samples > 0,
		MinCalls:      int(b.minCalls),
	}
	if r.Calls > 0 {
		r.ErrorRate = float64(r.Failures) / float64(r.Calls)
	}
	return r
}

// relativeTrip returns the relative trip point. b.mu is held.
func (b *Breaker) relativeTrip() float64 {
	if b.samples == 0 {
		return WarmupTrip
	}
	return RelativeTrip(b.baseline)
}

// RelativeTrip is the relative trip point for a baseline failure rate:
// breakerTripFactor times it, within [breakerTripFloor, breakerTripCeiling].
// A key's lanes judge a lane by the same rule, the other lanes' rate as its
// baseline.
func RelativeTrip(baseline float64) float64 {
	return min(breakerTripCeiling, max(breakerTripFloor, breakerTripFactor*baseline))
}

// tripPoint returns the lower of the relative trip point and FailureRatio
// when set. b.mu is held.
func (b *Breaker) tripPoint() float64 {
	t := b.relativeTrip()
	if b.ratio > 0 {
		t = min(t, b.ratio)
	}
	return t
}

// shouldTrip reports whether the window, just after a failure, trips the
// breaker. b.mu is held and the breaker is closed.
func (b *Breaker) shouldTrip(now time.Time) bool {
	if b.consecutive > 0 && b.run >= b.consecutive {
		return true
	}
	var sums [breakerCounters]uint64
	b.win.Sums(now, sums[:])
	calls, failures := sums[breakerCalls], sums[breakerFailures]
	// runTrip is never below breakerRunMin: a shorter run is no trip
	// whatever the rates, and needs no logarithm.
	if b.consecutive == 0 && b.run >= breakerRunMin && b.run >= b.runTrip(calls, failures) {
		return true
	}
	if calls < b.minCalls {
		return false
	}
	// A FailureRatio the user named is read as written; the bounds guard
	// only the trip point the breaker derives.
	if b.ratio > 0 && float64(failures)/float64(calls) >= b.ratio {
		return true
	}
	if failures < 2 {
		return false
	}
	return wilsonLower(float64(failures), float64(calls), breakerConfidence) > b.relativeTrip()
}

// runTrip returns the length of a run of failures that trips the breaker
// under the run rule, given the window's sums. b.mu is held.
func (b *Breaker) runTrip(calls, failures uint64) int {
	p := b.baseline
	if b.samples == 0 {
		// No baseline yet: the window's own rate outside the run, at
		// its upper bound, so that a few lucky calls do not make a
		// flaky host look healthy.
		run := uint64(b.runAll)
		p = breakerRunPrior
		if calls > run {
			p = wilsonUpper(float64(failures-min(failures, run)), float64(calls-run), breakerRunConfidence)
		}
	}
	return runLength(p)
}

// runLength returns the fewest failures in a row that are less likely than
// breakerRunOdds for a dependency failing at rate p, within
// [breakerRunMin, breakerRunMax].
func runLength(p float64) int {
	if p >= 1 || p != p {
		return breakerRunMax
	}
	if p <= 0 {
		return breakerRunMin
	}
	k := math.Ceil(math.Log(breakerRunOdds) / math.Log(p))
	return int(min(max(k, breakerRunMin), breakerRunMax))
}

// wilsonLower and wilsonUpper return the bounds of the Wilson score
// interval at z for f successes of n trials; n must be positive.
func wilsonLower(f, n, z float64) float64 {
	c, h := wilson(f, n, z)
	return max(c-h, 0)
}

func wilsonUpper(f, n, z float64) float64 {
	c, h := wilson(f, n, z)
	return min(c+h, 1)
}

// wilson returns the centre and the half-width of the Wilson interval.
func wilson(f, n, z float64) (centre, half float64) {
	p, z2 := f/n, z*z
	d := 1 + z2/n
	return (p + z2/(2*n)) / d, z * math.Sqrt(p*(1-p)/n+z2/(4*n*n)) / d
}

// fold ends the baseline period if it is over, taking its failure rate as a
// sample (see sample). A period with too few outcomes goes on. b.mu is
// held and the breaker is closed.
func (b *Breaker) fold(now time.Time) {
	if now.Sub(b.periodStart) < b.slice || b.periodCalls < b.minCalls {
		return
	}
	b.sample()
	b.startPeriod(now)
}

// sample folds the period's failure rate, clamped to the trip point, into
// the baseline, if the period holds MinCalls outcomes. Before there is a
// baseline, a period above the warm-up trip point is no sample: a host
// failing from the start is not learned as normal. b.mu is held.
func (b *Breaker) sample() {
	if b.periodCalls < b.minCalls {
		return
	}
	rate := float64(b.periodFailures) / float64(b.periodCalls)
	if b.samples == 0 && rate > b.tripPoint() {
		return
	}
	rate = min(rate, b.tripPoint())
	b.samples = min(b.samples+1, breakerBaselineSamples)
	b.baseline += (rate - b.baseline) / float64(b.samples)
}

func (b *Breaker) startPeriod(now time.Time) {
	b.periodStart, b.periodCalls, b.periodFailures = now, 0, 0
}

// setState moves to s and starts a new generation. b.mu is held.
func (b *Breaker) setState(s policy.BreakerState) {
	b.state = s
	b.gen++
	b.run, b.runAll = 0, 0
	b.probesOut = 0
	b.isolated.Store(s == policy.BreakerIsolated)
	if s == policy.BreakerClosed {
		b.closedGen.Store(b.gen)
	} else {
		b.closedGen.Store(0)
	}
}

// open opens the breaker at now, for a jittered opening whose length grows
// with the time since b.failedAt (see breakerOpenShare). The period being
// tallied ended in a trip: it is a sample if it holds enough outcomes. b.mu
// is held.
func (b *Breaker) open(now time.Time) {
	if b.state == policy.BreakerClosed {
		// The run that tripped is what was improbable: the rest of the
		// period is what the host was like before it.
		run := uint64(b.runAll)
		b.periodCalls -= min(run, b.periodCalls)
		b.periodFailures -= min(run, b.periodFailures)
		b.sample()
	}
	b.setState(policy.BreakerOpen)
	d := b.openFor
	if b.firstOpenFor >= 0 {
		grown := time.Duration(float64(now.Sub(b.failedAt)) * breakerOpenShare)
		d = min(max(grown, b.firstOpenFor), b.openFor)
	}
	u := float64(b.rng.Uint64()>>11) * 0x1p-53 // uniform in [0, 1)
	b.openUntil = now.Add(d + time.Duration(u*breakerJitter*float64(d)))
	b.startPeriod(now)
}

// close closes the breaker at now with an empty window; the baseline is
// kept. b.mu is held.
func (b *Breaker) close(now time.Time) {
	b.setState(policy.BreakerClosed)
	if b.manual {
		return
	}
	b.win = estimator.NewCounters(b.window, breakerCounters, now)
	b.startPeriod(now)
}
