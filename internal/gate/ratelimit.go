package gate

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// RateLimiter is the runtime state of a RateLimit, one per scope: a token
// bucket that holds at most Burst tokens and gains PerSecond of them per
// second, starting full. It is the algorithm of golang.org/x/time/rate,
// computed lazily from the now passed in (no timer runs for an idle
// scope), with waiting bounded by MaxWait and the caller's deadline.
//
// Every attempt that passes the gate spends one token, retries and hedges
// included. The token is spent for good when the attempt is admitted, so
// there is nothing to release afterwards, whatever the attempt's outcome.
//
// With RateLimit.Shared, tokens are leased from the shared store instead,
// and the bucket is the fallback for when the store fails: see
// policy.RateLimit's "Beyond one process" for what calls get, and
// lease below for how. The store is asked from a goroutine that lives for
// one ask, started by a call; there is never more than one per scope.
//
// AcquireFor is the method to call, and AcquireHedge for a hedge leg. It
// does not allocate unless it waits
// (then one timer) or starts an ask. A refusal is reported to the caller as ErrRateLimited with a
// RetryAfter hint: the time until the bucket holds a token the call may
// take, if nobody else takes it first, or until the store is asked again.
//
// # Priority
//
// Tokens go to the calls that matter most, bottom-up as the other gates
// shed (package shedding). The rule, with p the call's priority (Critical
// 0 to Bulk 3) and burst the bucket's size:
//
//	Critical:       takes any token, and waits for one (MaxWait, deadline)
//	below Critical: takes a token only if reserve(p) are left after it,
//	                never waits
//	reserve(p)  = min(p × max(1, floor(burst/8)), burst − 1)
//
// So as the bucket drains, Bulk is refused first (it leaves 3 steps),
// then BestEffort (2), then Degraded (1), and Critical only when the
// bucket is empty and its wait would be too long. The choices, and why:
//
//   - Lower priorities never wait. A wait here is a token taken ahead of
//     time, and the bucket serves waits in the order they were taken: a
//     Bulk call waiting would put every later Critical call behind it,
//     which is what this rule is for. While a Critical call waits the
//     bucket is below zero, under every reserve, so nothing lower is
//     admitted before it. A refused lower call gets the time until the
//     bucket holds its reserve and one token as its hint, and MaxWait
//     does not apply to it.
//   - A reserve rather than a priority queue of waiters: it is one
//     comparison more on the path that takes a token, no allocation, no
//     queue to keep, and Critical keeps reserve(Bulk) tokens at hand for
//     a burst of its own even under a flood of Bulk. The reserve costs
//     lower priorities none of the sustained rate: a bucket that lower
//     calls keep near their reserve never fills, so no token accrued is
//     lost, and every token Critical does not take goes to them.
//   - One step per level, rlReserveShare (1/8) of the burst rounded down:
//     Bulk may spend about 5/8 of a full bucket at once and leaves about
//     3/8 to Critical's own bursts (36 tokens of 100), Degraded leaves
//     1/8. At least one token, because a fraction of a token reserves
//     nothing a call can take, and small buckets keep a whole token per
//     level (3 of 5 from Bulk).
//   - Capped at burst − 1, so that every priority can be admitted by a
//     full bucket: with the default Burst of 1 (PerSecond up to 10) there
//     is no reserve, and lower priorities differ from Critical only in
//     never waiting, and so never going ahead of it.
//
// The anchor is a flood (TestRateLimitPriorityFlood in transport, 6 s of
// virtual time): 40/s, burst 5, MaxWait 1 s, Critical calls at 25/s with
// 1 s deadlines and 16 Bulk callers in a closed loop. Every Critical call
// is admitted, none waits past its deadline, Bulk gets 91 tokens (15.2/s
// of the 15/s Critical leaves) and the upstream sees 241 calls, within
// the 245 of the rate and the burst. First come first served (all of it
// untagged, or the bucket before priorities), 3 of the 150 Critical calls
// are refused or run out of deadline, queued behind the flood's waits.
//
// # Hedges
//
// A hedge leg is optional work, and a rate-limited key's tokens are all
// the capacity its calls have. AcquireHedge takes a token for one only
// from a bucket full but for one (rlHedgeSlack: most likely the token its
// own call took a threshold ago), never leaving less than its call's
// reserve, Degraded's at least, and it never waits, whatever its call's
// priority. So a hedge takes a token only when the bucket would soon have
// had no room for it, and hedges fire while tokens are plentiful. With a
// burst of one or two the bucket must be full.
//
// Degraded's reserve alone is not enough: hedges that only leave it take
// tokens the calls behind them needed. From a bucket full but for one,
// hedges refuse no call that the same load without Hedge would admit
// (TestHedgesLeaveCriticalTheirTokens in transport; docs/priorities.md
// has the figures).
//
// A call with no priority is Critical, so untagged traffic gets the
// bucket above, unchanged. With Shared, the rule applies to the tokens
// this process has leased, with Lease as the burst; the store knows
// nothing of priority and grants tokens to whoever asks, so a fleet's
// Critical calls are favoured over its lower ones only within each
// process. Lower calls never wait for a lease either, nor do hedge legs,
// which take leased tokens as Degraded calls do (a lease is seldom near
// full: asks are sized to the demand) and tokens of the fallback bucket
// as above.
//
// A nil *RateLimiter is a rate limit that is off: it admits everything. A
// RateLimiter is safe for concurrent use.
type RateLimiter struct {
	perSec  float64
	burst   float64
	maxWait time.Duration
	shared  *lease // nil: the bucket alone

	step   float64 // the bucket's reserve per level below Critical
	mu     sync.Mutex
	tokens float64   // at last; negative while waiters hold tokens not yet accrued
	last   time.Time // when tokens was brought up to date
	tail   time.Time // when the last reservation's token comes due
}

// NewRateLimiter returns the runtime state of r with a full bucket. r must
// be valid (PerSecond > 0) with its defaults applied; Set.Validate checks
// it. When r is Shared, key is the scope's key, the one the store is asked
// for, seed seeds the jitter of the store's backoff, and report, if not
// nil, is called with each change of the store's state; without Shared
// they are not used.
func NewRateLimiter(r policy.RateLimit, key string, seed uint64, report func(policy.StoreTransition)) *RateLimiter {
	l := &RateLimiter{
		perSec:  r.PerSecond,
		burst:   float64(r.Burst),
		maxWait: max(r.MaxWait, 0),
		tokens:  float64(r.Burst),
		step:    reserveStep(float64(r.Burst)),
	}
	if r.Shared != nil {
		l.shared = newLease(r, key, seed, report)
	}
	return l
}

// rlReserveShare is the share of the burst reserved per priority level
// below Critical; see RateLimiter.
const rlReserveShare = 1.0 / 8

// reserveStep returns the reserve per level below Critical of a bucket of
// burst tokens: rlReserveShare of it, rounded down, at least one token.
func reserveStep(burst float64) float64 {
	return max(1, math.Floor(burst*rlReserveShare))
}

// reserve returns the tokens a call of priority p must leave in a bucket
// of burst tokens whose reserve per level is step: none for Critical, and
// at most burst − 1. A priority beyond Bulk counts as Bulk.
func reserve(p shedding.Priority, burst, step float64) float64 {
	if p == shedding.Critical {
		return 0
	}
	return max(0, min(float64(min(p, shedding.Bulk))*step, burst-1))
}

// rlHedgeSlack is how far below full the bucket may be for a hedge leg to
// take a token: one token, most likely the one the hedge's own call took
// a threshold ago, which has barely begun to refill. See RateLimiter's
// "Hedges".
const rlHedgeSlack = 1

// hedgeNeed returns the tokens the bucket must hold for a hedge leg of a
// call of priority p to take one: the bucket full but for rlHedgeSlack,
// and never less than the call's reserve, at least Degraded's, and one.
func (l *RateLimiter) hedgeNeed(p shedding.Priority) float64 {
	return max(1+reserve(max(p, shedding.Degraded), l.burst, l.step), l.burst-rlHedgeSlack)
}

// AcquireHedge spends one token at now for a hedge leg of a call of
// priority p, and reports whether the leg may go on; it never waits. A
// hedge is optional work: from the local bucket it takes a token only
// when the bucket is full but for one, and never leaves less than
// Degraded's reserve (see RateLimiter's "Hedges"). From leased tokens
// (Shared) it takes one as a Degraded call would, or as its call would
// when that is lower, without waiting for a lease.
func (l *RateLimiter) AcquireHedge(ctx context.Context, now time.Time, p shedding.Priority) (ok bool, retryAfter time.Duration) {
	p = max(p, shedding.Degraded)
	switch {
	case l == nil:
		return true, 0
	case l.shared != nil:
		return l.acquireShared(ctx, now, p, true)
	}
	return l.take(now, l.hedgeNeed(p))
}

// AcquireFor spends one token at now for a call of priority p and reports
// whether the call may go on. With a shared store it spends a leased
// token; see acquireShared. The rest of this doc is the local bucket's,
// for a Critical call; a lower one takes only tokens beyond its reserve,
// and never waits (see RateLimiter).
//
// When the bucket is empty and MaxWait is zero, it refuses at once. With
// MaxWait > 0 it takes the next token ahead of time and sleeps until it is
// due, if that is at most MaxWait away and before ctx's deadline; otherwise
// it refuses at once, taking nothing, rather than wait for nothing. A wait
// cut short by ctx gives the token back when no later caller has queued
// behind it, and refuses with a zero hint. retryAfter is the hint on a
// refusal, and zero on success.
//
// now is the current time, as from time.Now; the wait itself runs on the
// runtime's timers.
func (l *RateLimiter) AcquireFor(ctx context.Context, now time.Time, p shedding.Priority) (ok bool, retryAfter time.Duration) {
	switch {
	case l == nil:
		return true, 0
	case l.shared != nil:
		return l.acquireShared(ctx, now, p, false)
	case p != shedding.Critical:
		return l.take(now, 1+reserve(p, l.burst, l.step))
	}
	return l.acquireLocal(ctx, now)
}

// take takes a token from the local bucket if it holds need of them (a
// call below Critical: one and its reserve; a hedge leg: hedgeNeed), else
// refuses with the time until it does. It never waits.
func (l *RateLimiter) take(now time.Time, need float64) (ok bool, retryAfter time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.advance(now)
	if l.tokens >= need {
		l.tokens--
		return true, 0
	}
	return false, l.until(need)
}

// acquireLocal is AcquireFor from the local bucket for a Critical call.
func (l *RateLimiter) acquireLocal(ctx context.Context, now time.Time) (ok bool, retryAfter time.Duration) {
	var limit time.Duration // the longest this call may wait
	if l.maxWait > 0 {
		limit = l.maxWait
		if deadline, ok := ctx.Deadline(); ok {
			limit = min(limit, deadline.Sub(now)-1) // the wait must end before it
		}
	}
	l.mu.Lock()
	l.advance(now)
	if l.tokens >= 1 {
		l.tokens--
		l.mu.Unlock()
		return true, 0
	}
	wait := l.until(1)
	if wait > limit {
		l.mu.Unlock()
		return false, wait
	}
	l.tokens--
	due := now.Add(wait)
	l.tail = due
	l.mu.Unlock()

	if ctx.Err() != nil {
		l.cancel(due, now)
		return false, wait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true, 0
	case <-ctx.Done():
		l.cancel(due, time.Now())
		return false, 0
	}
}

// advance brings the bucket up to date at now. l.mu is held. A now before
// the last update changes nothing.
func (l *RateLimiter) advance(now time.Time) {
	if dt := now.Sub(l.last); dt > 0 {
		l.tokens = min(l.burst, l.tokens+l.perSec*dt.Seconds())
		l.last = now
	}
}

// until returns how long until the bucket holds n tokens, rounded up to the
// nanosecond. l.mu is held and the bucket is up to date.
func (l *RateLimiter) until(n float64) time.Duration {
	missing := n - l.tokens
	if missing <= 0 {
		return 0
	}
	d := math.Ceil(missing / l.perSec * float64(time.Second))
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

// cancel gives back the token of a wait that ended at now, before it was
// due. Only the last reservation's token is given back: a later caller's
// due time was computed after this token was taken, and it would go early
// if the token came back. Erring this way only ever admits less.
func (l *RateLimiter) cancel(due, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !now.Before(due) || !due.Equal(l.tail) {
		return
	}
	l.advance(now)
	l.tokens = min(l.burst, l.tokens+1)
	l.tail = time.Time{}
}

// available returns the tokens in the bucket at now; negative while waiters
// hold tokens that have not accrued yet.
func (l *RateLimiter) available(now time.Time) float64 {
	if l == nil {
		return math.Inf(1)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	tokens := l.tokens
	if dt := now.Sub(l.last); dt > 0 {
		tokens = min(l.burst, tokens+l.perSec*dt.Seconds())
	}
	return tokens
}

// The store's backoff after a failed ask: storeBackoff, doubling with
// each failure in a row up to storeBackoffMax, each wait drawn uniformly
// from its upper half. The cap keeps a scope's recovery within about half
// a second of the store's.
const (
	storeBackoff    = 50 * time.Millisecond
	storeBackoffMax = 500 * time.Millisecond
)

// minStoreRetry is how long a scope waits before asking again when the
// store granted nothing and gave no retry-after: a store that says "none,
// ask again now" is not asked in a loop.
const minStoreRetry = time.Millisecond

// lease is the shared part of a RateLimiter: the tokens leased from the
// store and what the scope knows of the store. Its fields after the
// config are guarded by the RateLimiter's mu.
//
// The tokens of a lease expire ttl after they were asked for. When the
// next lease arrives, the tokens left of the last one (at most half of it,
// since the next is asked for when half is spent) join it and expire with
// it. Each ask is sized by the calls of the moment: the tokens they would
// spend in half a ttl at the pace seen since the last ask, from 1 to
// size; the first ask is for size.
type lease struct {
	store   policy.SharedLimiter
	key     string
	size    int           // the most tokens asked at once
	ttl     time.Duration // how long leased tokens last
	timeout time.Duration // the bound on an ask, and on a call's wait
	failed  policy.StoreState
	report  func(policy.StoreTransition)
	step    float64 // the leased tokens' reserve per level below Critical

	tokens   int       // leased, unspent
	expires  time.Time // when they expire
	state    policy.StoreState
	asking   bool          // an ask is in flight
	askedAt  time.Time     // when the last ask was sent
	asked    int           // how many tokens it asked for
	done     chan struct{} // closed when the ask in flight answers; made by the first call that waits for it
	next     time.Time     // no ask before then: the store's retry-after, or the backoff after a failure
	failures int           // asks failed in a row
	demand   int           // calls that wanted a token since the last ask
	rng      rand.PCG
}

func newLease(r policy.RateLimit, key string, seed uint64, report func(policy.StoreTransition)) *lease {
	s := &lease{
		store:   r.Shared,
		key:     key,
		size:    max(r.Lease, 1),
		ttl:     r.LeaseTTL,
		timeout: r.StoreTimeout,
		failed:  policy.StoreRefusing,
		report:  report,
		step:    reserveStep(float64(max(r.Lease, 1))),
		state:   policy.StoreUp,
	}
	if r.FailOpen {
		s.failed = policy.StoreFallback
	}
	s.rng.Seed(seed, seed^0x9e3779b97f4a7c15)
	return s
}

// leaseVerdict is what a call gets from the leased tokens.
type leaseVerdict uint8

const (
	leaseAdmit    leaseVerdict = iota + 1 // it spent a leased token
	leaseWait                             // none left, a lease is on its way: wait for it
	leaseRefuse                           // none left: refused
	leaseFallback                         // none left and the store is failing: the bucket decides
)

// leaseDecision is decide's answer.
type leaseDecision struct {
	verdict    leaseVerdict
	retryAfter time.Duration   // leaseRefuse: the hint
	until      time.Time       // leaseWait: the longest the call waits
	done       <-chan struct{} // leaseWait: closed when the ask answers
	ask        int             // > 0: the caller must ask the store for that many tokens (l.ask)
}

// acquireShared is AcquireFor, or AcquireHedge when hedge is set, from
// the leased tokens. A call below
// Critical takes one only beyond its reserve, with the Lease as the burst,
// and never waits: refused while a lease is on its way, its hint is the
// time until that ask times out. A Critical call that finds none
// while a lease is on its way waits for it, until the ask is StoreTimeout
// old and at most StoreTimeout from now, and not once ctx is done (not at
// all when ctx is done already). A wait cut short by ctx refuses with a
// zero hint. When the store is failing, the bucket decides (FailOpen), or
// the call is refused with the time until the store is asked again.
func (l *RateLimiter) acquireShared(ctx context.Context, now time.Time, p shedding.Priority, hedge bool) (ok bool, retryAfter time.Duration) {
	var waitUntil time.Time // zero: the call may not wait
	if ctx.Err() == nil {
		waitUntil = now.Add(l.shared.timeout)
	}
	for fresh := true; ; fresh = false {
		d := l.decideFor(now, waitUntil, fresh, p)
		if d.ask > 0 {
			go l.ask(context.WithoutCancel(ctx), d.ask)
		}
		switch d.verdict {
		case leaseAdmit:
			return true, 0
		case leaseRefuse:
			return false, d.retryAfter
		case leaseFallback:
			switch {
			case hedge:
				return l.take(now, l.hedgeNeed(p))
			case p != shedding.Critical:
				return l.take(now, 1+reserve(p, l.burst, l.step))
			}
			return l.acquireLocal(ctx, now)
		}
		if !await(ctx, d.done, d.until.Sub(now)) {
			return false, 0
		}
		now = time.Now()
	}
}

// await waits up to d for done, and reports false when ctx ended first.
func await(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}

// decideFor takes a leased token for a call of priority p at now, or says
// why not, and whether the store must be asked. The call may wait until
// waitUntil (zero: not at all). fresh is false when the call has already
// been counted, deciding again after a wait. A call below Critical takes a
// token only when its reserve is left after it, and never waits.
func (l *RateLimiter) decideFor(now, waitUntil time.Time, fresh bool, p shedding.Priority) leaseDecision {
	s := l.shared
	if p != shedding.Critical {
		waitUntil = time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if fresh {
		s.demand++
	}
	if s.tokens > 0 && !now.Before(s.expires) {
		s.tokens = 0
	}
	var d leaseDecision
	if float64(s.tokens) >= 1+reserve(p, float64(s.size), s.step) {
		s.tokens--
		d.verdict = leaseAdmit
		if s.asked >= 2 && s.tokens <= s.asked/2 {
			d.ask = s.startAsk(now)
		}
		return d
	}
	d.ask = s.startAsk(now)
	// An ask that has not answered within the timeout has failed, as far
	// as calls go, whether or not the store has noticed yet.
	failing := s.state != policy.StoreUp || s.asking && !now.Before(s.askedAt.Add(s.timeout))
	switch {
	case s.asking && !failing && now.Before(waitUntil):
		d.verdict = leaseWait
		d.until = s.askedAt.Add(s.timeout)
		if waitUntil.Before(d.until) {
			d.until = waitUntil
		}
		if s.done == nil {
			s.done = make(chan struct{})
		}
		d.done = s.done
	case failing && s.failed == policy.StoreFallback:
		d.verdict = leaseFallback
	case s.asking && p != shedding.Critical:
		// A lower call, which may not wait for the lease on its way:
		// by then it has answered, or failed.
		d.verdict = leaseRefuse
		d.retryAfter = max(s.askedAt.Add(s.timeout).Sub(now), 0)
	default:
		d.verdict = leaseRefuse
		d.retryAfter = max(s.next.Sub(now), 0)
	}
	return d
}

// startAsk returns how many tokens to ask the store for at now, marking
// the ask in flight, or 0 when one is already in flight or it is too
// early. l.mu is held.
func (s *lease) startAsk(now time.Time) int {
	if s.asking || now.Before(s.next) {
		return 0
	}
	n := s.size
	if dt := now.Sub(s.askedAt); !s.askedAt.IsZero() && dt > 0 {
		want := math.Ceil(float64(s.demand) * (s.ttl / 2).Seconds() / dt.Seconds())
		n = int(max(1, min(want, float64(s.size))))
	}
	s.demand = 0
	s.asking, s.askedAt, s.asked = true, now, n
	return n
}

// ask asks the store for n tokens, which decide has marked in flight, and
// records the answer. ctx carries the values of the call that started it.
func (l *RateLimiter) ask(ctx context.Context, n int) {
	s := l.shared
	granted, retryAfter, err := s.take(ctx, n)
	from, to := l.answer(time.Now(), granted, retryAfter, err)
	if from != to && s.report != nil {
		s.report(policy.StoreTransition{Context: ctx, Key: s.key, From: from, To: to, Err: err})
	}
}

// take calls the store, bounded by the timeout. A panic in the store is
// its error: there is no caller to raise it on.
func (s *lease) take(ctx context.Context, n int) (granted int, retryAfter time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			granted, retryAfter, err = 0, 0, fmt.Errorf("resilix: SharedLimiter.Take panicked: %v", p)
		}
	}()
	return s.store.Take(ctx, s.key, n)
}

// answer records at now the store's answer to the ask in flight, and
// returns the store's state before and after. A grant beyond the ask counts
// as the ask, a negative one as none.
func (l *RateLimiter) answer(now time.Time, granted int, retryAfter time.Duration, err error) (from, to policy.StoreState) {
	s := l.shared
	l.mu.Lock()
	defer l.mu.Unlock()
	from = s.state
	s.asking = false
	if s.done != nil {
		close(s.done)
		s.done = nil
	}
	if err != nil {
		s.failures++
		s.next = now.Add(s.backoff())
		s.state = s.failed
		return from, s.state
	}
	s.failures = 0
	s.state = policy.StoreUp
	granted = max(0, min(granted, s.asked))
	s.next = now
	switch {
	case granted < s.asked && retryAfter > 0:
		s.next = now.Add(retryAfter)
	case granted == 0:
		s.next = now.Add(minStoreRetry)
	}
	if granted > 0 {
		if !now.Before(s.expires) {
			s.tokens = 0
		}
		s.tokens += granted
		s.expires = s.askedAt.Add(s.ttl)
	}
	return from, s.state
}

// backoff returns the wait before the next ask after s.failures failures
// in a row. l.mu is held.
func (s *lease) backoff() time.Duration {
	d := min(storeBackoff<<min(s.failures-1, 10), storeBackoffMax)
	return d/2 + time.Duration(s.rng.Uint64()%uint64(d/2+1))
}

// Store returns the state of the shared store and the leased tokens held
// unspent at now; a zero state without a store.
func (l *RateLimiter) Store(now time.Time) (state policy.StoreState, leased int) {
	if l == nil || l.shared == nil {
		return 0, 0
	}
	s := l.shared
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(s.expires) {
		leased = s.tokens
	}
	return s.state, leased
}
