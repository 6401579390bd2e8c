package hedge

import (
	"sync"
	"time"

	"github.com/resilix/resilix/estimator"
	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/policy"
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
	credit    float64   // deficit accounting: a hedge starts when it reaches 1
	judged    time.Time // when the allowance was last judged
	started   uint64    // hedges started since judged
	won       uint64    // of which won
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

// Config returns the Hedge with its defaults applied.
func (h *State) Config() policy.Hedge { return h.cfg }

// Record learns one attempt's latency, from dispatch to response headers.
func (h *State) Record(now time.Time, d time.Duration) { h.lat.Record(now, d) }

// Threshold returns the latency after which a call is hedged, and false
// while the window holds fewer than MinSamples (the warming gate).
func (h *State) Threshold(now time.Time) (time.Duration, bool) { return h.lat.Threshold(now) }

// Median returns the window's median latency, which the deadline gate
// takes as how long a hedge would plausibly need.
func (h *State) Median(now time.Time) time.Duration {
	d, _ := h.lat.Quantile(now, 0.5)
	return d
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

// Rate is the health gate's view of the scope when no Breaker is
// configured: the window's outcomes against the breaker's default trip
// point before it has a baseline, with the breaker's default MinCalls.
func (h *State) Rate(now time.Time) gate.BreakerRate {
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

// Healthy is the health gate: false when the rate has reached SuppressAt
// of its trip point.
func (h *State) Healthy(r gate.BreakerRate) bool { return !r.Reached(h.cfg.SuppressAt) }

// Value is the value gate: with WinRate set, it spends the allowance's
// credit, deficit-accounted (each opportunity adds the allowance; a hedge
// starts when the credit reaches 1). Without WinRate it always passes.
func (h *State) Value(now time.Time) bool {
	if h.cfg.WinRate == nil {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.judge(now)
	h.credit = min(h.credit+h.allowance, 1+h.allowance)
	if h.credit < 1 {
		return false
	}
	h.credit--
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

// Started records a hedge that was sent.
func (h *State) Started(now time.Time) {
	h.win.Add(now, hedgeStarted, 1)
	if h.cfg.WinRate != nil {
		h.mu.Lock()
		h.started++
		h.mu.Unlock()
	}
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
