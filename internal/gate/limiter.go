package gate

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/resilix/resilix/estimator"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// The limit's control law; see Limiter, and docs/limiter.md for the
// reasoning and the cases behind each number.
const (
	// limTolerance: latency may reach this multiple of the baseline before
	// the limit shrinks; the mean of a round of limMinRound exponential
	// service times deviates by 22%, so 1.5 is over two deviations away.
	limTolerance = 1.5
	// limMinGradient: one round shrinks the limit at most by half, so one
	// outlier round cannot collapse it.
	limMinGradient = 0.5
	// limNoFall: a trial whose latency did not fall while the concurrency
	// fell by 1 − 1/limNoFall (a fifth) or more is decisive (see judge): a
	// congested round's mean varies far less than a fifth.
	limNoFall = 1.25
	// limMinRound: a round holds at least this many samples, enough for
	// its mean to tell a queue from noise.
	limMinRound = 20
	// limBaselineTau is the time constant of the baseline's moving
	// average: slow, so that sustained queueing within the tolerance
	// creeps it up only slowly.
	limBaselineTau = 30 * time.Second
	// limMixWindow is the history of the per-priority mix.
	limMixWindow = 10 * time.Second
	// limLightSlack is how many sheds a bucket may owe while it spares
	// the tenants below their fair share: the bucket still sheds its
	// share, at most this many arrivals late.
	limLightSlack = 4
	// limSlowStartExit: slow start ends at a round whose latency reaches
	// this multiple of the baseline, below limTolerance so that it ends
	// one doubling before the law would shrink.
	limSlowStartExit = 1.25
	// limSlowStartLoss: slow start ends at a round with more than this
	// share of failures: fast errors would otherwise look like room, and a
	// tenth allows for a dependency's usual errors.
	limSlowStartLoss = 0.1
)

// Limiter is the runtime state of a policy.Limiter, one per scope: a
// concurrency limit learned from latency, in the gradient family of
// Netflix's concurrency-limits (Gradient2,
// https://github.com/Netflix/concurrency-limits) and Envoy's adaptive
// concurrency filter (gradient controller,
// https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_filters/adaptive_concurrency_filter),
// with a bounded priority queue in front of it. docs/limiter.md has the
// reasoning behind each choice, how the anchors differ, and the cases that
// settled them.
//
// # The limit
//
// Release learns from each attempt's latency, dispatch to headers: a
// Success's as it is, a Failure's as at least the baseline (a timeout is
// slow, a fast refusal says nothing about queueing), Canceled and
// Discarded not at all. At the end of each round of max(limit,
// limMinRound) samples, about one round trip at full use, with short the
// round's mean and baseline the latency of the dependency when it is not
// queueing:
//
//	gradient = clamp(limTolerance × baseline / short, limMinGradient, 1)
//	limit    = gradient × limit + (used ? sqrt(limit) : 0)
//
// within [MinLimit, MaxLimit]. Scaling by baseline / short undoes a queue
// the limit causes (Little's law); the headroom sqrt(limit) is Envoy's,
// and the limit settles where the queueing it causes equals it. A round is
// used when in-flight reached half the limit during it: a limit far above
// use is no evidence that more would be fine, so it does not grow while
// idle, and hedging, which raises in-flight, cannot shrink it.
//
// The baseline is a moving average of round means (limBaselineTau),
// started by the first round, which changes nothing else. A round below
// half the baseline pulls it halfway down at once; a congested round
// (short > limTolerance × baseline) that was used, with the limit above
// MinLimit, is not learned: it may be our own queueing.
//
// # Slow start
//
// The limiter starts in slow start (RFC 5681, section 3.1), and starts it
// again after policy.Limiter.SlowStartIdle with no call admitted at half
// the limit or more. A round is then judged on the calls admitted under
// the limit it judges (after it last changed, and once in-flight reached
// it, from that instant). A round that reached the limit, with short below
// limSlowStartExit × baseline and at most limSlowStartLoss of its calls
// failed, grows the limit, less as the latency rose (as HyStart++, RFC
// 9406), within MaxLimit:
//
//	limit = limit + round(limit × min(1, (limSlowStartExit − short/baseline) / (limSlowStartExit − 1)))
//
// The first round that reached the limit and fails the test ends slow
// start as an ordinary round without headroom: the gradient alone, no
// halving.
//
// # A shrink is on trial
//
// A latency the limit cannot relieve (the dependency slowing for everyone,
// the client's own CPU and scheduling) is not a queue the limit causes, so
// a shrink is tested by the next round, made only of calls admitted after
// it; nothing else changes the limit meanwhile. With peak the most calls
// in flight during a round and conc the mean in-flight count its calls
// found when admitted,
//
//	r     = (mean / mean(cause)) / (peak / peak(cause))
//	rConc = (mean / mean(cause)) / (conc / conc(cause))
//
// the shrink stands if it bound (an arrival found the lower limit reached
// where the old one would have admitted it) and the latency followed the
// concurrency: r within [1/limTolerance, limTolerance], or, when the
// trial's calls were admitted at a higher concurrency than the cause's,
// rConc within it. Otherwise it is undone, and when the evidence is
// decisive (r and rConc both above limTolerance; a latency that did not
// fall, with r and rConc both at least limNoFall; or a shrink that bound nobody while in-flight stayed below half the
// restored limit) a round above the tolerance becomes the baseline at once.
// So refused callers that come straight back, whose CPU raises the latency
// as the limit falls, cannot drive the limit down.
//
// # The queue
//
// When the limit is reached, a call may wait, in a queue of
// ceil(QueueFactor × limit) places (0.5 × limit by default, the SRE book's
// "50% or less" of capacity, chapter 22; none when QueueFactor is
// negative). A freed slot goes to the highest-priority waiter, first come
// first served within a priority. At a full queue, an arrival evicts the
// lowest-priority waiter if it outranks it: if it has a higher priority, or
// the same priority and a tenant that is lighter, where the waiter's is
// above its fair share. Among the lowest-priority waiters the victim is the
// one whose tenant is furthest above its fair share, then the newest. An
// evicted waiter is refused (LimiterEvicted). When the limit shrinks, the
// queue shrinks with it, evicting in the same order. A wait lasts at most
// until ctx is done (the caller's deadline or cancellation); no timer of
// its own runs.
//
// # Shedding by priority
//
// Pressure is the queue's fill: waiting / places, 1 when the queue is full,
// or when there is none and the limit is reached. An arrival that finds the
// limit reached and room in the queue is shed before it queues with
// probability shedding.Split(pressure, mix)[priority], where mix is the
// arrivals per priority over limMixWindow: Bulk first, then BestEffort,
// then Degraded. Critical is never shed before the queue is full (the queue
// is there to absorb its bursts; a full queue is when the limiter would
// refuse everything anyway), so an untagged workload gets a classic
// limiter. The draw is deterministic: each bucket accrues its probability
// per arrival and sheds one arrival each time the sum reaches 1, which
// sheds the exact fraction with no randomness.
//
// # Tenants
//
// Tenant admissions are tracked over 30 s by a tenant.Tracker of default
// capacity (fixed memory, whatever the number of ids), the scope's, shared
// with the throttler and allocated by the first call that names a tenant
// (see Tenants). A waiter's tenant
// excess is taken when it starts waiting and orders evictions as above.
//
// # Using it
//
// Acquire admits a call or refuses it; an admitted call must be released
// once with Release, passing the attempt's latency from dispatch to
// response headers and its outcome. The transport should release when the
// response headers (or the error) arrive, not when the body is closed: the
// limit is on what the dependency is working on, the latency it learns from
// is measured to headers, and a caller that reads a body slowly would
// otherwise hold slots, inflate the in-flight count the tether reads, and
// teach the limiter its own pace. The bulkhead is what bounds bodies.
//
// Release returns the limit change it made, if any, for the caller to
// report after it returns, with no lock held; nothing is called back.
// Acquire does not allocate when it admits at once; a call that waits
// allocates its place in the queue. Acquire and Release do not allocate
// otherwise. A refusal is reported to the caller as ErrShed, except that a
// wait ended by the caller's own context returns the context's error.
//
// A nil *Limiter is a limiter that is off: it admits everything. An
// Limiter is safe for concurrent use; each method holds one mutex
// briefly.
type Limiter struct {
	minLimit, maxLimit float64
	queueFactor        float64
	idleRestart        time.Duration // < 0: no slow start
	mix                *estimator.Counters
	tenants            *Tenants

	mu       sync.Mutex
	limit    float64
	inflight int
	peak     int // the most in flight during the round
	roundN   int
	roundSum float64 // seconds
	// roundConc sums, over the round's samples, the in-flight count each
	// call found when it was admitted, itself included.
	roundConc float64
	roundFail int     // the round's Failure samples
	baseline  float64 // seconds; 0 until the first round ends
	learned   time.Time
	// slow is true in slow start; busy is the last time a call was
	// admitted with in-flight at half the limit or more, or found the
	// limit reached.
	slow bool
	busy time.Time
	// seq counts admissions; at is the instant of the last one, and
	// atSeq the seq of the first admitted at that instant. While a shrink
	// is on trial, or in slow start, a round counts only calls whose seq
	// is above countFrom: those admitted after the limit last changed, and
	// in slow start, once the changed limit has been reached (filled), from
	// the instant it was.
	seq, atSeq, countFrom uint64
	at                    time.Time
	filled                bool
	// A shrink on trial: its verdict is the next round of calls admitted
	// after it. trialFrom is the limit before it;
	// causeMean, causePeak and causeConc are the mean latency, the peak
	// in-flight and the mean in-flight at admission of the round that
	// caused it; trialPeak is the most in flight when a
	// call of the trial round was admitted; bound records whether the
	// lower limit held back an arrival the old one would have let in.
	trial     bool
	trialFrom float64
	causeMean float64 // seconds
	causePeak int
	causeConc float64
	trialPeak int
	bound     bool
	queue     [shedding.NumPriorities]waitList
	waiting   int
	debt      [shedding.NumPriorities]float64 // shedding accrued per bucket
}

// NewLimiter returns the runtime state of cfg at its InitialLimit,
// with nothing in flight. cfg must be valid (Set.Validate checks it).
// tenants is the scope's tenant tracker, shared with its throttler.
func NewLimiter(cfg policy.Limiter, now time.Time, tenants *Tenants) *Limiter {
	return &Limiter{
		minLimit:    float64(cfg.MinLimit),
		maxLimit:    float64(cfg.MaxLimit),
		queueFactor: cfg.QueueFactor,
		idleRestart: cfg.SlowStartIdle,
		slow:        cfg.SlowStartIdle >= 0,
		mix:         estimator.NewCounters(limMixWindow, shedding.NumPriorities, now),
		tenants:     tenants,
		limit:       float64(cfg.InitialLimit),
	}
}

// LimiterPermit is what Acquire hands an admitted call, to be given back to
// Release exactly once. It is a small value; the zero LimiterPermit holds
// nothing and Release ignores it.
type LimiterPermit struct {
	held bool
	conc int32  // in flight when it was admitted, itself included
	seq  uint64 // its admission's number (Limiter.seq)
}

// LimiterReason says why Acquire refused a call.
type LimiterReason uint8

const (
	// LimiterFull: the limit was reached and the queue was full (or there
	// is none) with no waiter the call outranks.
	LimiterFull LimiterReason = iota + 1
	// LimiterShed: shed by priority before queueing, under pressure.
	LimiterShed
	// LimiterEvicted: the call waited and was evicted, by an arrival that
	// outranked it or because the limit, and with it the queue, shrank.
	LimiterEvicted
	// LimiterCanceled: ctx was done before a slot was free. This is the
	// caller's own cancellation or deadline, not a refusal.
	LimiterCanceled
)

var limiterReasonNames = [...]string{"", "full", "shed", "evicted", "canceled"}

// String returns "full", "shed", "evicted" or "canceled".
func (r LimiterReason) String() string {
	if int(r) < len(limiterReasonNames) && r != 0 {
		return limiterReasonNames[r]
	}
	return "limiter_reason(" + strconv.Itoa(int(r)) + ")"
}

// LimiterDecision is Acquire's answer.
type LimiterDecision struct {
	// OK is true when the call is admitted.
	OK bool
	// Reason says why it was not.
	Reason LimiterReason
	// waited is true when the call waited in the queue.
	waited bool
	// HeavyTenant is true, on a refusal, when the call's tenant was above
	// its fair share.
	HeavyTenant bool
}

// Waited reports whether the call waited in the queue: when it did not,
// it was admitted or refused at the now given to Acquire, and the caller
// need not read the clock again.
func (d LimiterDecision) Waited() bool { return d.waited }

// LimitChange is a change of the limit made by Release, for the caller to
// report. The zero value, like any value with From == To, is no change.
type LimitChange struct {
	From, To int
}

// Changed reports whether c is a change of the limit.
func (c LimitChange) Changed() bool { return c.From != c.To }

// waiter is a call waiting in the queue.
type waiter struct {
	prio       shedding.Priority
	excess     float64 // its tenant's, when it started waiting
	seq        uint64  // its admission's number, when it was handed a slot
	conc       int32   // in flight when it was handed a slot, itself included
	ready      chan bool
	prev, next *waiter
	queued     bool
}

// waitList is the FIFO of one priority's waiters.
type waitList struct {
	head, tail *waiter
}

// Acquire admits a call of priority prio for tenantID (empty for none) at
// now, or refuses it. An invalid priority counts as Critical.
//
// Below the limit, with nobody waiting, it admits at once. Otherwise the
// call may be shed by priority, or wait in the queue until a slot is handed
// to it, it is evicted, or ctx is done; see Limiter. When d.OK, the
// caller must call Release once with p.
func (l *Limiter) Acquire(ctx context.Context, now time.Time, prio shedding.Priority, tenantID string) (p LimiterPermit, d LimiterDecision) {
	return l.acquire(ctx, true, now, prio, tenantID)
}

// TryAcquire is Acquire for a call that never waits: at the limit, it is
// refused (LimiterFull) where Acquire would queue it, as when the call's
// context is already done.
func (l *Limiter) TryAcquire(now time.Time, prio shedding.Priority, tenantID string) (p LimiterPermit, d LimiterDecision) {
	return l.acquire(nil, false, now, prio, tenantID)
}

// acquire is Acquire, or with mayWait false TryAcquire, whose ctx is nil.
func (l *Limiter) acquire(ctx context.Context, mayWait bool, now time.Time, prio shedding.Priority, tenantID string) (p LimiterPermit, d LimiterDecision) {
	if l == nil {
		return LimiterPermit{}, LimiterDecision{OK: true}
	}
	if !prio.Valid() {
		prio = shedding.Critical
	}
	l.mix.Add(now, int(prio), 1)
	l.mu.Lock()
	if l.waiting == 0 && l.inflight < l.current() {
		if 2*(l.inflight+1) >= l.current() {
			l.markBusy(now)
		}
		l.take(now)
		p := LimiterPermit{held: true, conc: int32(l.inflight), seq: l.seq}
		l.mu.Unlock()
		if tenantID != "" {
			l.tenants.tracker(now).Add(now, tenantID)
		}
		return p, LimiterDecision{OK: true}
	}
	return l.wait(ctx, mayWait, now, prio, tenantID)
}

// wait is acquire's slow path: the limit is reached. l.mu is held, and
// released. With mayWait false, a call that would queue is refused.
func (l *Limiter) wait(ctx context.Context, mayWait bool, now time.Time, prio shedding.Priority, tenantID string) (LimiterPermit, LimiterDecision) {
	excess := 0.0 // no tenant: neutral
	if tenantID != "" {
		excess = l.tenants.tracker(now).Excess(now, tenantID)
	}
	refuse := LimiterDecision{HeavyTenant: excess > 0}
	l.markBusy(now)
	if l.trial && l.inflight < int(l.trialFrom) {
		l.bound = true // the shrink on trial holds this call back
	}
	if !mayWait {
		l.mu.Unlock()
		refuse.Reason = LimiterFull
		return LimiterPermit{}, refuse
	}
	if ctx.Err() != nil {
		l.mu.Unlock()
		refuse.Reason = LimiterCanceled
		return LimiterPermit{}, refuse
	}
	places := l.places()
	switch {
	case l.waiting < places:
		if prio != shedding.Critical && l.waiting > 0 && l.shed(now, prio, places, excess) {
			l.mu.Unlock()
			refuse.Reason = LimiterShed
			return LimiterPermit{}, refuse
		}
	default:
		v := l.victim()
		if v == nil || !outranks(prio, excess, v) {
			l.mu.Unlock()
			refuse.Reason = LimiterFull
			return LimiterPermit{}, refuse
		}
		l.evict(v)
	}
	w := &waiter{prio: prio, excess: excess, ready: make(chan bool, 1)}
	l.push(w)
	l.mu.Unlock()

	refuse.waited = true
	select {
	case ok := <-w.ready:
		if !ok {
			refuse.Reason = LimiterEvicted
			return LimiterPermit{}, refuse
		}
	case <-ctx.Done():
		l.mu.Lock()
		if w.queued {
			l.unlink(w)
			l.mu.Unlock()
			refuse.Reason = LimiterCanceled
			return LimiterPermit{}, refuse
		}
		l.mu.Unlock()
		// Handed a slot or evicted as ctx ended: the answer is already
		// in the channel. A slot goes back at once.
		if <-w.ready {
			l.mu.Lock()
			l.inflight--
			l.dispatch(now)
			l.mu.Unlock()
		}
		refuse.Reason = LimiterCanceled
		return LimiterPermit{}, refuse
	}
	if tenantID != "" {
		l.tenants.tracker(now).Add(now, tenantID)
	}
	return LimiterPermit{held: true, conc: w.conc, seq: w.seq}, LimiterDecision{OK: true, waited: true}
}

// markBusy records that the limit is in use at now, and starts slow start
// again if it had been idle, unused for longer than idleRestart. l.mu is
// held.
func (l *Limiter) markBusy(now time.Time) {
	if l.idleRestart >= 0 && now.Sub(l.busy) > l.idleRestart && !l.slow {
		l.slow, l.filled = true, false
	}
	l.busy = now
}

// shed reports whether an arrival of priority prio (not Critical) is shed
// before queueing, at the current queue fill. l.mu is held.
func (l *Limiter) shed(now time.Time, prio shedding.Priority, places int, excess float64) bool {
	var sums [shedding.NumPriorities]uint64
	l.mix.Sums(now, sums[:])
	var mix [shedding.NumPriorities]float64
	for b := range mix {
		mix[b] = float64(sums[b])
	}
	q := shedding.Split(float64(l.waiting)/float64(places), mix)[prio]
	l.debt[prio] += q
	// A shed that falls due on a tenant below its fair share is left for
	// the heavy ones that follow, until limLightSlack sheds are owed:
	// within a bucket the heavy tenants are shed first, and the bucket
	// still sheds its share, at most limLightSlack arrivals late.
	if l.debt[prio] < 1 || (excess < 0 && l.debt[prio] < 1+limLightSlack) {
		return false
	}
	l.debt[prio]--
	return true
}

// outranks reports whether an arrival of priority prio and tenant excess
// may evict v from a full queue.
func outranks(prio shedding.Priority, excess float64, v *waiter) bool {
	return prio < v.prio || (prio == v.prio && v.excess > 0 && v.excess > excess)
}

// Release gives back a permit from Acquire at now, with the attempt's
// latency from dispatch to response headers and its outcome, hands the
// freed slot to the highest-priority waiter, and returns the change of the
// limit it made, if any. Canceled and Discarded outcomes, and latencies of
// zero or less, teach the limit nothing.
func (l *Limiter) Release(p LimiterPermit, now time.Time, latency time.Duration, o policy.Outcome) LimitChange {
	if l == nil || !p.held {
		return LimitChange{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight = max(l.inflight-1, 0)
	var c LimitChange
	if o.Evidence() && latency > 0 {
		c = l.sample(now, latency.Seconds(), o, p)
	}
	l.dispatch(now)
	return c
}

// sample adds the latency x (seconds) of the call p admitted to the round
// and ends the round when it is complete. While a shrink is on trial, or in
// slow start, only calls admitted under the current limit count. l.mu is
// held.
func (l *Limiter) sample(now time.Time, x float64, o policy.Outcome, p LimiterPermit) LimitChange {
	if (l.trial || l.slow) && p.seq <= l.countFrom {
		return LimitChange{}
	}
	if o == policy.Failure {
		if l.baseline == 0 {
			return LimitChange{}
		}
		x = max(x, l.baseline)
		l.roundFail++
	}
	l.roundN++
	l.roundSum += x
	l.roundConc += float64(p.conc)
	if l.roundN < max(l.current(), limMinRound) {
		return LimitChange{}
	}
	short := l.roundSum / float64(l.roundN)
	conc := l.roundConc / float64(l.roundN)
	used := 2*l.peak >= l.current()
	from := l.current()
	if l.trial {
		l.judge(now, short, conc, used)
	} else {
		l.update(now, short, conc, used)
	}
	l.roundN, l.roundSum, l.roundConc, l.roundFail, l.peak = 0, 0, 0, 0, l.inflight
	if l.current() != from {
		l.countFrom, l.filled = l.seq, false
	}
	return LimitChange{From: from, To: l.current()}
}

// update applies the control law at the end of a round whose mean latency
// was short (seconds). A shrink is put on trial. l.mu is held.
func (l *Limiter) update(now time.Time, short, conc float64, used bool) {
	if l.baseline == 0 {
		l.baseline, l.learned = short, now
		return
	}
	gradient := min(max(limTolerance*l.baseline/short, limMinGradient), 1)
	next := gradient * l.limit
	// Slow start is decided by a round that reached the limit: it doubles
	// it, or ends slow start and is an ordinary round.
	reached := l.slow && l.peak >= l.current()
	switch {
	case reached && short < limSlowStartExit*l.baseline && float64(l.roundFail) <= limSlowStartLoss*float64(l.roundN):
		next += math.Round(l.limit * min(1, (limSlowStartExit-short/l.baseline)/(limSlowStartExit-1))) // gradient is 1
	case reached:
		l.slow = false // and no headroom: the doubling overshot
	case used:
		next += math.Sqrt(l.limit)
	}
	from := l.limit
	l.limit = min(max(next, l.minLimit), l.maxLimit)

	if short > limTolerance*l.baseline && used && from > l.minLimit {
		l.learned = now // maybe our own queueing: not learned
	} else {
		l.learn(now, short)
	}
	if l.current() < int(from) {
		l.trial, l.trialFrom, l.bound = true, from, false
		l.causeMean, l.causePeak, l.causeConc, l.trialPeak = short, l.peak, conc, 0
	}
}

// judge ends the trial of a shrink with the round of calls admitted after
// it, whose mean latency was short (seconds) and mean concurrency at
// admission conc. Queueing the limit causes moves latency with the
// concurrency, so with
//
//	r     = (short / causeMean) / (trialPeak / causePeak)
//	rConc = (short / causeMean) / (conc / causeConc)
//
// the shrink stands if it held calls back and either the latency fell with
// r within the tolerance of 1, or the concurrency at admission rose (the
// cause round was a ramp) with rConc within it: then the round is an
// ordinary one. Otherwise it is undone, and a round still above the
// tolerance becomes the baseline, as a latency the limit cannot relieve,
// if the evidence is decisive (see decisive) or if the
// shrink held nobody back with in-flight below half the limit restored
// (the dependency is slow whatever we do). A latency that fell far more
// steeply than the concurrency (the end of a stall), did not fall (noise
// near where the limit settles, or more demand) or was not held back by a
// limit in use teaches what an ordinary round would. l.mu is held.
func (l *Limiter) judge(now time.Time, short, conc float64, used bool) {
	l.trial = false
	r := (short / l.causeMean) / (float64(l.trialPeak) / float64(l.causePeak))
	rConc := (short / l.causeMean) / (conc / l.causeConc)
	within := func(r float64) bool { return r >= 1/limTolerance && r <= limTolerance }
	if l.bound && (short < l.causeMean && within(r) || conc > l.causeConc && within(rConc)) {
		l.update(now, short, conc, used)
		return
	}
	l.limit = l.trialFrom
	used = 2*l.peak >= l.current()
	congested := short > limTolerance*l.baseline
	switch {
	case congested && (l.bound && decisive(short/l.causeMean, r, rConc) || !l.bound && !used):
		l.baseline, l.learned = short, now
	case congested && used:
		l.learned = now
	default:
		l.learn(now, short)
	}
}

// decisive reports whether a trial whose latency moved by the factor lat
// while the concurrency fell, with r and rConc as in judge, is decisive
// evidence that the latency is not a queue the limit can relieve: it did
// not follow the concurrency, by far (r and rConc above the tolerance), or
// it did not fall at all though the concurrency fell by a fifth or more
// by both measures (r and rConc at least limNoFall).
func decisive(lat, r, rConc float64) bool {
	return r > limTolerance && rConc > limTolerance || lat >= 1 && r >= limNoFall && rConc >= limNoFall
}

// learn moves the baseline toward a round mean short (seconds): halfway at
// once when short is below half of it, by the moving average otherwise.
// l.mu is held.
func (l *Limiter) learn(now time.Time, short float64) {
	if short < l.baseline/2 {
		l.baseline = (l.baseline + short) / 2
	} else if dt := now.Sub(l.learned); dt > 0 {
		alpha := -math.Expm1(-float64(dt) / float64(limBaselineTau))
		l.baseline += alpha * (short - l.baseline)
	}
	l.learned = now
}

// current returns the limit as a number of calls. l.mu is held.
func (l *Limiter) current() int { return int(l.limit) }

// places returns the queue's size at the current limit. l.mu is held.
func (l *Limiter) places() int {
	if l.queueFactor <= 0 {
		return 0
	}
	return int(math.Ceil(l.queueFactor * float64(l.current())))
}

// take admits one call at now. In slow start, the first call that
// reaches a limit since it changed starts the round afresh, with the calls
// admitted from that instant on. l.mu is held.
func (l *Limiter) take(now time.Time) {
	l.inflight++
	l.seq++
	if !now.Equal(l.at) {
		l.at, l.atSeq = now, l.seq
	}
	l.peak = max(l.peak, l.inflight)
	if l.trial {
		l.trialPeak = max(l.trialPeak, l.inflight)
	} else if l.slow && !l.filled && l.inflight >= l.current() {
		l.filled, l.countFrom = true, l.atSeq-1
		l.roundN, l.roundSum, l.roundConc, l.roundFail = 0, 0, 0, 0
	}
}

// dispatch hands free slots to waiters at now, highest priority first, and
// trims the queue to its size. l.mu is held.
func (l *Limiter) dispatch(now time.Time) {
	for l.waiting > 0 && l.inflight < l.current() {
		w := l.first()
		l.unlink(w)
		l.take(now)
		w.seq, w.conc = l.seq, int32(l.inflight)
		w.ready <- true
	}
	for places := l.places(); l.waiting > places; {
		l.evict(l.victim())
	}
}

// push queues w at the tail of its priority. l.mu is held.
func (l *Limiter) push(w *waiter) {
	q := &l.queue[w.prio]
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	w.queued = true
	l.waiting++
}

// unlink takes w out of the queue. l.mu is held.
func (l *Limiter) unlink(w *waiter) {
	q := &l.queue[w.prio]
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	w.queued = false
	l.waiting--
}

// evict refuses waiter w. l.mu is held.
func (l *Limiter) evict(w *waiter) {
	l.unlink(w)
	w.ready <- false
}

// first returns the waiter a free slot goes to: the oldest of the highest
// priority. l.mu is held and someone is waiting.
func (l *Limiter) first() *waiter {
	for b := range l.queue {
		if w := l.queue[b].head; w != nil {
			return w
		}
	}
	return nil
}

// victim returns the waiter to evict first: of the lowest priority, the one
// whose tenant is furthest above its fair share, then the newest. l.mu is
// held; nil when nobody waits.
func (l *Limiter) victim() *waiter {
	for b := len(l.queue) - 1; b >= 0; b-- {
		var v *waiter
		for w := l.queue[b].tail; w != nil; w = w.prev {
			if v == nil || w.excess > v.excess {
				v = w
			}
		}
		if v != nil {
			return v
		}
	}
	return nil
}

// Limit returns the current concurrency limit.
func (l *Limiter) Limit() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.current()
}

// InFlight returns the number of admitted calls not yet released.
func (l *Limiter) InFlight() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight
}

// Queued returns the number of calls waiting for a slot.
func (l *Limiter) Queued() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}

// Load returns the calls admitted and not yet released, the limit and the
// calls waiting for a slot, read together under one lock: what a server's
// load report says.
func (l *Limiter) Load() (inFlight, limit, queued int) {
	if l == nil {
		return 0, 0, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight, l.current(), l.waiting
}

// queueCapacity returns the number of places in the queue at the current
// limit: ceil(QueueFactor × limit), 0 when nothing waits.
func (l *Limiter) queueCapacity() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.places()
}

// Pressure returns the queue's fill, in [0, 1]: waiting / places, or, with
// no queue, 1 when the limit is reached and 0 otherwise.
func (l *Limiter) Pressure() float64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	places := l.places()
	if places == 0 {
		if l.inflight >= l.current() {
			return 1
		}
		return 0
	}
	return min(float64(l.waiting)/float64(places), 1)
}

// learnedBaseline returns the latency the limiter takes as the dependency's
// latency without queueing, and whether it has learned one yet.
func (l *Limiter) learnedBaseline() (time.Duration, bool) {
	if l == nil {
		return 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Duration(l.baseline * float64(time.Second)), l.baseline > 0
}

// RetryAfter estimates how long a call refused now would wait for a slot:
// the calls queued ahead of it and itself, served limit at a time at the
// learned baseline latency (Little's law), (queued + 1) × baseline / limit.
// It is zero until a baseline is learned. A server's refusal derives its
// Retry-After from it.
func (l *Limiter) RetryAfter() time.Duration {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.baseline == 0 {
		return 0
	}
	return time.Duration(float64(l.waiting+1) * l.baseline / float64(l.current()) * float64(time.Second))
}
