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

// The limit's control law; see Limiter.
const (
	// limTolerance: latency may reach this multiple of the baseline before
	// the limit shrinks.
	limTolerance = 1.5
	// limMinGradient: one round shrinks the limit at most by half.
	limMinGradient = 0.5
	// limNoFall: a trial whose latency did not fall while the concurrency
	// fell by 1 − 1/limNoFall (a fifth) or more is decisive (see judge).
	limNoFall = 1.25
	// limMinRound: a round holds at least this many samples.
	limMinRound = 20
	// limBaselineTau is the time constant of the baseline's moving
	// average.
	limBaselineTau = 30 * time.Second
	// limMixWindow is the history of the per-priority mix.
	limMixWindow = 10 * time.Second
	// limLightSlack is how many sheds a bucket may owe while it spares
	// the tenants below their fair share.
	limLightSlack = 4
	// limSlowStartExit: slow start ends at a round whose latency reaches
	// this multiple of the baseline.
	limSlowStartExit = 1.25
	// limSlowStartLoss: slow start ends at a round with more than this
	// share of failures.
	limSlowStartLoss = 0.1
)

// Limiter is the runtime state of a Limiter, one per scope: a
// concurrency limit learned from latency, in the gradient family of
// Netflix's concurrency-limits (Gradient2,
// https://github.com/Netflix/concurrency-limits) and Envoy's adaptive
// concurrency filter (gradient controller,
// https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_filters/adaptive_concurrency_filter),
// with a bounded priority queue in front of it.
//
// # The limit
//
// The limiter learns from the latency of completed attempts, passed to
// Release: Success latencies as they are; a Failure's latency only as at
// least the baseline (a timeout is a slow sample, but a fast refusal says
// nothing about queueing); Canceled and Discarded attempts teach nothing.
// Samples are gathered in rounds of max(limit, 20): at full use, a round is
// about one round trip, so the limit moves once per round trip, as a TCP
// congestion window does, whatever the traffic. At the end of a round, with
// short its mean latency and baseline the latency the dependency has when
// it is not queueing:
//
//	gradient = clamp(1.5 × baseline / short, 0.5, 1)
//	limit    = gradient × limit + (used ? sqrt(limit) : 0)
//
// kept within [MinLimit, MaxLimit], except in slow start, where a round
// of calls admitted at the limit, at the baseline's latency, doubles it
// (below). A limit that goes down is on trial (below). The choices, and
// why:
//
//   - Gradient rather than Vegas: Vegas (concurrency-limits' VegasLimit)
//     steps the limit by log10 amounts per sample and needs a no-load RTT
//     found by probing; the gradient scales the limit in proportion to how
//     far latency rose, which is the right response to a queue the limit
//     itself causes: its latency follows the concurrency (Little's law), so
//     scaling the concurrency by baseline / short brings it back.
//   - Tolerance 1.5: latency may rise 50% over the baseline before the
//     limit shrinks (Gradient2 uses none on an average baseline, Envoy's
//     buffer adds 25% to a minimum). The mean of a round of 20 exponential
//     service times has a standard deviation of 22% of the true mean, so
//     1.5 is over two standard deviations away: noise does not shrink the
//     limit, a queue does.
//   - Gradient clamped to [0.5, 1]: a round shrinks the limit at most by
//     half, so one outlier round cannot collapse it (Gradient2's clamp),
//     and the gradient never grows it (Envoy's may reach 2): growth comes
//     from the headroom only, which is tethered.
//   - Headroom sqrt(limit) per round (Envoy pins its headroom to the square
//     root of the limit; Netflix's first Gradient limit allowed a queue of
//     the square root too): fast from small limits, slower from large ones,
//     and, with the gradient, the limit settles where the queueing it
//     causes equals the headroom.
//   - Tethered growth: the headroom is added only when the round was used,
//     when in-flight reached at least half the limit at some point during
//     it (Gradient2 applies the same test to each sample). A limit far
//     above what is used is not evidence that more would be fine, so it
//     does not grow while idle. Because the tether keys off observed
//     concurrency, hedging cannot shrink the limit: at constant latency
//     more in flight buys more headroom, not less. It also keeps the limit
//     at about twice what is in use, so that one shrink, at most a half,
//     does not by itself hold back the calls in use.
//   - No smoothing: once a round (one round trip) is the unit, the update is
//     applied whole, as Envoy does per interval; Gradient2's smoothing of
//     0.2 is per sample.
//
// # Slow start
//
// A headroom of sqrt(limit) a round is slow to follow a step in demand from
// a small limit: from 20 to 400 takes about 30 rounds. A flash crowd of 400
// callers on a handler that sleeps 50 ms, with room for all of them, each
// refused caller back 50 ms later, has 63% of its requests admitted over
// its first 2 s and 97% over the second second with slow start off
// (TestFlashCrowdWithoutSlowStart in admission). So the limiter starts in
// slow start, as a TCP connection
// does (RFC 5681, section 3.1). In slow start a round is judged on the
// calls admitted under the limit it judges: those admitted after the limit
// last changed, and once in-flight has reached it (calls waited or were
// refused for lack of it), only those admitted from the instant it did,
// the round starting afresh there. A round that reached the limit, with
// its mean latency short below 1.25 × the baseline and no more than a tenth
// of its calls failed, grows the limit by as much as it was on a flat
// latency, and by less as the latency rose toward 1.25 ×, within MaxLimit:
//
//	limit = limit + round(limit × min(1, (1.25 − short/baseline) / 0.25))
//
// The crowd then has 86.6 to 92.6% of its requests admitted over the first
// 2 s and all of them over the second second (TestFlashCrowdIsAdmitted),
// the limit at 20, 24, 48, 96, 192, 384, 768. The first round that reached
// the limit and fails the test ends slow start, and is an ordinary round
// with no headroom: the gradient alone. Slow start starts again once the
// limit has been idle for policy.Limiter.SlowStartIdle (1 s by default): no
// call admitted with half the limit or more in flight (the tether's measure
// of use) and none that found it reached. The choices, and why, and where
// TCP differs:
//
//   - Judged on the doubled limit's calls: TCP grows its window on the
//     acknowledgements of the window it sent, which was in flight whole.
//     A round of whatever calls completed next mostly held calls admitted
//     under the old limit, at the old concurrency: 400 callers on 50
//     workers at 20 ms behind a FIFO doubled 97 to 195, 3.9 times the
//     workers. Counted from the limit's change, the first calls to complete
//     were those admitted as in-flight climbed to it, which find the
//     dependency's queue as the old limit left it: still 3.9 times. Counted
//     from the instant the limit is reached, the round is of calls admitted
//     at it (a burst admitted at that instant is at it together).
//   - Less the rise: a round at the limit whose latency rose is a sign
//     that the limit is near the dependency's capacity, so the doubling
//     tapers, from the whole limit at the baseline's latency to nothing at
//     the exit's 1.25 ×, as HyStart++ (RFC 9406) grows a quarter as fast
//     once the round trip time has risen. Little's law reads more into the
//     rise (a FIFO of C workers at L calls in flight answers in L/C times
//     its work, so 1.2 × says C is about L/1.2), but the first round of a
//     new limit sees the queue build, below where it settles: on 37
//     workers, 48 calls measured 1.23 × the baseline where L/C is 1.30,
//     and on a handler of capacity 20 a round of a limit of 29 measured
//     1.12 ×; adding L/1.12 took the limit to 55, 2.75 times the capacity,
//     in one run of 60 of admission's TestFlashCrowdOnAFixedCapacity
//     (TestLimiterSlowStartTapersWithTheRise). The taper adds 16 there.
//   - No headroom on the exit: the round that ends slow start is one past
//     the capacity, so the gradient takes the limit down and nothing is
//     added (on 50 workers the headroom took 96 to 101).
//
// On 50 FIFO workers at 20 ms, the crowd (10 callers for a second, then
// 400) takes the limit to 96, 1.9 times the workers, and it settles at 85;
// on 25 to 60 workers, it peaks at most at 2.18 times them
// (TestLimiterSlowStartOnAFIFO, TestLimiterSlowStartAcrossCapacities: a
// doubling goes on only below 1.25 × the baseline, from a limit of at most
// about 1.25 times the workers, and adds less the nearer it is). The other
// choices:
//
//   - Reached, not used: only a round that reached the limit doubles it,
//     so that the limit stays within twice the calls in flight, where the
//     tether keeps it; a demand that uses the limit without reaching it
//     grows it by sqrt(limit) as before. RFC 5681 grows the window with
//     every acknowledgement; RFC 7661 holds a window valid while at least
//     half of it is in use, the tether's test, with which a doubling would
//     take the limit to four times what is in flight.
//   - Latency, not loss, ends it, and below the tolerance: doubling the
//     limit on a dependency at its capacity doubles its latency (Little's
//     law), so the round that follows the doubling past the capacity shows
//     the rise. At 1.25 × the baseline, slow start ends one doubling
//     earlier than at the tolerance of 1.5 when the capacity lies between;
//     a noisy round that ends it early costs only the speed of growth,
//     never a shrink. TCP's slow start ends on a loss, or, with HyStart++
//     (RFC 9406), on a rise of the round's minimum RTT by an eighth,
//     clamped to 4 to 16 ms; a mean is noisier than a minimum, hence the
//     wider margin (the minimum is the bias the trial below is there for).
//   - Failures end it too, as a loss ends TCP's: the law takes a fast
//     failure's latency as the baseline, so a dependency that answers a
//     crowd with fast errors would otherwise look like one with room for
//     it. A tenth allows for a dependency's usual errors.
//   - No halving at the exit: TCP halves its window on the loss that ends
//     slow start (ssthresh). Here the rise is seen before anything is lost,
//     and the gradient, applied to the same round, takes the limit down by
//     as much as the latency rose, on trial as any shrink. On a handler
//     that serves 20 at a time (TestFlashCrowdOnAFixedCapacity) the limit
//     goes 20, 24, then 37 to 48 (2.4 times the capacity at most, in 100
//     runs), then to where it settles without slow start, 35 to 38; a flood on a FIFO
//     (TestLimiterHoldsAFloodNearTheKnee) is unchanged, its first round at
//     the limit already slow.
//   - After idle, only the doubling restarts. RFC 5681 (section 4.1)
//     restarts slow start from the initial window after an idle period
//     longer than the retransmission timeout (1 s at least, RFC 6298), as
//     the path may have changed while nothing was sent. A limit is a bound,
//     not a burst sent at once, and it neither grows (the tether) nor
//     shrinks while idle, so it is kept: a dependency that scaled out while
//     the limit was idle is found within a few rounds; one that did not
//     ends slow start at the first round that reaches the limit, whose
//     latency is already above 1.25 × the baseline where the law settles
//     under overload (where the queueing it causes equals the headroom,
//     above the tolerance). 1 s is TCP's least timeout: many round trips
//     of the dependencies a limiter is for.
//   - Netflix's concurrency-limits has no slow start: VegasLimit adds
//     6 × log10(limit) per update when it sees no queue, Gradient2Limit the
//     same sqrt(limit) as here, AIMDLimit 1.
//
// # A shrink is on trial
//
// The law reads any latency above the tolerance as queueing the limit
// causes. That holds for a dependency's queue, which empties as calls are
// held back; it does not hold for anything else between dispatch and
// headers that slows calls down, and that the limit cannot change: the
// dependency slowing for everyone, or the client itself, whose goroutines,
// connection pool and scheduler are in every latency it measures, and whose
// CPU its own refusals spend when the refused callers come straight back.
// So a shrink is a hypothesis that the next round tests. That round is made
// only of calls admitted after the shrink (those admitted before ran at
// the old concurrency), and nothing else changes the limit until it ends.
// A round's concurrency is measured two ways: peak, the most calls in
// flight during it (for the trial round, when one of its calls was
// admitted), which the latency of a dependency that shares itself among
// its calls follows; and conc, the mean over its calls of the in-flight
// count each found when admitted, itself included, which the latency of a
// dependency that serves its calls in turn (a FIFO of workers) follows,
// a call waiting for the work admitted before it. With
//
//	r     = (mean / mean(cause)) / (peak / peak(cause))
//	rConc = (mean / mean(cause)) / (conc / conc(cause))
//
// the shrink stands if
//
//   - it bound: an arrival found the lower limit reached where the old one
//     would have let it in (a shrink that holds nobody back changes nothing
//     the dependency sees);
//   - and either the latency fell (the round's mean is below the mean that
//     caused the shrink) in proportion to the peak, r between 1/1.5 and
//     1.5; or the calls were admitted at a higher concurrency than the
//     cause's, and the latency rose with it, rConc within the same bounds.
//     A queue of ours moves latency with the concurrency; a fall far
//     steeper than the concurrency's is the end of a stall (a GC pause, a
//     descheduled process), not the shrink's work. The second case is a
//     cause round that straddled the onset of an overload: its calls were
//     admitted as the concurrency climbed to the old limit, so its mean is
//     a ramp's, below the latency the old limit leads to, and its peak was
//     reached only at its end. Calls admitted after the shrink find more
//     in flight than the ramp's did, however much the shrink lowered the
//     limit, and wait longer. Refused callers that come straight back do
//     not produce this case: they keep the limit full in both rounds, so
//     the trial's calls find fewer in flight than the cause's did.
//
// Then the round is an ordinary one, and may shrink the limit again, on a
// new trial. Otherwise the shrink is undone, and the round teaches the
// baseline what an ordinary round would, unless the evidence that its
// latency is not a queue the limit can relieve is decisive: r and rConc
// both above the tolerance (the latency did not follow the concurrency,
// by far, by either measure); or a latency that did not fall at all
// though the concurrency fell by a fifth or more by both measures (r and
// rConc at least 1.25); or a shrink that held nobody back while
// in-flight stayed below half the limit restored. Then a round still
// above the tolerance becomes the baseline at once. A failed trial is not
// evidence by itself: near where the limit settles under overload, its
// shrinks are small and the fall they buy is within the noise, and taking
// those rounds as the baseline would walk the limit up a step at a time.
// A round that is congested is mostly queueing, the sum of the service
// times ahead of each call, so its mean varies far less than the 22% of
// a round of bare service times, and a cut of a fifth that buys no fall
// is not noise. With only r above the tolerance as decisive, refused
// callers who came straight back held the latency flat, within a few per
// cent, as the limit fell: the trials were undone but never decisive, the
// limit was tried lower every other round, and a trial that stood on a
// round a little calmer than its cause ratcheted it down, from 20 to 4 in
// 9 runs of 120 of TestLimiterOverloadSeenThroughABusyClient (in
// transport), none of 120 since. Hence:
//
//   - Refusals cannot drive the limit down. A refused caller that comes
//     straight back costs the client CPU, which slows the admitted calls:
//     the latency rises as the limit falls, the opposite of queueing, and
//     the trial undoes the shrink after one round; when the rise is
//     decisive the latency becomes the baseline, and the limit grows out of
//     the storm. When the client's CPU is what limits it, refusing relieves
//     nothing, and the limit settles where the refusals stop.
//   - A latency the limit cannot relieve costs one round at a lower limit.
//     It is learned when a shrink can tell: one shrink lowers the limit by
//     at most half plus the headroom, so below a limit of about 10 it moves
//     the concurrency by less than a fifth, too little for one round to
//     tell a flat latency from noise, and the limit dips every other round
//     instead (the gradient alone went down to its floor and stayed).
//   - A queue the limit causes is shed as before: each shrink lowers the
//     latency in proportion and stands; a trial adds one round per step on
//     the way down.
//   - A flood on a dependency with a FIFO queue is held near its knee. With
//     r alone, the first shrink of a flood was judged against its onset's
//     ramp: the latency rose from the ramp's mean as the peak fell, r was
//     about 2, the congested latency became the baseline and the limit
//     grew out of the flood (2 workers × 10 ms, 12 times their capacity:
//     the limit at 30 and more, calls waiting 100 to 170 ms in the
//     dependency's queue; TestLimiterHoldsAFloodNearTheKnee). Measured by
//     conc, the trial's latency followed the concurrency (rConc 1.02): the
//     shrink stands, and the limit comes down to 5 or 6 within half a
//     second.
//
// The baseline is a moving average of round means with a 30 s time
// constant, started by the first round; the first round changes nothing
// else. A round whose mean is below half the baseline pulls it halfway down
// at once (the dependency got faster). A round that was congested (short >
// 1.5 × baseline) and used, with the limit above MinLimit, is not learned:
// that latency may be our own queueing. It is learned once the limit is at
// MinLimit or the round was not used, that is when the dependency is slow
// whatever we do, and taken whole on a trial's decisive evidence. What
// remains is the known weakness of a latency-based limiter that does not
// probe: rounds within the tolerance still raise the baseline, so
// sustained queueing of up to 50% can creep it up at the pace of the 30 s
// average. Envoy answers that by measuring its minimum RTT periodically
// with the concurrency pinned low (3 by default), a periodic refusal of
// healthy calls a client library should not impose.
//
// # Why the trial: the client's own latency
//
// Without it the limiter shed a healthy upstream: a loopback server that
// answers at once, 16 closed-loop callers on 2 cores, 9% of calls refused
// with the limit at 5, and 99.98% with the limit at 4 when refused callers
// called again at once (BenchmarkLimiterHealthyUpstream in transport). The
// upstream was idle; what rose was the client's own latency, which every
// part of the law read as the dependency's queue:
//
//   - The baseline is a ratchet: a round below half of it pulls it halfway
//     down at once, and a congested, used round is not learned. At 16
//     callers, round means went from 20 µs to 400 µs and back as the
//     machine's other load came and went, so the baseline settled on the
//     calmest moment (980 µs to 46 µs in one trace) and every ordinary
//     moment after read as 4 to 8 times the baseline, and was never learned.
//     A minimum as the baseline (Vegas, BBR) has this bias by construction.
//     The ratchet stays, against a dependency's own drift; what changed is
//     that the shrinks it causes are tried, and one that holds nobody back
//     teaches the baseline the ordinary moment.
//   - The round mean: one call stalled 10 ms by a GC pause or a descheduled
//     process lifts the mean of 20 sub-millisecond calls by 500 µs, and one
//     round in ten had a mean over 1 ms (86 of 849 in one trace); each
//     could halve the limit.
//   - The tolerance of 1.5 is relative. It is sized for the noise of the
//     dependency's service times; the client adds to every call a delay of
//     its own, about its CPU time per call for each runnable goroutine
//     ahead of it, a few tens of µs on this machine, which is a multiple of
//     a sub-millisecond upstream's latency and a small part of a 2 ms one
//     (the same limiter refused nothing behind a handler that sleeps 2 ms).
//   - The headroom of sqrt(limit) decided where it landed: the law settles
//     where the queueing it causes equals the headroom, at the knee of
//     latency against concurrency. With the client's CPU as the bottleneck,
//     that is the CPU's knee, a few calls on 2 cores: 4 or 5.
//   - The tethered growth did not cause it; it keeps the limit at about
//     twice what is used, which is why one shrink does not bind.
//
// And underneath them all, the law never checked that latency followed its
// concurrency. With refused callers calling again at once it does the
// opposite: each refusal costs CPU, the latency rises as the limit falls,
// and every shrink fed the next. The trial is that check.
//
// How the anchors avoid it, and what resilix takes:
//
//   - Netflix's Gradient2 learns every sample into a 600-sample average,
//     congested ones included, and smooths each update by 0.2: a steady
//     contention becomes its baseline within 600 calls, and its default
//     MinLimit of 20 is above 16 callers anyway. The same average takes in a
//     sustained overload at the same pace (its doc expects the long RTT to
//     "trend higher" under load), the drift resilix's baseline is built to
//     resist. Not taken.
//   - Envoy's gradient controller measures its minRTT as the median of 50
//     requests with the concurrency pinned to 3, adds a 25% buffer, and
//     measures again after 5 windows at the minimum limit. Latency is
//     judged against a measurement at a known concurrency, which is what
//     tells the concurrency's effect from everything else. resilix takes
//     that idea without the window of refusals that pays for it: the shrink
//     is the change of concurrency, and the trial round, only calls admitted
//     after it, is the measurement.
//   - TCP Vegas and BBR take the minimum RTT over a window as the path's
//     latency without a queue. A client's own scheduling puts a floor under
//     every call that the minimum rarely sees, so this reads contention as
//     a standing queue. Not taken.
//   - failsafe-go's adaptive limiter (v0.9.8) compares the p90 of a window
//     of at least a second and 50 calls with an average of the last ten,
//     steps by log10(limit) on a Vegas-style queue estimate, and, when its
//     limit is full, lowers it when throughput does not follow in-flight
//     and latency does, over correlation windows of 50 updates. That is the
//     idea resilix takes: the limiter's own moves are the experiment, and a
//     decrease needs latency that follows the concurrency. resilix asks it
//     of each shrink, at once, with Little's law as the prediction, and
//     keeps no windows.
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
// arrivals per priority over the last 10 s: Bulk first, then BestEffort,
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
