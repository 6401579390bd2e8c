package otelmetrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/metric"

	"github.com/resilix/resilix/policy"
)

// MeterName is the name of the meter the instruments are created on.
const MeterName = "github.com/resilix/resilix/otelmetrics"

// buckets returns the explicit bucket boundaries of both histograms, in
// seconds. The package doc lists them.
func buckets() []float64 {
	return []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
}

// recorder holds the instruments and the state behind one Observer.
type recorder struct {
	calls          metric.Int64Counter
	attempts       metric.Int64Counter
	hedges         metric.Int64Counter
	shed           metric.Int64Counter
	skipped        metric.Int64Counter
	pushbacks      metric.Int64Counter
	malformed      metric.Int64Counter
	ejections      metric.Int64Counter
	callDuration   metric.Float64Histogram
	hedgeThreshold metric.Float64Histogram
	hedgeCurrent   metric.Float64ObservableGauge
	breakerState   metric.Int64ObservableGauge
	limiterLimit   metric.Int64ObservableGauge
	budgetBalance  metric.Float64ObservableGauge
	store          metric.Int64ObservableGauge
	sentOnce       metric.Int64ObservableCounter
	lanes          metric.Int64ObservableGauge
	laneAttempts   metric.Int64Counter
	laneState      metric.Int64ObservableGauge
	laneLoad       metric.Float64ObservableGauge
	laneLoadAge    metric.Float64ObservableGauge

	attrs         cache
	laneAddresses bool // Options.LaneAddresses

	mu      sync.Mutex
	sources []*source // attached, and not yet found dead
	pruneAt int       // the len(sources) at which attach looks for dead ones
}

// source is an attached StateSource, marked dead once its States has
// returned false: its transport has been garbage collected.
type source struct {
	policy.StateSource
	dead atomic.Bool
}

// minPruneAt is the fewest sources attach looks through for dead ones.
const minPruneAt = 16

// New returns an Observer that records resilix's events into instruments
// of mp, for transport.Config.Observer. The package doc lists the
// instruments. It reports the first errors mp returned when creating them;
// mp must not be nil.
//
// The Observer is safe for concurrent use and may be given to several
// transports. It stays referenced by mp's gauge callback for as long as mp
// lives, but it keeps no transport alive: it forgets each one once it has
// been garbage collected (see policy.Observer.Attach), when the gauges are
// next collected or as new transports attach. So it holds the state
// sources of the live transports only: when nothing collects, at most 16,
// or twice as many as were alive when it last looked.
func New(mp metric.MeterProvider) (*policy.Observer, error) {
	return NewWith(mp, Options{})
}

// Options says how an Observer names what it records. The zero Options is
// what New uses, and the recommended setting.
type Options struct {
	// LaneAddresses names a lane of policy.Replicas.Endpoints by its
	// address in the lane attribute of resilix.lane.attempts and
	// resilix.lane.state, so that a dashboard names the replica itself.
	// A key has at most 64 lanes at once, but every address a lane has
	// ever had stays a series of a cumulative exporter for the life of
	// the process: set it where the addresses are few and stable (a
	// static list, a fleet of fixed hosts), not where replicas come and
	// go with addresses of their own (pods behind a headless Service).
	// If false, every lane is named by its index, "0" to "63", which a
	// lane keeps while its address stays in Endpoints' answers; the
	// address of a lane is then on its span events (package oteltrace)
	// and log records (package slogobserver). A connection lane
	// (Replicas.Connections) is named by its index either way.
	LaneAddresses bool
}

// NewWith is New with options.
func NewWith(mp metric.MeterProvider, o Options) (*policy.Observer, error) {
	if mp == nil {
		return nil, errors.New("otelmetrics: nil MeterProvider")
	}
	r, err := newRecorder(mp, o)
	if err != nil {
		return nil, err
	}
	return r.observer(), nil
}

// newRecorder creates the instruments on mp and registers the gauges'
// callback.
func newRecorder(mp metric.MeterProvider, o Options) (*recorder, error) {
	m := mp.Meter(MeterName)
	r := &recorder{laneAddresses: o.LaneAddresses}
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error

	r.calls, err = m.Int64Counter("resilix.calls",
		metric.WithUnit("{call}"),
		metric.WithDescription("Logical calls (RoundTrips) finished, by the outcome the caller got."))
	check(err)
	r.attempts, err = m.Int64Counter("resilix.attempts",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Wire attempts finished, by why they were sent (first, retry, hedge) and their outcome."))
	check(err)
	r.hedges, err = m.Int64Counter("resilix.hedges",
		metric.WithUnit("{hedge}"),
		metric.WithDescription("Hedges started, won, and suppressed (with the reason), and tied legs cancelled before they started or run twice; the win rate is won / started."))
	check(err)
	r.shed, err = m.Int64Counter("resilix.shed",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts refused by an admission gate, by gate and request priority."))
	check(err)
	r.skipped, err = m.Int64Counter("resilix.retries.skipped",
		metric.WithUnit("{retry}"),
		metric.WithDescription("Failed attempts not retried although attempts were left, by the reason (and, for reason gate, the gate)."))
	check(err)
	r.pushbacks, err = m.Int64Counter("resilix.pushbacks",
		metric.WithUnit("{response}"),
		metric.WithDescription("Responses (429 or 503 with a Retry-After) that armed or extended the throttler's pushback, by status."))
	check(err)
	r.malformed, err = m.Int64Counter("resilix.headers.malformed",
		metric.WithUnit("{header}"),
		metric.WithDescription("Headers resilix reads that could not be parsed (treated as absent), and tenant ids it could not write, by header name."))
	check(err)
	r.ejections, err = m.Int64Counter("resilix.ejections",
		metric.WithUnit("{ejection}"),
		metric.WithDescription("Lanes of a key (policy.Replicas) ejected, by the reason: consecutive failures, or a failure rate far above the other lanes'."))
	check(err)
	r.callDuration, err = m.Float64Histogram("resilix.call.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of logical calls, retries, backoff and hedges included, until response headers or error."),
		metric.WithExplicitBucketBoundaries(buckets()...))
	check(err)
	r.hedgeThreshold, err = m.Float64Histogram("resilix.hedge.threshold",
		metric.WithUnit("s"),
		metric.WithDescription("Latency threshold after which each hedge was sent."),
		metric.WithExplicitBucketBoundaries(buckets()...))
	check(err)
	r.hedgeCurrent, err = m.Float64ObservableGauge("resilix.hedge.threshold.current",
		metric.WithUnit("s"),
		metric.WithDescription("Latency after which a call of the key would be hedged now; no point while the latency window is warming."))
	check(err)
	r.breakerState, err = m.Int64ObservableGauge("resilix.breaker.state",
		metric.WithUnit("{state}"),
		metric.WithDescription("Circuit breaker state: 0 closed, 1 open, 2 half-open, 3 isolated."))
	check(err)
	r.limiterLimit, err = m.Int64ObservableGauge("resilix.limiter.limit",
		metric.WithUnit("{request}"),
		metric.WithDescription("Adaptive concurrency limit."))
	check(err)
	r.budgetBalance, err = m.Float64ObservableGauge("resilix.budget.balance",
		metric.WithUnit("{token}"),
		metric.WithDescription("Tokens left in the retry-and-hedge budget."))
	check(err)
	r.store, err = m.Int64ObservableGauge("resilix.rate_limit.store",
		metric.WithUnit("{state}"),
		metric.WithDescription("State of the shared rate limit's store: 1 up, 2 failing with calls under the local rate, 3 failing with calls refused."))
	check(err)
	r.sentOnce, err = m.Int64ObservableCounter("resilix.repeats.sent_once",
		metric.WithUnit("{call}"),
		metric.WithDescription("Calls sent once, neither retried nor hedged, because their request was itself a retry or a hedge of the caller's call."))
	check(err)
	r.lanes, err = m.Int64ObservableGauge("resilix.lanes",
		metric.WithUnit("{lane}"),
		metric.WithDescription("Lanes a key (policy.Replicas) picks from, by state: open, or ejected now."))
	check(err)
	r.laneAttempts, err = m.Int64Counter("resilix.lane.attempts",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Wire attempts finished on each lane of a key (policy.Replicas), by outcome; a lane's share of the key's attempts is what picking gave it."))
	check(err)
	r.laneState, err = m.Int64ObservableGauge("resilix.lane.state",
		metric.WithUnit("{state}"),
		metric.WithDescription("State of each lane of a key (policy.Replicas): 1 open, 2 probing, 3 held by a Retry-After, 4 down, 5 ejected."))
	check(err)
	r.laneLoad, err = m.Float64ObservableGauge("resilix.lane.load",
		metric.WithUnit("1"),
		metric.WithDescription("Load each lane's server last reported (ORCA's endpoint-load-metrics), as a utilization: 1 at its limit, above 1 with a queue; at least 1 after a failure on the lane since the report. Only lanes whose server reports."))
	check(err)
	r.laneLoadAge, err = m.Float64ObservableGauge("resilix.lane.load.age",
		metric.WithUnit("s"),
		metric.WithDescription("Age of each lane's last load report; one older than 2 s no longer counts."))
	check(err)
	if len(errs) == 0 {
		_, err = m.RegisterCallback(r.observe, r.hedgeCurrent, r.breakerState, r.limiterLimit, r.budgetBalance, r.store, r.sentOnce, r.lanes, r.laneState, r.laneLoad, r.laneLoadAge)
		check(err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("otelmetrics: %w", err)
	}
	return r, nil
}

// observer returns the Observer that records into r.
func (r *recorder) observer() *policy.Observer {
	return &policy.Observer{
		CallDone:        r.callDone,
		AttemptDone:     r.attemptDone,
		Refused:         r.refused,
		RetrySkipped:    r.retrySkipped,
		HedgeStarted:    r.hedgeStarted,
		HedgeWon:        r.hedgeWon,
		TieCancelled:    r.tieCancelled,
		TieRanTwice:     r.tieRanTwice,
		HedgeSuppressed: r.hedgeSuppressed,
		Attach:          r.attach,
		Pushback:        r.pushback,
		MalformedHeader: r.malformedHeader,
		LaneEjected:     r.laneEjected,
	}
}

// The event handlers below record with the event's Context, the caller's,
// so that an SDK set up for exemplars can link a measurement to the
// caller's trace.

func (r *recorder) callDone(c policy.CallInfo) {
	a := r.attrs.get(c.Key).outcome(c.Outcome)
	ctx := orBackground(c.Context)
	r.calls.Add(ctx, 1, a.add...)
	r.callDuration.Record(ctx, c.Duration.Seconds(), a.rec...)
}

func (r *recorder) attemptDone(at policy.AttemptInfo) {
	e := r.attrs.get(at.Key)
	ctx := orBackground(at.Context)
	r.attempts.Add(ctx, 1, e.attempt(at.Kind, at.Outcome).add...)
	if at.Lane != "" {
		a := e.lane(at.LaneIndex, r.laneName(at.Lane)).outcome(e.key, at.Outcome)
		r.laneAttempts.Add(ctx, 1, a.add...)
	}
}

// laneName returns the lane attribute's value for a lane that observers
// name name (policy.LaneName): "" when lanes are named by their index,
// which entry.lane then fills in.
func (r *recorder) laneName(name string) string {
	if r.laneAddresses {
		return name
	}
	return ""
}

func (r *recorder) refused(f policy.Refusal) {
	a := refusal(r.attrs.get(f.Key), f.Gate, f.Priority)
	r.shed.Add(orBackground(f.Context), 1, a.add...)
}

func (r *recorder) retrySkipped(k policy.RetrySkip) {
	a := r.attrs.get(k.Key).skipped(k.Reason, k.Gate)
	r.skipped.Add(orBackground(k.Context), 1, a.add...)
}

func (r *recorder) pushback(p policy.Pushback) {
	a := r.attrs.get(p.Key).pushback(p.StatusCode)
	r.pushbacks.Add(orBackground(p.Context), 1, a.add...)
}

func (r *recorder) malformedHeader(m policy.MalformedHeader) {
	a := r.attrs.get(m.Key).malformedHeader(m.Header)
	r.malformed.Add(orBackground(m.Context), 1, a.add...)
}

func (r *recorder) laneEjected(e policy.LaneEjection) {
	a := r.attrs.get(e.Key).ejection(e.Reason)
	r.ejections.Add(orBackground(e.Context), 1, a.add...)
}

func (r *recorder) hedgeStarted(h policy.HedgeInfo) {
	e := r.attrs.get(h.Key)
	ctx := orBackground(h.Context)
	r.hedges.Add(ctx, 1, e.hedge(hedgeStarted).add...)
	r.hedgeThreshold.Record(ctx, h.Threshold.Seconds(), e.base.rec...)
}

func (r *recorder) hedgeWon(h policy.HedgeInfo) {
	a := r.attrs.get(h.Key).hedge(hedgeWon)
	r.hedges.Add(orBackground(h.Context), 1, a.add...)
}

func (r *recorder) tieCancelled(h policy.HedgeInfo) {
	a := r.attrs.get(h.Key).hedge(hedgeTieCancelled)
	r.hedges.Add(orBackground(h.Context), 1, a.add...)
}

func (r *recorder) tieRanTwice(h policy.HedgeInfo) {
	a := r.attrs.get(h.Key).hedge(hedgeTieRanTwice)
	r.hedges.Add(orBackground(h.Context), 1, a.add...)
}

func (r *recorder) hedgeSuppressed(h policy.HedgeSuppression) {
	a := r.attrs.get(h.Key).suppressed(h.Reason)
	r.hedges.Add(orBackground(h.Context), 1, a.add...)
}

// orBackground returns ctx, or context.Background() when it is nil: the
// transport never passes a nil Context, but an event built by hand (a
// test, a user's own composition) may, and the SDK would panic on it.
func orBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// attach adds src to the sources the gauges read. So that sources of
// dropped transports do not pile up when nothing collects, it looks
// through them all when their number has doubled since it last did, which
// costs each attach a constant amortized number of States calls.
func (r *recorder) attach(src policy.StateSource) {
	if src == nil {
		return
	}
	r.mu.Lock()
	r.sources = append(r.sources, &source{StateSource: src})
	var all []*source
	if len(r.sources) >= max(r.pruneAt, minPruneAt) {
		all = slices.Clone(r.sources)
		r.pruneAt = math.MaxInt // until this look is done
	}
	r.mu.Unlock()
	if all == nil {
		return
	}
	for _, s := range all {
		if !s.States(func(string, policy.Snapshot) {}) {
			s.dead.Store(true)
		}
	}
	r.forgetDead()
}

// forgetDead drops the sources marked dead, and sets when attach next
// looks for them.
func (r *recorder) forgetDead() {
	r.mu.Lock()
	r.sources = slices.DeleteFunc(r.sources, func(s *source) bool { return s.dead.Load() })
	r.pruneAt = 2 * len(r.sources)
	r.mu.Unlock()
}

// observe is the gauges' callback: it reads the state of every key of
// every attached transport, and forgets the transports that are gone.
func (r *recorder) observe(_ context.Context, o metric.Observer) error {
	r.mu.Lock()
	sources := slices.Clone(r.sources)
	r.mu.Unlock()
	dead := false
	for _, src := range sources {
		alive := src.States(func(key string, s policy.Snapshot) {
			if s.HedgeThreshold <= 0 && !s.HasBreaker && !s.HasLimiter && !s.HasBudget && s.RateLimitStore == 0 && s.RepeatsSentOnce == 0 && !s.HasReplicas {
				return
			}
			e := r.attrs.get(key)
			obs := e.base.obs
			if s.HedgeThreshold > 0 {
				o.ObserveFloat64(r.hedgeCurrent, s.HedgeThreshold.Seconds(), obs...)
			}
			if s.HasBreaker {
				o.ObserveInt64(r.breakerState, int64(s.BreakerState), obs...)
			}
			if s.HasLimiter {
				o.ObserveInt64(r.limiterLimit, int64(s.LimiterLimit), obs...)
			}
			if s.HasBudget {
				o.ObserveFloat64(r.budgetBalance, s.BudgetBalance, obs...)
			}
			if s.RateLimitStore != 0 {
				o.ObserveInt64(r.store, int64(s.RateLimitStore), obs...)
			}
			if s.RepeatsSentOnce != 0 {
				o.ObserveInt64(r.sentOnce, int64(s.RepeatsSentOnce), obs...)
			}
			if s.HasReplicas {
				o.ObserveInt64(r.lanes, int64(s.Lanes-s.LanesEjected), e.laneState(laneOpen).obs...)
				o.ObserveInt64(r.lanes, int64(s.LanesEjected), e.laneState(laneEjected).obs...)
				for i, l := range s.PerLane {
					if l.State == 0 {
						continue
					}
					name := ""
					if r.laneAddresses {
						name = policy.LaneName(l.Addr, i)
					}
					a := e.lane(i, name).obs
					o.ObserveInt64(r.laneState, int64(l.State), a...)
					if l.HasLoad {
						o.ObserveFloat64(r.laneLoad, l.Load, a...)
						o.ObserveFloat64(r.laneLoadAge, l.LoadAge.Seconds(), a...)
					}
				}
			}
		})
		if !alive {
			src.dead.Store(true)
			dead = true
		}
	}
	if dead {
		r.forgetDead()
	}
	return nil
}
