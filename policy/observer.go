package policy

import (
	"context"
	"time"

	"github.com/resilix/resilix/shedding"
)

// Observer receives what resilix does to each call, in the style of
// net/http/httptrace.ClientTrace: a struct of optional funcs, so it can grow
// without breaking anyone. A nil func, or a nil *Observer, costs nothing.
//
// The funcs are called synchronously on the goroutine that made the
// decision, never with a lock held, and may be called concurrently: they
// must be safe for concurrent use and should return quickly. The info
// structs are passed by value and may be kept.
//
// Packages otelmetrics (metrics), oteltrace (span events) and
// slogobserver (log/slog records) each return one; JoinObservers
// combines them with funcs of one's own.
type Observer struct {
	// CallDone is called once per RoundTrip, just before it returns
	// (except for a request with no URL, which has no key).
	CallDone func(CallInfo)

	// AttemptDone is called once per wire attempt: when its response
	// headers or error arrive, or, for a leg resilix cancelled, at the
	// moment of cancellation (Outcome Discarded). The legs of a hedged
	// call are reported from their own goroutines, so some may arrive
	// after the call's CallDone.
	AttemptDone func(AttemptInfo)

	// Refused is called when a gate refuses an attempt, and, on a
	// server, when package admission refuses a request (GateDeadline,
	// GateAdmission).
	Refused func(Refusal)

	// RetrySkipped is called when a failed attempt is not retried for a
	// reason other than the attempts running out.
	RetrySkipped func(RetrySkip)

	// HedgeStarted is called when a hedge leg is sent, HedgeWon when a
	// hedge leg's response is the one the caller gets. The win rate is
	// won / started.
	HedgeStarted func(HedgeInfo)
	HedgeWon     func(HedgeInfo)

	// With Hedge.Tied, TieCancelled is called when a leg of a tied round
	// is cancelled because another leg said it started first (the leg
	// was then, as far as the client knows, still waiting in its
	// server's queue), and TieRanTwice when a second leg of a round says
	// it started: both legs reached a handler before either signal
	// reached the client, the duplicate work ties cost. A tied hedge leg
	// is reported to HedgeStarted with HedgeInfo.Tied.
	TieCancelled func(HedgeInfo)
	TieRanTwice  func(HedgeInfo)

	// HedgeSuppressed is called when a hedge was due but a hedging gate
	// stopped it, with the gate's reason.
	HedgeSuppressed func(HedgeSuppression)

	// BreakerTransition is called when a scope's breaker changes state,
	// by its own rules or by an operator's hand (to and from
	// BreakerIsolated, and ResetBreaker's close).
	BreakerTransition func(BreakerTransition)

	// MalformedHeader is called when a header resilix reads cannot be
	// parsed: a priority (the call goes on as Critical) or a 429's or
	// 503's Retry-After (the backoff alone decides the wait); when a
	// tenant id that Set.Propagate would write is not a valid header
	// value, or longer than transport.MaxTenantLen (it is then not
	// written); on a server, package admission's priority, timeout
	// and attempt headers (treated as absent).
	MalformedHeader func(MalformedHeader)

	// LimitTransition is called when a scope's adaptive concurrency limit
	// moves.
	LimitTransition func(LimitTransition)

	// Attach is called once by each transport built with this Observer,
	// from transport.New, with a source of the transport's current state:
	// observers that report gauges read it when they are collected,
	// rather than being pushed every change.
	//
	// An attachment ends when its transport is garbage collected; there is
	// nothing to call. The source holds its transport weakly, so an
	// Observer may keep it without keeping the transport (and its keys'
	// state) alive, and once the transport is gone the source's States
	// returns false. An Observer that keeps sources should drop each one
	// whose States has returned false, and look for them when it attaches
	// new ones, not only when it is read: then one Observer shared by
	// transports that are built and dropped (one per configuration reload,
	// say) holds the sources of the live ones only, whether or not anything
	// reads it.
	Attach func(StateSource)

	// StoreTransition is called when the shared store of a scope's
	// RateLimit (RateLimit.Shared) starts or stops failing, once per
	// change, from the goroutine that asked the store.
	StoreTransition func(StoreTransition)

	// Pushback is called when an answer arms or extends the throttler's
	// pushback on a key (a 429 or 503 whose Retry-After is within
	// Throttler.MaxPushback), once per such answer. Attempts it then
	// holds back are reported to Refused, with Gate GateThrottler and a
	// positive RetryAfter in the error.
	Pushback func(Pushback)

	// LaneEjected is called when a lane of a key is ejected (see
	// Replicas), from the goroutine whose attempt's outcome ejected it.
	// LaneReturned is called when the first attempt on an ejected lane
	// after its time ends: ejections end lazily, so a lane that is not
	// picked again is not reported back.
	LaneEjected, LaneReturned func(LaneEjection)

	// LanesChanged is called when an answer of a key's Replicas.Endpoints
	// changes the key's lanes (addresses added or removed; the first good
	// answer adds every address), once per such answer, from the
	// goroutine that asked it. An answer that fails, or names the
	// addresses the lanes already have, is not reported.
	LanesChanged func(LaneSetChange)
}

// LaneSetChange describes a change of a key's lanes by an answer of its
// Replicas.Endpoints.
type LaneSetChange struct {
	// Context is context.Background(): Endpoints is asked in the
	// background, on behalf of every call to the key. Never nil.
	Context context.Context
	Key     string
	// Added and Removed are the addresses that got a lane, and those
	// whose lane is draining, in the answer's order and the lanes' order.
	// Bounded: at most MaxLanes each.
	Added, Removed []string
	// Lanes is how many lanes the key has now.
	Lanes int
}

// StateSource reports the current state of every key a transport holds.
// The source a transport gives Observer.Attach does not keep the
// transport alive. It is safe for concurrent use.
type StateSource interface {
	// States calls f once per key the transport holds, with a snapshot of
	// its state, and returns true. Once the transport has been garbage
	// collected, States calls f never and returns false, and so on every
	// later call: the caller should then drop the source. States holds
	// no lock while f runs, and keeps the transport alive while it runs.
	States(f func(key string, s Snapshot)) (alive bool)
}

// LimitTransition describes an adaptive limit's move.
type LimitTransition struct {
	// Context is the context of the call whose attempt moved the state.
	// Never nil.
	Context  context.Context
	Key      string
	From, To int
}

// AttemptKind says why a wire attempt was made.
type AttemptKind uint8

const (
	// AttemptFirst is a call's first wire attempt.
	AttemptFirst AttemptKind = iota + 1
	// AttemptRetry is sent after a failed round, past its backoff.
	AttemptRetry
	// AttemptHedge is sent while an earlier leg of the same round is still
	// in flight, because it was slower than the hedge threshold.
	AttemptHedge
)

var attemptKindNames = [...]string{"", "first", "retry", "hedge"}

// String returns "first", "retry" or "hedge".
func (k AttemptKind) String() string { return enumName(attemptKindNames[:], int(k), "attempt_kind") }

// CallInfo describes one finished logical call.
type CallInfo struct {
	// Context is the caller's: the request's context, for hedge legs and
	// background work too, so that an observer can log or record with
	// the request's trace. Never nil.
	Context  context.Context
	Key      string
	Priority shedding.Priority
	// Outcome is the classification of what the caller got: Success,
	// Failure, Canceled, Rejected when a gate refused it, or Invalid
	// when net/http refused to send the request as it is.
	Outcome Outcome
	// Duration runs from RoundTrip's start to its return (response
	// headers or error).
	Duration time.Duration
	// WireAttempts is how many attempts reached the base RoundTripper.
	WireAttempts int
	// StatusCode is the returned response's status, or 0 with Err set.
	StatusCode int
	Err        error
}

// AttemptInfo describes one wire attempt.
type AttemptInfo struct {
	// Context is the caller's: the request's context, for hedge legs and
	// background work too, so that an observer can log or record with
	// the request's trace. Never nil.
	Context context.Context
	Key     string
	Kind    AttemptKind
	// Attempt is the wire attempt's number within its call, from 1.
	Attempt int
	// Outcome is Success or Failure as classified, Canceled when the
	// caller gave up, Discarded when resilix cancelled the leg, or
	// Invalid when net/http refused to send the request as it is.
	Outcome Outcome
	// Latency runs from dispatch to the base RoundTripper (after the
	// gates) to response headers or error.
	Latency    time.Duration
	StatusCode int
	Err        error
	// Reason says why a retry (Kind AttemptRetry) was sent: RetryAsked,
	// or RetryUnsent when the attempt before it provably never reached
	// the server. It is zero for other kinds.
	Reason RetryReason
	// Lane names the lane the attempt was sent on (Set.Replicas): its
	// address for a lane of Endpoints, or its index, "0" to "63", for a
	// connection lane and for the lane that dials the request's own
	// address until Endpoints answers (LaneEjection's Addr and Index). It
	// is "" without Replicas, and for a hedge leg discarded before it
	// took a lane. Bounded: at most MaxLanes values a key at once.
	Lane string
	// LaneIndex is the index of that lane among the key's lanes, in
	// [0, MaxLanes) (LaneEjection's Index, Snapshot.PerLane's): for a
	// lane of Endpoints too, whose Lane is its address. Meaningful only
	// when Lane is not "".
	LaneIndex int
	// Stalled is true for an attempt its per-attempt timeout ended (Err
	// matches ErrAttemptTimeout, Outcome is as classified, by default
	// Failure) that the client ended 20 ms or more after the timeout's
	// deadline: the client's own
	// process did not run meanwhile (a GC pause, CPU starvation, a
	// SIGSTOP), and the timeout is no evidence about the dependency. The
	// call and its retry go by the timeout as by any other, but the
	// breaker, the throttler, the limiter, the hedge's latency window and
	// the lanes learn nothing from it, as from a caller's cancellation.
	Stalled bool
}

// RetryReason says why a retry was sent.
type RetryReason uint8

const (
	// RetryAsked: the attempt before it asked for a retry (Retry.If
	// said so or, with no If, Classify called it a Failure), and the
	// request may be sent twice (its method, an idempotency key, or
	// MarkRepeatable).
	RetryAsked RetryReason = iota + 1
	// RetryUnsent: the attempt before it failed in a way that proves
	// the request never reached the server (a refused connection, a
	// failed TLS handshake, an HTTP/2 stream refused or never
	// processed), so it was retried whatever its method; see
	// transport's package doc for the exact rule.
	RetryUnsent
)

var retryReasonNames = [...]string{"", "asked", "unsent"}

// String returns the reason's name as it appears in metrics: "asked" or
// "unsent".
func (r RetryReason) String() string { return enumName(retryReasonNames[:], int(r), "retry_reason") }

// Refusal describes a gate's refusal of one attempt.
type Refusal struct {
	// Context is the caller's: the request's context, for hedge legs and
	// background work too, so that an observer can log or record with
	// the request's trace. Never nil.
	Context context.Context
	Key     string
	// Kind is the refused attempt's: a refused hedge leg is also reported
	// as a hedge suppressed with HedgeRejected, and costs the caller
	// nothing; a refused retry is also reported as a retry skipped with
	// SkipGate, and the call ends with the last attempt's response or
	// error; a refused first attempt ends the call with the refusal.
	Kind     AttemptKind
	Gate     Gate
	Priority shedding.Priority
	// HeavyTenant is true when the request's tenant was above its fair
	// share when it was refused.
	HeavyTenant bool
	Err         *RejectedError
}

// SkipReason says why a failed attempt was not retried.
type SkipReason uint8

const (
	// SkipNotReplayable: the request may not be sent twice (method,
	// no idempotency key, not marked repeatable) or its body cannot be
	// replayed.
	SkipNotReplayable SkipReason = iota + 1
	// SkipDeadline: the next attempt could not start before the caller's
	// deadline.
	SkipDeadline
	// SkipBudget: the scope's budget had no token left.
	SkipBudget
	// SkipRetryAfter: the response asked for a longer wait than
	// Retry.MaxRetryAfter.
	SkipRetryAfter
	// SkipBodyError: Request.GetBody failed, or the caller's body failed
	// as it was read and kept for replay.
	SkipBodyError
	// SkipPermanent: the error will not go away by sending again (the
	// server's TLS certificate was not trusted).
	SkipPermanent
	// SkipGate: an admission gate refused the retry (RetrySkip.Gate says
	// which); the caller gets the last attempt's response or error.
	SkipGate
)

var skipReasonNames = [...]string{"", "not_replayable", "deadline", "budget", "retry_after", "body_error", "permanent", "gate"}

// String returns the reason's name as it appears in metrics.
func (r SkipReason) String() string { return enumName(skipReasonNames[:], int(r), "skip_reason") }

// RetrySkip describes a retry that was not sent.
type RetrySkip struct {
	// Context is the caller's: the request's context, for hedge legs and
	// background work too, so that an observer can log or record with
	// the request's trace. Never nil.
	Context  context.Context
	Key      string
	Priority shedding.Priority
	Reason   SkipReason
	// Gate is the gate that refused the retry, when Reason is SkipGate.
	Gate Gate
	// Attempt is the number of the failed attempt that was not retried.
	Attempt int
	// BodyTooLarge, with SkipNotReplayable, says that the request's body
	// had no GetBody and was larger than Set.ReplayBuffer, so no copy of
	// it could be kept.
	BodyTooLarge bool
}

// BreakerTransition describes a breaker's change of state.
type BreakerTransition struct {
	// Context is the context of the call whose attempt moved the state,
	// or context.Background() for a move an operator made
	// (transport.Transport.Isolate, Release and ResetBreaker). Never nil.
	Context  context.Context
	Key      string
	From, To BreakerState
}

// MalformedHeader describes a request header resilix could not parse.
type MalformedHeader struct {
	// Context is the caller's: the request's context, for hedge legs and
	// background work too, so that an observer can log or record with
	// the request's trace. Never nil.
	Context context.Context
	Key     string
	Header  string
	// Value is a copy of at most the first 64 bytes of the value, cut so
	// as not to split a rune: a value of any length costs an observer that
	// keeps it no more.
	Value string
}

// HedgeInfo describes a hedge leg.
type HedgeInfo struct {
	// Context is the caller's: the request's context, for hedge legs and
	// background work too, so that an observer can log or record with
	// the request's trace. Never nil.
	Context  context.Context
	Key      string
	Priority shedding.Priority
	// Attempt is the hedge's wire attempt number within its call.
	Attempt int
	// Threshold is the latency after which the hedge was sent.
	Threshold time.Duration
	// Tied: the leg is a tied round's (see Hedge.Tied), a twin sent
	// after the round's delay for ties rather than after Threshold.
	Tied bool
}

// HedgeSuppression describes a hedge that a gate stopped.
type HedgeSuppression struct {
	// Context is the caller's: the request's context, for hedge legs and
	// background work too, so that an observer can log or record with
	// the request's trace. Never nil.
	Context  context.Context
	Key      string
	Priority shedding.Priority
	Reason   SuppressReason
}

// StoreState is the state of a RateLimit's shared store, as a scope sees
// it: its last answer, and what calls get meanwhile. The zero StoreState is
// no shared store.
type StoreState uint8

const (
	// StoreUp: the store answers, and calls spend the tokens it leases.
	// A scope starts in it.
	StoreUp StoreState = iota + 1
	// StoreFallback: the store's last ask failed, and calls go on under
	// the local bucket (RateLimit.FailOpen).
	StoreFallback
	// StoreRefusing: the store's last ask failed, and calls are refused
	// with ErrRateLimited (RateLimit.FailOpen unset).
	StoreRefusing
)

var storeStateNames = [...]string{"", "up", "fallback", "refusing"}

// String returns "up", "fallback" or "refusing".
func (s StoreState) String() string { return enumName(storeStateNames[:], int(s), "store_state") }

// StoreTransition describes a change of a shared store's state.
type StoreTransition struct {
	// Context carries the values of the context of the call that asked
	// the store (a trace, say) but not its cancellation: the store is
	// asked in the background, on behalf of that call and the ones after
	// it. A hedge leg, which never waits at a gate, asks with none of its
	// caller's values. Never nil.
	Context  context.Context
	Key      string
	From, To StoreState
	// Err is the store's error when To is StoreFallback or StoreRefusing:
	// a timeout matches context.DeadlineExceeded.
	Err error
}

// Pushback describes an answer that armed or extended the throttler's
// pushback: Bulk and BestEffort attempts to the key are held back until
// RetryAfter has passed since it arrived (see Throttler).
type Pushback struct {
	// Context is the caller's: the request's context, for hedge legs and
	// background work too, so that an observer can log or record with
	// the request's trace. Never nil.
	Context context.Context
	Key     string
	// StatusCode is the answer's: 429, which paces Bulk and BestEffort to
	// the rate the upstream accepts, or 503, which stops them.
	StatusCode int
	// RetryAfter is the wait the answer's Retry-After asked for.
	RetryAfter time.Duration
}
