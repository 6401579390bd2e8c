package gate

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/policy"
)

// Budget is the runtime state of a Budget: one per scope, shared by
// the scope's retries and hedges. Each logical call Deposits, each retry
// or hedge Withdraws before it is sent, and one that proves worth it (a
// retry that succeeds, a hedge that wins) Refunds its token, so that only
// waste stays spent. It is safe for concurrent use; a nil *Budget is an
// unlimited budget.
type Budget struct {
	ratio, perSecond, max float64

	// full is true while tokens is max: a Deposit then has nothing to
	// add, and returns after one atomic load (the healthy case, where
	// nothing withdraws). Written under mu.
	full atomic.Bool

	mu     sync.Mutex
	tokens float64
	last   time.Time // when the floor was last accrued; stale while full
}

// NewBudget returns the runtime state of b, full, or nil when b is off
// (negative Ratio). b must have its defaults applied.
func NewBudget(b policy.Budget, now time.Time) *Budget {
	if b.Ratio < 0 {
		return nil
	}
	bb := &Budget{
		ratio:     b.Ratio,
		perSecond: max(b.MinPerSecond, 0),
		max:       b.Max,
		last:      now,
	}
	bb.tokens = bb.max
	bb.full.Store(true)
	return bb
}

// accrue adds the floor's tokens for the time since the last accrual. The
// caller holds b.mu.
func (b *Budget) accrue(now time.Time) {
	if b.full.Load() {
		// Full until now, whatever last says: nothing accrued.
		b.last = now
		return
	}
	if dt := now.Sub(b.last); dt > 0 {
		b.tokens = min(b.max, b.tokens+b.perSecond*dt.Seconds())
		b.last = now
	}
}

// Deposit records one logical call, and returns the tokens it added:
// Ratio, less what Max left no room for.
func (b *Budget) Deposit(now time.Time) float64 {
	if b == nil {
		return 0
	}
	if b.full.Load() {
		return 0
	}
	b.mu.Lock()
	b.accrue(now)
	before := b.tokens
	b.tokens = min(b.max, b.tokens+b.ratio)
	b.full.Store(b.tokens >= b.max)
	added := b.tokens - before
	b.mu.Unlock()
	return added
}

// TakeBack removes tokens that a Deposit added, for a call that turned
// out to be none (a request net/http refused to send): it earns its
// retries nothing. The balance never goes below zero.
func (b *Budget) TakeBack(tokens float64) {
	if b == nil || tokens <= 0 {
		return
	}
	b.mu.Lock()
	b.tokens = max(0, b.tokens-tokens)
	b.full.Store(b.tokens >= b.max)
	b.mu.Unlock()
}

// Withdraw takes one token for a retry or a hedge, and reports whether
// there was one to take.
func (b *Budget) Withdraw(now time.Time) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.accrue(now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	b.full.Store(false)
	return true
}

// Refund gives back the token of a withdrawal that was worth it: a retry
// that succeeded, a hedge that won. Only waste then stays spent. Call it
// once for a Withdraw that returned true, and never for one that did
// not: the bucket cannot tell.
func (b *Budget) Refund(now time.Time) {
	if b == nil {
		return
	}
	if b.full.Load() {
		return
	}
	b.mu.Lock()
	b.accrue(now)
	b.tokens = min(b.max, b.tokens+1)
	b.full.Store(b.tokens >= b.max)
	b.mu.Unlock()
}

// Balance returns the tokens in the bucket at now; +Inf for a nil bucket.
func (b *Budget) Balance(now time.Time) float64 {
	if b == nil {
		return math.Inf(1)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.accrue(now)
	return b.tokens
}
