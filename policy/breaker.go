package policy

import (
	"time"
)

// Breaker is a circuit breaker per scope: closed, open, half-open
// (https://martinfowler.com/bliki/CircuitBreaker.html), with a trip point
// that learns what normal looks like for the dependency.
//
// Closed, it admits every attempt and counts outcomes over Window. After a
// Failure it opens when ConsecutiveFailures attempts failed in a row, when
// the window's failure rate reaches FailureRatio (if set), or when the rate
// exceeds a trip point relative to the dependency's own baseline failure
// rate, min(0.9, max(0.2, 3 × baseline)), or 0.5 until a baseline has been
// learned: a service that always fails 10% of calls is healthy at 12% and
// broken at 50%. A rate is judged only with MinCalls outcomes, two of them
// failures: one unlucky call is never a trend.
//
// Open, it refuses every attempt, every priority alike, with a
// *RejectedError matching ErrCircuitOpen whose RetryAfter is the time left.
// After OpenFor (jittered by up to 25%, so that breakers that opened
// together do not probe in lockstep) it is half-open: Probes attempts go
// through, and the first probe's Success closes it, a Failure opens it
// again.
//
// It learns at response headers, from the outcome Classify gives, and holds
// nothing past them. Canceled attempts (the caller gave up) and Discarded
// ones (a hedge loser) teach it nothing, and a request net/http refuses to
// send (an unsupported scheme, an invalid header or URL: Invalid) is no
// outcome at all: a caller's bug cannot open the breaker for every caller
// of the host. Observer.BreakerTransition hears
// every change of state.
type Breaker struct {
	// ConsecutiveFailures trips the breaker after that many failures in a
	// row. If zero, 5 is used. If negative, consecutive failures alone
	// never trip it.
	ConsecutiveFailures int

	// FailureRatio, when positive, trips the breaker when the windowed
	// failure rate reaches it, in (0, 1]: an absolute ceiling on top of
	// the relative trip, which is always on. If zero, only the relative
	// trip and ConsecutiveFailures apply.
	FailureRatio float64

	// MinCalls is the number of outcomes the window must hold before a
	// rate is judged (and at least two of them must be failures). It is
	// also the fewest outcomes a period needs to count towards the
	// baseline. If zero, 20 is used.
	MinCalls int

	// Window is how much history the failure rate is taken over. If zero,
	// 30s is used.
	Window time.Duration

	// OpenFor is how long the breaker stays open before it lets probes
	// through, before jitter: each opening lasts a uniform draw in
	// [OpenFor, 1.25·OpenFor), so breakers that opened together do not
	// probe together. If zero, 5s is used.
	OpenFor time.Duration

	// Probes is the number of calls admitted at once while half-open. If
	// zero, 3 is used.
	Probes int
}

func (b *Breaker) validate() error {
	return joinErrs(
		fieldErrIf(b.FailureRatio < 0 || b.FailureRatio > 1 || b.FailureRatio != b.FailureRatio,
			"Breaker.FailureRatio", "must be in [0, 1], got %v", b.FailureRatio),
		fieldErrIf(b.MinCalls < 0, "Breaker.MinCalls", "must be >= 0, got %d", b.MinCalls),
		fieldErrIf(b.Window < 0, "Breaker.Window", "must be >= 0, got %v", b.Window),
		fieldErrIf(b.OpenFor < 0, "Breaker.OpenFor", "must be >= 0, got %v", b.OpenFor),
		fieldErrIf(b.Probes < 0, "Breaker.Probes", "must be >= 0, got %d", b.Probes),
	)
}

// WithDefaults returns b with every zero field set to its default.
func (b Breaker) WithDefaults() Breaker {
	b.ConsecutiveFailures = or(b.ConsecutiveFailures, 5)
	b.MinCalls = or(b.MinCalls, 20)
	b.Window = or(b.Window, 30*time.Second)
	b.OpenFor = or(b.OpenFor, 5*time.Second)
	b.Probes = or(b.Probes, 3)
	return b
}

// BreakerState is the state of a circuit breaker.
type BreakerState uint8

const (
	// BreakerClosed admits every call and counts outcomes.
	BreakerClosed BreakerState = iota
	// BreakerOpen refuses every call, of every priority, with
	// ErrCircuitOpen.
	BreakerOpen
	// BreakerHalfOpen admits a few probes; a probe's success closes the
	// breaker, its failure opens it again.
	BreakerHalfOpen
)

var breakerStateNames = [...]string{"closed", "open", "half_open"}

// String returns "closed", "open" or "half_open".
func (s BreakerState) String() string { return enumName(breakerStateNames[:], int(s), "breaker_state") }
