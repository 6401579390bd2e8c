package hedge

import (
	"sync"
	"time"

	"github.com/resilix/resilix/estimator"
	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// Counter indexes in State.win.
const (
	hedgeCalls = iota
	hedgeFailures
	hedgeStarted
	hedgeWon
	hedgeCounters
)

// State is the runtime of a Hedge for one scope: the latency window
// the threshold is read from, the outcome counts the health gate reads when
// no Breaker is configured, and the win-rate allowance. It is safe for
// concurrent use; the transport drives it, and every method takes now.
type State struct {
	cfg policy.Hedge // with defaults
	lat *estimator.LatencyWindow
	win *estimator.Counters

	mu        sync.Mutex
	allowance float64   // hedges allowed per opportunity, in [MinAllowance, 1]
	credit    float64   // deficit accounting: a hedge goes when it reaches 1 (see worth); below 0 after a debt
	judged    time.Time // when the allowance was last judged
	started   uint64    // hedges started since judged
	won       uint64    // of which won

	ties Ties // with Hedge.Tied
}

// New returns the runtime of h, whose windows start at now.
func New(h policy.Hedge, now time.Time) *State {
	return &State{
		cfg: h,
		lat: estimator.NewLatencyWindow(estimator.LatencyConfig{
			Window: h.Window, Quantile: h.Quantile, MinSamples: h.MinSamples,
		}, now),
		win:       estimator.NewCounters(h.Window, hedgeCounters, now),
		allowance: 1,
		judged:    now,
	}
}

// Tied reports whether the scope ties its hedged rounds (Hedge.Tied).
func (h *State) Tied() bool { return h.cfg.Tied }

// Ties returns what the scope knows of its upstream's tied requests.
func (h *State) Ties() *Ties { return &h.ties }

// Config returns the Hedge with its defaults applied.
func (h *State) Config() policy.Hedge { return h.cfg }

// Record learns one attempt's latency, from dispatch to response headers
// (or a lower bound of it: a timeout, a losing leg cut short), and its
// outcome: a Failure is recorded as one (see
// estimator.LatencyWindow.RecordFailure), so that a dependency failing
// fast cannot pull the threshold down to its speed.
func (h *State) Record(now time.Time, d time.Duration, o policy.Outcome) {
	if o == policy.Failure {
		h.lat.RecordFailure(now, d)
		return
	}
	h.lat.Record(now, d)
}

// Threshold returns the latency after which a call is hedged, and false
// while the window holds fewer than MinSamples (the warming gate): the
// window's quantile, or the last seconds' when they hold enough samples
// and say the latency fell or rose (see estimator.LatencyWindow.Threshold).
func (h *State) Threshold(now time.Time) (time.Duration, bool) { return h.lat.Threshold(now) }

// median returns the window's median latency, which the deadline gate
// takes as how long a hedge would plausibly need.
func (h *State) median(now time.Time) time.Duration {
	d, _ := h.lat.Quantile(now, 0.5)
	return d
}

// Due is what the hedging gates read of one hedge that its timer made due.
type Due struct {
	Deadline time.Time // the call's; zero when it has none
	Live     int       // the round's legs on the wire
	Wire     int       // the call's wire attempts so far
	Attempts int       // and the most it may make (Set.Attempts)
	Priority shedding.Priority
	Breaker  *gate.Breaker // the scope's, or nil
}

// Gate asks the hedging gates, in their order, whether a due hedge may be
// sent, and returns the reason of the first that says no, or 0:
//
//  1. warming: fewer than MinSamples latencies in the window;
//  2. deadline: the call's deadline is closer than the window's median,
//     so the hedge could not plausibly answer in time;
//  3. concurrency: MaxConcurrent legs on the wire, or Attempts spent;
//  4. priority: Bulk is never hedged (nobody waits for it);
//  5. health: the scope's error rate has reached SuppressAt of the trip
//     point (the breaker's, or, without one, this window's outcomes
//     against the breaker's defaults);
//  6. value: with WinRate, the allowance's credit reaches a hedge (see
//     worth); it is spent by Started, once the hedge is sent;
//  7. budget: one token from the scope's Budget, which the transport
//     takes after these gates, and gives back if a later step refuses
//     the hedge (see transport's round.hedge for the steps, in order).
//
// Gate spends nothing: a hedge it lets through may still be refused, by
// the budget, the admission gates or its body, and whatever the hedge
// takes is either taken last or given back.
func (h *State) Gate(now time.Time, d Due) policy.SuppressReason {
	if _, warm := h.lat.Threshold(now); !warm {
		return policy.HedgeWarming
	}
	switch {
	case !d.Deadline.IsZero() && d.Deadline.Sub(now) < h.median(now):
		return policy.HedgeDeadline
	case d.Live >= h.cfg.MaxConcurrent || d.Wire >= d.Attempts:
		return policy.HedgeConcurrency
	case d.Priority == shedding.Bulk:
		return policy.HedgePriority
	case !h.healthy(now, d.Breaker):
		return policy.HedgeHealth
	case !h.worth(now):
		return policy.HedgeValue
	}
	return 0
}

// Observe counts one attempt's evidence for the health gate; Canceled and
// Discarded outcomes teach nothing.
func (h *State) Observe(now time.Time, o policy.Outcome) {
	switch o {
	case policy.Success:
		h.win.Add(now, hedgeCalls, 1)
	case policy.Failure:
		h.win.Add(now, hedgeCalls, 1)
		h.win.Add(now, hedgeFailures, 1)
	}
}

// rate is the health gate's view of the scope when no Breaker is
// configured: the window's outcomes against the breaker's default trip
// point before it has a baseline, with the breaker's default MinCalls.
func (h *State) rate(now time.Time) gate.BreakerRate {
	var s [hedgeCounters]uint64
	h.win.Sums(now, s[:])
	r := gate.BreakerRate{
		Calls:     s[hedgeCalls],
		Failures:  s[hedgeFailures],
		TripPoint: gate.WarmupTrip,
		MinCalls:  policy.Breaker{}.WithDefaults().MinCalls,
	}
	if r.Calls > 0 {
		r.ErrorRate = float64(r.Failures) / float64(r.Calls)
	}
	return r
}

// healthy is the health gate: false when the scope's error rate, the
// breaker's if there is one, has reached SuppressAt of its trip point.
func (h *State) healthy(now time.Time, b *gate.Breaker) bool {
	r := h.rate(now)
	if b != nil {
		r = b.Rate(now)
	}
	return !r.Reached(h.cfg.SuppressAt)
}

// worth is the value gate, deficit-accounted: with WinRate set, each
// opportunity adds the allowance to the credit, and a hedge costs 1. It
// reports whether the credit with this opportunity's share reaches 1; a
// refusal keeps the share (the credit accumulates), a pass takes nothing:
// Started spends the credit once the hedge is sent, so that a hedge a
// later step refuses costs none, however often its round asks again.
// Without WinRate it always passes.
func (h *State) worth(now time.Time) bool {
	if h.cfg.WinRate == nil {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.judge(now)
	if h.credit+h.allowance < 1 {
		h.credit += h.allowance
		return false
	}
	return true
}

// judge moves the allowance once per Window by AIMD on the share of the
// window's hedges that won: halved below Floor, a quarter added back at or
// above it, and a quarter added when too few hedges ran to judge. The
// caller holds h.mu.
func (h *State) judge(now time.Time) {
	if now.Sub(h.judged) < h.cfg.Window {
		return
	}
	w := h.cfg.WinRate
	switch {
	case h.started < uint64(w.MinSamples):
		h.allowance = min(1, h.allowance+0.25)
	case float64(h.won) < w.Floor*float64(h.started):
		h.allowance = max(w.MinAllowance, h.allowance/2)
	default:
		h.allowance = min(1, h.allowance+0.25)
	}
	h.judged, h.started, h.won = now, 0, 0
}

// Allowance returns the share of hedge opportunities WinRate lets through:
// 1 without WinRate.
func (h *State) Allowance(now time.Time) float64 {
	if h.cfg.WinRate == nil {
		return 1
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.judge(now)
	return h.allowance
}

// Started records a hedge that was sent and, with WinRate, spends its
// credit: the opportunity's share of the allowance, less the hedge's 1.
// Two rounds whose value gates passed on the same credit are both sent:
// the second leaves the credit below zero, a debt that the next
// opportunities pay off, so that over a judging period hedges sent stay
// the allowance's share of the opportunities.
func (h *State) Started(now time.Time) {
	h.win.Add(now, hedgeStarted, 1)
	if h.cfg.WinRate == nil {
		return
	}
	h.mu.Lock()
	h.judge(now)
	h.credit = min(h.credit+h.allowance, 1+h.allowance) - 1
	h.started++
	h.mu.Unlock()
}

// Won records a hedge that answered first.
func (h *State) Won(now time.Time) {
	h.win.Add(now, hedgeWon, 1)
	if h.cfg.WinRate != nil {
		h.mu.Lock()
		h.won++
		h.mu.Unlock()
	}
}

// Wins returns the hedges started and won over the window. A hedge is
// counted as won in the slice it won in, which may be one after the slice
// it started in, so won is capped at started.
func (h *State) Wins(now time.Time) (started, won uint64) {
	var s [hedgeCounters]uint64
	h.win.Sums(now, s[:])
	return s[hedgeStarted], min(s[hedgeWon], s[hedgeStarted])
}
