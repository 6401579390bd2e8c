package policy

import (
	"context"
	"math"
	"time"
)

// RateLimit is a token bucket per scope: at most PerSecond calls per
// second on average, Burst at once.
//
// # Priority
//
// Tokens go to the calls that matter most (package shedding), bottom-up as
// the other gates shed. A Critical call, and so a call that carries no
// priority, takes any token and waits for one up to MaxWait, never past its
// deadline: untagged traffic gets a plain token bucket, first come first
// served. A call of a lower priority takes a token only if a reserve is
// left after it, and never waits, whatever MaxWait: it is refused at once
// with ErrRateLimited and a RetryAfter of the time until the bucket holds
// its reserve and one more token. The reserve is one step for Degraded, two
// for BestEffort and three for Bulk, a step being Burst/8 rounded down and
// at least one token, and never more than Burst−1 in all: with Burst 5,
// Bulk leaves 3 tokens, BestEffort 2, Degraded 1. So as the bucket drains,
// Bulk is refused first and Critical last, nothing lower goes ahead of a
// Critical call that waits, and the lower priorities still get every token
// Critical does not take: under a flood of Bulk at 40/s, burst 5, Critical
// calls at 25/s are all admitted and Bulk gets the 15/s they leave
// (TestRateLimitPriorityFlood in transport). With a Burst of 1 there is no
// reserve: lower priorities differ only in never waiting.
//
// A hedge leg is optional work, whatever its call's priority: it takes a
// token only when the bucket is full but for one (most likely the token
// its own call took), never leaves less than Degraded's reserve (and its
// call's), and never waits. With a Burst of 1 or 2 the bucket must be
// full. So hedges take only tokens the bucket would soon have had no room
// for: at 48 untagged calls/s against 50/s, burst 10, Critical calls are
// refused and wait exactly as often with Hedge as without, and at 20/s the
// slow calls are still hedged (TestHedgesLeaveCriticalTheirTokens in
// transport). Every wire attempt that is sent, retries and hedges
// included, spends one token.
//
// # Beyond one process
//
// With Shared set, the limit is a fleet's: a quota that every process
// calling the key shares, kept in a store outside them (package redisrate
// keeps it in Redis). The store is the authority, and PerSecond, Burst and
// MaxWait become the local fallback for when it fails. The store is kept
// off the path of each call:
//
//   - A scope leases tokens from the store in batches of up to Lease, and a
//     call spends a leased token from local memory: one lock, no allocation,
//     no network. When half of a lease of two tokens or more is spent, the
//     next one is asked for in the background, so a busy process does not
//     wait for the store at all. The first ask is for Lease; later ones are
//     sized by the calls of the moment (what they would spend in half a
//     LeaseTTL), from 1 to Lease, so a process that is nearly idle takes
//     one token at a time rather than hoard the fleet's quota. One ask is in
//     flight at a time, so a scope spends at most about a Lease per round
//     trip to the store.
//   - Leased tokens expire LeaseTTL after they were asked for; those unspent
//     by then are dropped, so a process that goes idle does not spend old
//     quota later.
//   - A Critical call that finds no leased token while a lease is on its way
//     waits for it, at most StoreTimeout in all and never past its deadline;
//     a hedge leg does not wait. When the store has no tokens left it says
//     when it will have more, and until then calls are refused with
//     ErrRateLimited and that hint, without asking it again. MaxWait does not
//     apply to leased tokens.
//   - Every ask is bounded by StoreTimeout. When one fails or times out, the
//     store is failing: with FailOpen calls go on under the local bucket
//     (PerSecond, Burst, MaxWait; it starts full), and without it they are
//     refused with ErrRateLimited. Leased tokens left are still spent
//     first. The store is asked again after a backoff (50ms, doubling up to
//     500ms, jittered) by the first call after it, in the background, and
//     the scope recovers by itself on the first answer. No timer runs for
//     an idle scope.
//   - Priority applies to the tokens this process has leased, with Lease
//     as the burst of the reserve above (and to the local bucket when it
//     is the fallback). The store knows nothing of priority: it grants
//     tokens to whichever process asks, so a fleet's Critical calls are
//     favoured over its lower ones within each process, not across them.
//     A call below Critical never waits for a lease; a hedge leg takes a
//     leased token as a Degraded call does (a lease, sized to the demand,
//     is seldom near full), and never waits for one either.
//
// Observer.StoreTransition hears each change of the store's state, once,
// and transport.Transport.Measured shows it (Snapshot.RateLimitStore).
type RateLimit struct {
	// PerSecond is the sustained rate. Required: it must be > 0. With
	// Shared it is the local fallback, used only while the store fails
	// and FailOpen is set: this process's part of the fleet's quota, say.
	PerSecond float64

	// Burst is the bucket's size, at most 2^53, the most tokens it counts
	// exactly. If zero, max(1, ceil(PerSecond/10)) is used, so a PerSecond
	// above 10·2^53 needs a Burst set.
	Burst int

	// MaxWait is how long a Critical call waits for a token; a call of a
	// lower priority never waits (see Priority above). If zero, a call
	// that finds no token fails at once with ErrRateLimited and a
	// RetryAfter hint. A wait never outlives the caller's deadline. With
	// Shared it applies to the local fallback only.
	MaxWait time.Duration

	// Shared, when set, is the store of a rate limit shared beyond this
	// process, the authority on the key's calls; see "Beyond one process"
	// above. The limit itself is configured on the store. If nil, the
	// bucket is this scope's alone, and Lease, LeaseTTL, StoreTimeout and
	// FailOpen must be zero.
	Shared SharedLimiter

	// Lease is the most tokens a scope asks Shared for at once. If zero,
	// ceil(PerSecond/4) is used, at least 1 and at most 2^20: a process
	// spending at its local rate asks the store about four times a second.
	// A store usually grants at most its own burst at once; see its
	// documentation.
	Lease int

	// LeaseTTL is how long leased tokens can be spent, from when they
	// were asked for; those left then are dropped. If zero, one second is
	// used. A longer one lets a process spend quota granted longer ago.
	LeaseTTL time.Duration

	// StoreTimeout bounds each ask to Shared, and so the longest a call
	// waits for a lease. If zero, 50ms is used.
	StoreTimeout time.Duration

	// FailOpen decides what calls get while Shared is failing: true, they
	// go on under the local bucket (PerSecond, Burst, MaxWait); false, the
	// default, they are refused with ErrRateLimited, so the quota is never
	// exceeded, at the cost of failing every call while the store is down.
	FailOpen bool
}

// SharedLimiter is a rate limit kept outside the process, shared by every
// process that asks it for the same key. The limit (how many per period,
// the burst) is configured on the implementation, which also decides how
// keys are named in its store. Package redisrate implements it on Redis.
//
// Take asks for n tokens of key, n >= 1, and returns how many it granted,
// from 0 to n; they are spent once granted. When it grants fewer than n,
// retryAfter is how long until it could grant the rest, and the caller will
// not ask again before then. A non-nil err means that the store could not
// be asked or did not answer, and no token was granted.
//
// Take must return promptly once ctx is done: a scope has one Take in
// flight at a time, and until it returns the scope asks nothing more. ctx
// carries the values of the context of a call that needed the tokens (its
// trace, say), but not its cancellation: the tokens are for later calls
// too. Take must be safe for concurrent use.
type SharedLimiter interface {
	Take(ctx context.Context, key string, n int) (granted int, retryAfter time.Duration, err error)
}

// The defaults of a shared RateLimit.
const (
	// DefaultLeaseTTL is the LeaseTTL used when the field is zero.
	DefaultLeaseTTL = time.Second
	// DefaultStoreTimeout is the StoreTimeout used when the field is zero.
	DefaultStoreTimeout = 50 * time.Millisecond
)

// maxLease is the largest default Lease.
const maxLease = 1 << 20

func (r *RateLimit) validate() error {
	unshared := r.Shared == nil
	return joinErrs(
		fieldErrIf(!(r.PerSecond > 0) || math.IsInf(r.PerSecond, 1),
			"RateLimit.PerSecond", "must be > 0, got %v", r.PerSecond),
		fieldErrIf(r.Burst < 0, "RateLimit.Burst", "must be >= 0, got %d", r.Burst),
		fieldErrIf(int64(r.Burst) > 1<<53,
			"RateLimit.Burst", "must be <= 2^53, the most tokens the bucket counts exactly, got %d", r.Burst),
		fieldErrIf(r.Burst == 0 && !math.IsInf(r.PerSecond, 0) && defaultBurst(r.PerSecond) > 1<<53,
			"RateLimit.Burst", "is zero and its default, ceil(RateLimit.PerSecond/10) = %v, is above 2^53, the most tokens the bucket counts exactly; set it",
			defaultBurst(r.PerSecond)),
		fieldErrIf(r.MaxWait < 0, "RateLimit.MaxWait", "must be >= 0, got %v", r.MaxWait),
		fieldErrIf(r.Lease < 0, "RateLimit.Lease", "must be >= 0, got %d", r.Lease),
		fieldErrIf(r.Lease > 0 && unshared,
			"RateLimit.Lease", "is %d but RateLimit.Shared is nil, so nothing is leased", r.Lease),
		fieldErrIf(r.LeaseTTL < 0, "RateLimit.LeaseTTL", "must be >= 0, got %v", r.LeaseTTL),
		fieldErrIf(r.LeaseTTL > 0 && unshared,
			"RateLimit.LeaseTTL", "is %v but RateLimit.Shared is nil, so nothing is leased", r.LeaseTTL),
		fieldErrIf(r.StoreTimeout < 0, "RateLimit.StoreTimeout", "must be >= 0, got %v", r.StoreTimeout),
		fieldErrIf(r.StoreTimeout > 0 && unshared,
			"RateLimit.StoreTimeout", "is %v but RateLimit.Shared is nil, so there is no store", r.StoreTimeout),
		fieldErrIf(r.FailOpen && unshared,
			"RateLimit.FailOpen", "is set but RateLimit.Shared is nil, so there is no store to fail"),
	)
}

// defaultBurst is Burst's default before its floor of 1: a tenth of a
// second of the rate, which validate checks and WithDefaults uses.
func defaultBurst(perSecond float64) float64 { return math.Ceil(perSecond / 10) }

// WithDefaults returns r with every zero field set to its default; the
// fields of a shared rate limit only when Shared is set.
func (r RateLimit) WithDefaults() RateLimit {
	if r.Burst == 0 {
		r.Burst = max(1, int(defaultBurst(r.PerSecond)))
	}
	if r.Shared == nil {
		return r
	}
	if r.Lease == 0 {
		r.Lease = int(max(1, min(math.Ceil(r.PerSecond/4), maxLease)))
	}
	r.LeaseTTL = or(r.LeaseTTL, DefaultLeaseTTL)
	r.StoreTimeout = or(r.StoreTimeout, DefaultStoreTimeout)
	return r
}
