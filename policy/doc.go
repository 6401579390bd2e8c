// Package policy is what a resilix user writes and reads: the policies'
// configs, written as plain struct literals in a Set; the errors a refused
// call returns; and the Observer, whose events say what the policies did.
// The runtime state the transport keeps per upstream key lives elsewhere,
// out of sight.
//
// The chain's order is fixed:
//
//	Retry → Hedge → Throttler → Breaker → Limiter → Bulkhead → RateLimit → Timeout → base
//
// A nil policy is off; a non-nil zero-valued one is on with the defaults its
// field docs give ("If zero, ... is used."), which are the recommended
// production settings. Set.Validate reports every invalid field by name;
// transport.New calls it, so nothing here panics on a config that passed.
//
// Retry and Hedge are the amplifiers: they send more than one wire call
// per logical call, and Set.Attempts bounds the wire calls of both together
// while one Budget per key bounds those that do not pay off (retries that
// fail, hedges that lose) as a share of the traffic. The
// admission gates (Throttler, Breaker, Limiter, Bulkhead, RateLimit) are
// asked by every wire attempt, hedges included, and either admit it with a
// permit, released once with the attempt's outcome, or refuse it with a
// *RejectedError that matches ErrRejected and the gate's own sentinel.
//
// Outcomes are what the dependency's health is judged on: Classify (by
// default DefaultClassify) says Success or Failure; Canceled (the caller
// gave up), Discarded (resilix cancelled a hedge loser) and Invalid (a
// request net/http refused to send as it is) are not evidence and teach
// no policy anything.
//
// The Observer receives what the policies did, call by call.
package policy
