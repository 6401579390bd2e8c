package policy

import (
	"time"
)

// Breaker is a circuit breaker per scope: closed, open, half-open
// (https://martinfowler.com/bliki/CircuitBreaker.html), which judges the
// dependency against what is normal for it, so that a flaky host is not
// taken for a dead one.
//
// Closed, it admits every attempt and counts outcomes over Window. After a
// Failure it opens on either of two rules:
//
//   - A run of failures that is improbable for the dependency's own
//     failure rate p: the fewest k failures in a row with p^k ≤ 10⁻⁶, and
//     at least five. A dead host trips after five calls, as does one that
//     jumps to failing everything from a low baseline; a host that steadily
//     fails 20% needs nine in a row, one at 35% fourteen, so steady
//     flakiness never trips it. Failures of attempts that were in flight
//     together count once in a run, so that many callers do not make runs
//     likely. An explicit ConsecutiveFailures replaces this rule with a
//     plain count.
//   - A failure rate over the window that is, with 99.87% confidence (the
//     lower Wilson bound at z = 3), above a trip point relative to the
//     dependency's baseline failure rate, min(0.9, max(0.2, 3 × baseline)),
//     or 0.5 until a baseline has been learned, judged only with MinCalls
//     outcomes, two of them failures: one unlucky call is never a trend.
//     Or, when FailureRatio is set, a failure rate at or above it, read as
//     written once the window holds MinCalls outcomes, with no confidence
//     bound and no least number of failures: FailureRatio 0.5 with MinCalls
//     4 trips on a host failing every call at its fourth call, and
//     FailureRatio 0.05 with MinCalls 20 at 1 failure in 20. The guards
//     against chance are for the trip point the breaker derives, not for a
//     number the caller named.
//
// The baseline is learned continuously while closed, from every slice of
// the window (Window/4) that holds MinCalls outcomes, as a moving average
// over about twenty of them, each clamped to the trip point (so an outage
// teaches at most the trip point), and is kept across openings: a service
// that always fails 10% of calls is healthy at 12% and broken at 50%; one
// that always fails 35% is healthy at 35%.
//
// Open, it refuses every attempt, every priority alike, with a
// *RejectedError matching ErrCircuitOpen whose RetryAfter is the time left.
// Recovery is a backoff: the first opening lasts FirstOpenFor, and after
// each failed probe the next one lasts an eighth of the time since the
// trip, up to OpenFor, so a short outage is over for callers about a second
// after it ends while a long one costs a few probes every OpenFor. Each
// opening is jittered up by as much as 25%, so that breakers that opened
// together do not probe in lockstep. Half-open, Probes attempts go
// through; the first probe's Success closes it, a Failure opens it again.
//
// It learns at response headers, from the outcome Classify gives, and holds
// nothing past them. Canceled attempts (the caller gave up) and Discarded
// ones (a hedge loser) teach it nothing, and a request net/http refuses to
// send (an unsupported scheme, an invalid header or URL: Invalid) is no
// outcome at all: a caller's bug cannot open the breaker for every caller
// of the host. Observer.BreakerTransition hears
// every change of state.
type Breaker struct {
	// ConsecutiveFailures, when positive, trips the breaker after that
	// many failures in a row, whatever the dependency's normal failure
	// rate. If zero, the run rule above is used: the run that trips grows
	// with the dependency's own failure rate, from five. If negative, no
	// run of failures trips it; only a rate does.
	ConsecutiveFailures int

	// FailureRatio, when positive, trips the breaker at a failure that
	// puts the windowed failure rate (failures / outcomes) at or above it,
	// in (0, 1], once the window holds MinCalls outcomes: an absolute
	// ceiling, read exactly as written, on top of the relative trip, which
	// is always on. If zero, only the relative rules apply.
	FailureRatio float64

	// MinCalls is the number of outcomes the window must hold before a
	// rate is judged (and, against the relative trip point, at least two
	// of them must be failures). It is
	// also the fewest outcomes a slice needs to count towards the
	// baseline. If zero, 20 is used.
	MinCalls int

	// Window is how much history the failure rate is taken over. If zero,
	// 30s is used.
	Window time.Duration

	// FirstOpenFor is how long the first opening lasts, before jitter;
	// later openings grow from it (see above). If zero, 1s is used, or
	// OpenFor if that is shorter. If negative, every opening lasts OpenFor.
	// It must not be above OpenFor.
	FirstOpenFor time.Duration

	// OpenFor is the longest an opening lasts before the breaker lets
	// probes through, before jitter: each opening lasts a uniform draw in
	// [d, 1.25·d) for its length d, at most OpenFor, so breakers that
	// opened together do not probe together. If zero, 5s is used.
	OpenFor time.Duration

	// Probes is the number of calls admitted at once while half-open. If
	// zero, 3 is used.
	Probes int
}

// Breaker's defaults, which validate and WithDefaults share; the field
// docs say why each.
const (
	brkMinCalls     = 20
	brkWindow       = 30 * time.Second
	brkOpenFor      = 5 * time.Second
	brkFirstOpenFor = time.Second // at most OpenFor
	brkProbes       = 3
)

func (b *Breaker) validate() error {
	openFor := or(b.OpenFor, brkOpenFor)
	return joinErrs(
		fieldErrIf(b.FailureRatio < 0 || b.FailureRatio > 1 || b.FailureRatio != b.FailureRatio,
			"Breaker.FailureRatio", "must be in [0, 1], got %v", b.FailureRatio),
		fieldErrIf(b.MinCalls < 0, "Breaker.MinCalls", "must be >= 0, got %d", b.MinCalls),
		fieldErrIf(b.Window < 0, "Breaker.Window", "must be >= 0, got %v", b.Window),
		fieldErrIf(b.OpenFor < 0, "Breaker.OpenFor", "must be >= 0, got %v", b.OpenFor),
		fieldErrIf(b.OpenFor >= 0 && b.FirstOpenFor > openFor,
			"Breaker.FirstOpenFor", "(%v) must be <= Breaker.OpenFor (%v): OpenFor is the longest opening", b.FirstOpenFor, openFor),
		fieldErrIf(b.Probes < 0, "Breaker.Probes", "must be >= 0, got %d", b.Probes),
	)
}

// WithDefaults returns b with every zero field set to its default.
// ConsecutiveFailures stays zero: that is the run rule.
func (b Breaker) WithDefaults() Breaker {
	b.MinCalls = or(b.MinCalls, brkMinCalls)
	b.Window = or(b.Window, brkWindow)
	b.OpenFor = or(b.OpenFor, brkOpenFor)
	b.FirstOpenFor = or(b.FirstOpenFor, min(brkFirstOpenFor, b.OpenFor))
	b.Probes = or(b.Probes, brkProbes)
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
	// BreakerIsolated refuses every call, of every priority, with
	// ErrIsolated (which matches ErrCircuitOpen), until an operator
	// releases it: transport.Transport.Isolate puts a key in it and
	// Release takes it out. The breaker's own rules never enter or leave
	// it.
	BreakerIsolated
)

var breakerStateNames = [...]string{"closed", "open", "half_open", "isolated"}

// String returns "closed", "open", "half_open" or "isolated".
func (s BreakerState) String() string { return enumName(breakerStateNames[:], int(s), "breaker_state") }
