package policy

import "time"

// Snapshot is what one key's state has learned, read at one instant: what
// transport.Transport.Measured returns, and what a StateSource reports
// for each key. It is a plain value; building one allocates nothing.
//
// Each policy has a presence flag, Has<Policy>, true when the key runs
// that policy. A policy's fields are meaningful only under its flag; when
// it is false they are zero, and zero would read as a state the key is not
// in (BreakerState's zero is BreakerClosed): check the flag first, so that
// a dashboard never shows a closed breaker that does not exist. Measured
// values are zero until there is evidence.
//
// The zero Snapshot is a key with no state: never called, or forgotten
// under transport.Config.MaxKeys.
type Snapshot struct {
	// Known is false when the key has no state; every other field is
	// then zero.
	Known bool

	// HasHedge is true when the key hedges. HedgeThreshold is the latency
	// after which a call would be hedged, zero until the latency window
	// has Hedge.MinSamples. HedgesStarted and HedgesWon count the hedges
	// of the hedge window; their ratio is the win rate. HedgeAllowance is
	// the share of due hedges that Hedge.WinRate lets through (1 without
	// it).
	HasHedge                 bool
	HedgeThreshold           time.Duration
	HedgesStarted, HedgesWon uint64
	HedgeAllowance           float64

	// HasBudget is true when retries and hedges draw from a budget (the
	// key retries or hedges); BudgetBalance is the tokens left.
	HasBudget     bool
	BudgetBalance float64

	// HasThrottler is true when the key runs the adaptive throttler; its
	// rejection probability is part of Pressure.
	HasThrottler bool

	// HasBreaker is true when the key runs a circuit breaker, or has
	// been isolated (transport.Transport.Isolate): a key without a
	// Breaker then has one that only Isolate and Release move, and whose
	// ErrorRate and TripPoint stay zero. BreakerState is its state,
	// BreakerIsolated while an operator holds it; ErrorRate and TripPoint
	// are its windowed failure rate and the rate at which it trips.
	HasBreaker           bool
	BreakerState         BreakerState
	ErrorRate, TripPoint float64

	// HasLimiter is true when the key runs the adaptive concurrency
	// limiter. LimiterLimit is the limit, LimiterInFlight the attempts
	// holding it and LimiterQueued those waiting for it.
	HasLimiter                                   bool
	LimiterLimit, LimiterInFlight, LimiterQueued int

	// HasBulkhead is true when the key runs a bulkhead;
	// BulkheadInFlight is the number of its slots held.
	HasBulkhead      bool
	BulkheadInFlight int

	// HasRateLimit is true when the key runs a rate limit.
	HasRateLimit bool

	// RateLimitStore is the state of the rate limit's shared store
	// (RateLimit.Shared), zero when it has none. RateLimitLeased is the
	// number of tokens leased from it that the key holds unspent.
	RateLimitStore  StoreState
	RateLimitLeased int

	// Pressure is how hard the shedding gates are pushing back, in [0, 1]:
	// the larger of the limiter's queue fill and the throttler's
	// rejection probability; zero without either.
	Pressure float64

	// MalformedHeaders counts priority headers on requests and
	// Retry-After headers on 429 and 503 responses that could not be
	// parsed, and
	// tenant ids that Set.Propagate did not write, too long or not a
	// valid header value (see Observer.MalformedHeader).
	MalformedHeaders uint64

	// RepeatsSentOnce counts the calls sent once, neither retried nor
	// hedged and with the budget untouched, because the request they
	// were made for was itself a retry or a hedge of its caller's call
	// (attempt.Repeated). Only keys that retry or hedge count them.
	RepeatsSentOnce uint64

	// PushbackLeft is how long the throttler's pushback still holds the
	// key's Bulk and BestEffort attempts back (see Throttler), zero when
	// it does not; PushbackStopped is true while they are stopped (a
	// 503's Retry-After), and PushbackRate is, while they are paced (a
	// 429's), the pace in attempts per second, all priorities together,
	// or zero while the pace has no limit yet. Meaningful under
	// HasThrottler.
	PushbackLeft    time.Duration
	PushbackStopped bool
	PushbackRate    float64

	// HasReplicas is true when the key sends over lanes (Set.Replicas).
	// Lanes is the number of lanes it picks from (lanes draining after
	// their address left are not counted), LanesEjected the number of
	// them ejected now, and LanesIgnored the addresses past MaxLanes in
	// Endpoints' last answer.
	HasReplicas                       bool
	Lanes, LanesEjected, LanesIgnored int

	// PerLane is each lane the key picks from, at its index
	// (LaneEjection.Index, AttemptInfo.LaneIndex), with its state and
	// address; an index with no lane has the zero LaneSnapshot. Lanes
	// draining after their address left are not in it. Meaningful under
	// HasReplicas.
	PerLane [MaxLanes]LaneSnapshot
}
