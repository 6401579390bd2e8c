package policy

import (
	"sync"
	"time"

	"github.com/resilix/resilix/estimator"
)

// Hedge sends a second copy of a slow call and takes whichever answers
// first, cancelling the other.
//
// A call is slow when it has waited longer than a live quantile of the
// scope's recent latency, never a constant: during a brownout the quantile
// rises with the latency, so the share of calls hedged stays near
// 1 − Quantile instead of every call doubling. There is no fixed-delay
// option, on purpose.
//
// Hedge follows Retry's rule for what may be sent twice: a plain POST is
// never hedged.
type Hedge struct {
	// Quantile of recent attempt latency after which a hedge is
	// considered, in (0, 1). If zero, 0.95 is used.
	Quantile float64

	// MaxConcurrent is the most legs of one call in flight at once,
	// the first included. If zero, 2 is used; otherwise at least 2, and
	// at most the Set's Attempts, which bound the legs of a call in all.
	MaxConcurrent int

	// MinSamples is the number of latencies the window must hold
	// before any hedge is sent. If zero, 20 is used.
	MinSamples int

	// Window is how much latency history the quantile is taken over. If
	// zero, 30s is used.
	Window time.Duration

	// SuppressAt stops hedging when the scope's error rate reaches this
	// fraction of the breaker's trip point, in (0, 1]. If zero, 0.5 is
	// used; 1 suppresses only where the breaker would trip anyway.
	SuppressAt float64

	// WinRate, when set, backs hedging off while hedges rarely win.
	WinRate *WinRate
}

// WinRate backs hedging off when hedges stop paying: an allowance of hedges
// moves by AIMD on the share of recent hedges that won.
type WinRate struct {
	// Floor is the win rate below which the allowance is halved, in
	// (0, 1). If zero, 0.1 is used.
	Floor float64
	// MinAllowance is the smallest allowance, in (0, 1]. If zero,
	// 0.05 is used.
	MinAllowance float64
	// MinSamples is the number of hedges a window needs before its win
	// rate is judged. If zero, 10 is used.
	MinSamples int
}

func (h *Hedge) validate() error {
	return joinErrs(
		fieldErrIf(h.Quantile != 0 && !(h.Quantile > 0 && h.Quantile < 1),
			"Hedge.Quantile", "must be in (0, 1), got %v", h.Quantile),
		fieldErrIf(h.MaxConcurrent != 0 && h.MaxConcurrent < 2,
			"Hedge.MaxConcurrent", "must be >= 2 (it counts the first leg), got %d", h.MaxConcurrent),
		fieldErrIf(h.MinSamples < 0, "Hedge.MinSamples", "must be >= 0, got %d", h.MinSamples),
		fieldErrIf(h.Window < 0, "Hedge.Window", "must be >= 0, got %v", h.Window),
		fieldErrIf(h.SuppressAt != 0 && !(h.SuppressAt > 0 && h.SuppressAt <= 1),
			"Hedge.SuppressAt", "must be in (0, 1], got %v", h.SuppressAt),
		validateIf(h.WinRate),
	)
}

func (w *WinRate) validate() error {
	return joinErrs(
		fieldErrIf(w.Floor != 0 && !(w.Floor > 0 && w.Floor < 1),
			"Hedge.WinRate.Floor", "must be in (0, 1), got %v", w.Floor),
		fieldErrIf(w.MinAllowance != 0 && !(w.MinAllowance > 0 && w.MinAllowance <= 1),
			"Hedge.WinRate.MinAllowance", "must be in (0, 1], got %v", w.MinAllowance),
		fieldErrIf(w.MinSamples < 0, "Hedge.WinRate.MinSamples", "must be >= 0, got %d", w.MinSamples),
	)
}

// WithDefaults returns h with every zero field set to its default.
func (h Hedge) WithDefaults() Hedge {
	h.Quantile = or(h.Quantile, 0.95)
	h.MaxConcurrent = or(h.MaxConcurrent, 2)
	h.MinSamples = or(h.MinSamples, 20)
	h.Window = or(h.Window, 30*time.Second)
	h.SuppressAt = or(h.SuppressAt, 0.5)
	if h.WinRate != nil {
		w := *h.WinRate
		w.Floor = or(w.Floor, 0.1)
		w.MinAllowance = or(w.MinAllowance, 0.05)
		w.MinSamples = or(w.MinSamples, 10)
		h.WinRate = &w
	}
	return h
}

// SuppressReason says which gate stopped a hedge.
type SuppressReason uint8

// The hedging gates, in the order they are asked when a hedge timer fires.
const (
	// HedgeWarming: the latency window holds fewer than MinSamples,
	// so there is no threshold yet. Counted once per round (each first
	// attempt and retry) while the window is warming.
	HedgeWarming SuppressReason = iota + 1
	// HedgeDeadline: the hedge could not finish before the caller's
	// deadline.
	HedgeDeadline
	// HedgeConcurrency: MaxConcurrent legs are in flight, or the
	// call's Attempts are spent.
	HedgeConcurrency
	// HedgePriority: Bulk requests are never hedged.
	HedgePriority
	// HedgeHealth: the scope's error rate has reached SuppressAt of the
	// breaker's trip point.
	HedgeHealth
	// HedgeValue: recent hedges rarely won and WinRate's allowance has
	// no credit for this one.
	HedgeValue
	// HedgeBudget: the shared retry-and-hedge budget had no token.
	HedgeBudget
	// HedgeRejected: an admission gate (breaker, bulkhead, rate limit, ...)
	// refused the hedge leg.
	HedgeRejected
	// HedgeBodyError: Request.GetBody failed for the hedge leg.
	HedgeBodyError
)

var suppressReasonNames = [...]string{"", "warming", "deadline", "concurrency", "priority", "health", "value", "budget", "rejected", "body_error"}

// String returns the reason's name as it appears in metrics.
func (r SuppressReason) String() string {
	if int(r) < len(suppressReasonNames) && r != 0 {
		return suppressReasonNames[r]
	}
	return "SuppressReason(?)"
}

// Counter indexes in HedgeState.win.
const (
	hedgeCalls = iota
	hedgeFailures
	hedgeStarted
	hedgeWon
	hedgeCounters
)

// HedgeState is the runtime of a Hedge for one scope: the latency window
// the threshold is read from, the outcome counts the health gate reads when
// no Breaker is configured, and the win-rate allowance. It is safe for
// concurrent use; the transport drives it, and every method takes now.
type HedgeState struct {
	cfg Hedge // with defaults
	lat *estimator.LatencyWindow
	win *estimator.Counters

	mu        sync.Mutex
	allowance float64   // hedges allowed per opportunity, in [MinAllowance, 1]
	credit    float64   // deficit accounting: a hedge starts when it reaches 1
	judged    time.Time // when the allowance was last judged
	started   uint64    // hedges started since judged
	won       uint64    // of which won
}

// NewHedgeState returns the runtime of h, whose windows start at now.
func NewHedgeState(h Hedge, now time.Time) *HedgeState {
	h = h.WithDefaults()
	return &HedgeState{
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
func (h *HedgeState) Config() Hedge { return h.cfg }

// Record learns one attempt's latency, from dispatch to response headers.
func (h *HedgeState) Record(now time.Time, d time.Duration) { h.lat.Record(now, d) }

// Threshold returns the latency after which a call is hedged, and false
// while the window holds fewer than MinSamples (the warming gate).
func (h *HedgeState) Threshold(now time.Time) (time.Duration, bool) { return h.lat.Threshold(now) }

// Median returns the window's median latency, which the deadline gate
// takes as how long a hedge would plausibly need.
func (h *HedgeState) Median(now time.Time) time.Duration {
	d, _ := h.lat.Quantile(now, 0.5)
	return d
}

// Outcome counts one attempt's evidence for the health gate; Canceled and
// Discarded outcomes teach nothing.
func (h *HedgeState) Outcome(now time.Time, o Outcome) {
	switch o {
	case Success:
		h.win.Add(now, hedgeCalls, 1)
	case Failure:
		h.win.Add(now, hedgeCalls, 1)
		h.win.Add(now, hedgeFailures, 1)
	}
}

// Rate is the health gate's view of the scope when no Breaker is
// configured: the window's outcomes against the breaker's default trip
// point before it has a baseline, with the breaker's default MinCalls.
func (h *HedgeState) Rate(now time.Time) BreakerRate {
	var s [hedgeCounters]uint64
	h.win.Sums(now, s[:])
	r := BreakerRate{
		Calls:     s[hedgeCalls],
		Failures:  s[hedgeFailures],
		TripPoint: breakerWarmupTrip,
		MinCalls:  Breaker{}.WithDefaults().MinCalls,
	}
	if r.Calls > 0 {
		r.ErrorRate = float64(r.Failures) / float64(r.Calls)
	}
	return r
}

// Healthy is the health gate: false when the rate has reached SuppressAt
// of its trip point.
func (h *HedgeState) Healthy(r BreakerRate) bool { return !r.Reached(h.cfg.SuppressAt) }

// Value is the value gate: with WinRate set, it spends the allowance's
// credit, deficit-accounted (each opportunity adds the allowance; a hedge
// starts when the credit reaches 1). Without WinRate it always passes.
func (h *HedgeState) Value(now time.Time) bool {
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
func (h *HedgeState) judge(now time.Time) {
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
func (h *HedgeState) Allowance(now time.Time) float64 {
	if h.cfg.WinRate == nil {
		return 1
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.judge(now)
	return h.allowance
}

// Started records a hedge that was sent.
func (h *HedgeState) Started(now time.Time) {
	h.win.Add(now, hedgeStarted, 1)
	if h.cfg.WinRate != nil {
		h.mu.Lock()
		h.started++
		h.mu.Unlock()
	}
}

// Won records a hedge that answered first.
func (h *HedgeState) Won(now time.Time) {
	h.win.Add(now, hedgeWon, 1)
	if h.cfg.WinRate != nil {
		h.mu.Lock()
		h.won++
		h.mu.Unlock()
	}
}

// WinRate returns the hedges started and won over the window. A hedge is
// counted as won in the slice it won in, which may be one after the slice
// it started in, so won is capped at started.
func (h *HedgeState) WinRate(now time.Time) (started, won uint64) {
	var s [hedgeCounters]uint64
	h.win.Sums(now, s[:])
	return s[hedgeStarted], min(s[hedgeWon], s[hedgeStarted])
}
