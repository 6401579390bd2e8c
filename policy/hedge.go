package policy

import (
	"time"
)

// Hedge sends another copy of a slow call and takes whichever answers
// first, cancelling the others: a second copy once the call has waited the
// threshold, and, by default, a third a threshold later if neither has
// answered (see MaxConcurrent).
//
// A call is slow when it has waited longer than a live quantile of the
// scope's recent latency, never a constant: during a brownout the quantile
// rises with the latency, so the share of calls hedged stays near
// 1 − Quantile instead of every call doubling. There is no fixed-delay
// option, on purpose.
//
// The quantile is taken over Window, rescanned every Window/32, and
// follows the last seconds when they hold at least 10/(1 − Quantile)
// latencies (200 for the p95: about 110 calls a second at the defaults)
// and say, by more than their own noise, that the latency moved (a
// confidence bound on their quantile, one standard deviation of its rank
// away from it toward Window's, lies in another bucket). Up: Window's
// quantile lags a rising latency by a twentieth of Window, over a second
// at the default 30s, and would hedge every call in between; the last
// second or two raise the threshold a few dozen calls after a step up,
// and a threshold they raised holds while they say it. Down: the last two
// or three periods (about 2s) bring a brownout's threshold back to the
// calm's within about 3s of its end instead of staying up until Window
// has forgotten it. On steady traffic the last seconds, which say the
// same as Window, rarely move the threshold by chance. Once enough
// attempts have been slower than a threshold the last seconds were read
// for to move their bound, it is rescanned, rather than at the end of
// its period. On a quieter scope it follows Window alone. Attempts that
// failed faster than the threshold are left out of the last periods'
// quantile, so a dependency that fails every call at once cannot pull the
// threshold down to its speed. In virtual time over an in-memory upstream
// at 250 calls a second, with the budget off, the share of calls hedged
// at the p95 is 2.6% for an upstream at 1 ms for 3 s and 4 ms for 1 s,
// over and over, 1.7% for one whose latency rises 1 ms a second, and 5.4%
// for one whose latency rises by a quarter every 2 s (from 1 ms to about
// 100 ms: a step's calls sent before its first answer are hedged whatever
// the threshold); after an 8 s brownout (calm 4 ms with 3% of calls at
// 100 ms; brownout 35-45 ms) the p99 of the calls 3-8 s after it equals
// the calm's (8.2 ms):
//
//	go test -count=1 -run 'TestHedgedShareFollows|TestHedgeThresholdComesDownAfterABrownout' -v ./transport
//
// The same brownout over loopback, whose figures move with the machine's
// load (see docs/performance.md):
//
//	RESILIX_HEDGE_RECOVERY=1 go test -count=1 -run '^TestHedgeRecovery$' -v ./transport
//
// Hedge follows Retry's rule for what may be sent twice: a plain POST is
// never hedged (the exception Retry makes for an attempt that never reached
// the server does not apply: a hedge is sent while the first leg may be
// on the server). A body without GetBody is hedged from the copy
// Set.ReplayBuffer keeps, once the first leg has sent all of it: a hedge
// due before then waits for the body and is sent as it completes, unless
// the first leg answers first (HedgeBodyPending).
//
// Each hedge takes one token from the scope's Budget before the admission
// gates are asked, gives it back if a later step refuses it, and if it
// wins: only the hedges that lose or fail keep it spent (HedgeBudget when
// none is left). On a key with a RateLimit a hedge takes a token only
// from a bucket full but for one, and never waits (see RateLimit).
type Hedge struct {
	// Quantile of recent attempt latency after which a hedge is
	// considered, in (0, 1). If zero, 0.95 is used.
	Quantile float64

	// MaxConcurrent is the most legs of one call in flight at once,
	// the first included; each leg after the second is sent a threshold
	// after the one before. If zero, 3 is used, and the Set's Attempts
	// bound it; otherwise it must be at least 2 and at most Attempts,
	// which bound the legs of a call in all.
	//
	// The third leg is for the calls whose hedge drew the slow tail too:
	// with 3% of calls slow, 0.09% of calls are slow on both legs, which
	// is the p99.9, and only they get a third: it keeps the p99.9 near two
	// thresholds for about the same extra wire calls, and adds nothing in
	// a brownout, where the threshold follows the latency
	// (docs/performance.md measures both). The budget bounds every leg
	// alike. Set 2 for at most one hedge per call.
	MaxConcurrent int

	// MinSamples is the number of latencies the window must hold
	// before any hedge is sent. If zero, 20 is used.
	MinSamples int

	// Window is how much latency history the quantile is taken over, and
	// how long a threshold a brownout raised stays up on a scope too quiet
	// to bring it down sooner (see Hedge). If zero, 30s is used.
	Window time.Duration

	// SuppressAt stops hedging when the scope's error rate reaches this
	// fraction of the breaker's trip point, in (0, 1]. If zero, 0.5 is
	// used; 1 suppresses only where the breaker would trip anyway.
	SuppressAt float64

	// WinRate, when set, backs hedging off while hedges rarely win.
	WinRate *WinRate

	// Tied, when true, ties a call's first leg and its hedge where the
	// upstream's servers say when a request starts (package admission
	// does): both legs are marked, the hedge, its twin, goes out as soon
	// as the first leg could have said it started (twice the quickest
	// such signal lately), not after the quantile, and the first leg to
	// say it started has the other cancelled while it still waits in its
	// server's queue. A hedge then costs the servers a queue slot, not the
	// work, and the calls it rescues are those that queue, not only the
	// slowest 1 − Quantile. A key learns whether its upstream speaks ties
	// from its first legs, which it marks until a signal comes, and
	// hedges as usual where none comes. See the package doc of transport,
	// "Tied requests".
	Tied bool
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
	h.MaxConcurrent = or(h.MaxConcurrent, 3)
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

// The hedging gates. When a hedge timer fires they are asked in this
// order: HedgeWarming to HedgeValue, which spend nothing; a body still
// being sent is waited for (HedgeBodyPending if the first leg answers
// first); the budget's token is taken (HedgeBudget), then the body
// (HedgeBodyError, HedgeBodyTooLarge), then the admission gates, the
// rate limit last (HedgeRejected). A refusal gives back what the steps
// before it took (the budget's token, the gates' permits); the rate
// limit's token, which cannot be given back, is the last thing taken, and
// WinRate's credit is spent only once the hedge is sent.
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
	// HedgeBudget: the shared retry-and-hedge budget had no token. The
	// round asks again one threshold later (three times, then backing
	// off), so a slow call may be refused more than once before it is
	// hedged.
	HedgeBudget
	// HedgeRejected: an admission gate (breaker, bulkhead, rate limit, ...)
	// refused the hedge leg.
	HedgeRejected
	// HedgeBodyError: Request.GetBody failed for the hedge leg, or the
	// caller's body (one without GetBody, kept for replay) failed as it
	// was read.
	HedgeBodyError
	// HedgeBodyPending: the request's body has no GetBody, and a hedge
	// that came due while the first leg was still sending it waited for
	// the copy, but the first leg answered before it had sent all of it.
	HedgeBodyPending
	// HedgeBodyTooLarge: the request's body has no GetBody and was larger
	// than Set.ReplayBuffer, so no copy of it was kept.
	HedgeBodyTooLarge
)

var suppressReasonNames = [...]string{"", "warming", "deadline", "concurrency", "priority", "health", "value", "budget", "rejected", "body_error", "body_pending", "body_too_large"}

// String returns the reason's name as it appears in metrics.
func (r SuppressReason) String() string {
	return enumName(suppressReasonNames[:], int(r), "suppress_reason")
}
