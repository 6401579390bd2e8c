package policy

import "time"

// Limiter is an adaptive concurrency limit per scope, learned from latency
// (the gradient family of Netflix's concurrency-limits and Envoy's adaptive
// concurrency filter), with a bounded priority queue in front of it.
//
// An attempt holds a place from admission to its response headers, and its
// latency is measured from dispatch to headers, so neither queueing in the
// limiter nor a slow reader of the body is learned. About once per round
// trip the limit is scaled by how far latency rose above the dependency's
// baseline, min(1, max(0.5, 1.5 × baseline / recent)), and grows by
// √limit only when the limit was actually in use, so that an idle client
// does not inflate it and hedging does not shrink it.
//
// From the start, and again once the limit has gone unused for
// SlowStartIdle, the limiter is in slow start, as a TCP connection is (RFC
// 5681): each round trip of calls admitted at the limit (once calls found
// it reached), while their latency stayed under 1.25 × the baseline and no
// more than a tenth of them failed, doubles the limit (by less the nearer
// the latency came to 1.25 ×), within MaxLimit; the first round trip at the
// limit that does not ends slow start. A doubling is judged only on calls admitted
// under the doubled limit, so it stops within 2.5 times the capacity of a
// dependency that queues (400 callers on 25 to 60 workers behind a FIFO: at
// most 2.18 times them). A step in demand on a dependency with room for it
// is admitted within a few round trips (400 callers on a 50 ms handler,
// refused ones back 50 ms later: 86.6 to 92.6% of their requests admitted
// over the first 2 s, all over the second second, in admission's
// TestFlashCrowdIsAdmitted); on one at its capacity, slow start ends at the
// first round trip whose latency rose, and the limit is shed back as below.
//
// A lower limit is kept only if it works: the next round trip's calls,
// those admitted under it, must be faster, about in proportion to the
// calls it holds back. If not, the limit is restored (an Observer sees it
// go down and back up); if it held nobody back, or the calls were no
// faster for far fewer in flight, their latency also becomes the baseline:
// it is not a queue the limit can relieve. So latency the client adds
// itself (its own CPU on a busy machine, refused callers that call again
// at once), or a dependency slow for everyone, does not drive the limit
// down: at worst it dips for one round trip in two. A queue that this
// client's own calls build at the dependency is still shed: each shrink
// lowers the latency in proportion, and stands.
//
// When the limit is reached an attempt may wait in a queue of
// ceil(QueueFactor × limit) places, highest priority first; no wait
// outlives the caller's context. Under pressure it sheds bottom-up before
// queueing: Bulk first, then BestEffort, then Degraded, and within a
// priority the tenant furthest above its fair share; Critical only when the
// queue is full. A refusal is a *RejectedError matching ErrShed; a wait the
// caller's context ends returns the context's error. A hedge leg never
// waits: a hedge that would have to queue is not sent.
type Limiter struct {
	// InitialLimit is the concurrency limit before anything is learned,
	// within [MinLimit, MaxLimit]. If zero, 20 is used, or MinLimit if
	// larger, or MaxLimit if smaller.
	InitialLimit int
	// MinLimit is the lowest the limit goes. If zero, 1 is used.
	MinLimit int
	// MaxLimit is the highest the limit goes. If zero, 1000 is used.
	MaxLimit int
	// QueueFactor sizes the wait queue as a multiple of the current limit:
	// ceil(QueueFactor × limit) calls may wait for a slot. If zero, 0.5 is
	// used (Google SRE book, chapter 22: small queues relative to
	// capacity). If negative, nothing waits.
	QueueFactor float64
	// SlowStartIdle is how long the limit must go unused before the
	// limiter is in slow start again, as it is when it begins: unused means
	// that no call found the limit reached or was admitted with half of it
	// or more in flight. The limit itself is kept. If zero, 1s is used
	// (TCP's least retransmission timeout, after which RFC 5681 restarts
	// slow start). If negative, there is no slow start: the limit grows by
	// at most √limit a round trip from the start.
	SlowStartIdle time.Duration
}

// Limiter's defaults, which validate and WithDefaults share; the field
// docs say why each.
const (
	limMinLimit      = 1
	limMaxLimit      = 1000
	limInitialLimit  = 20
	limQueueFactor   = 0.5
	limSlowStartIdle = time.Second
)

func (l *Limiter) validate() error {
	minLimit, maxLimit := or(l.MinLimit, limMinLimit), or(l.MaxLimit, limMaxLimit)
	return joinErrs(
		fieldErrIf(l.InitialLimit < 0, "Limiter.InitialLimit", "must be >= 0, got %d", l.InitialLimit),
		fieldErrIf(l.MinLimit < 0, "Limiter.MinLimit", "must be >= 0, got %d", l.MinLimit),
		fieldErrIf(l.MaxLimit < 0, "Limiter.MaxLimit", "must be >= 0, got %d", l.MaxLimit),
		fieldErrIf(minLimit > 0 && maxLimit > 0 && minLimit > maxLimit,
			"Limiter.MinLimit", "(%d) must be <= Limiter.MaxLimit (%d)", minLimit, maxLimit),
		fieldErrIf(l.InitialLimit > 0 && minLimit > 0 && l.InitialLimit < minLimit,
			"Limiter.InitialLimit", "(%d) must be >= Limiter.MinLimit (%d)", l.InitialLimit, minLimit),
		fieldErrIf(l.InitialLimit > 0 && maxLimit > 0 && l.InitialLimit > maxLimit,
			"Limiter.InitialLimit", "(%d) must be <= Limiter.MaxLimit (%d)", l.InitialLimit, maxLimit),
		fieldErrIf(l.QueueFactor != l.QueueFactor || l.QueueFactor > 100,
			"Limiter.QueueFactor", "must be a number <= 100, got %v", l.QueueFactor),
	)
}

// WithDefaults returns l with every zero field set to its default, and
// InitialLimit brought within [MinLimit, MaxLimit].
func (l Limiter) WithDefaults() Limiter {
	l.MinLimit = or(l.MinLimit, limMinLimit)
	l.MaxLimit = or(l.MaxLimit, limMaxLimit)
	l.InitialLimit = min(max(or(l.InitialLimit, limInitialLimit), l.MinLimit), l.MaxLimit)
	l.QueueFactor = or(l.QueueFactor, limQueueFactor)
	l.SlowStartIdle = or(l.SlowStartIdle, limSlowStartIdle)
	return l
}
