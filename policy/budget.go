package policy

import (
	"math"
	"sync"
	"time"
)

// Budget bounds amplification: retries and hedges draw from one token
// bucket per scope, so together they cannot add more than a fixed fraction
// of the traffic however badly the dependency behaves. Two amplifiers with
// separate budgets would not bound the total.
//
// Every logical call deposits Ratio tokens; every retry or hedge withdraws
// one, and is not sent when less than one is left. So that a quiet scope
// can still retry, the bucket also fills at MinPerSecond tokens per second
// whatever the traffic; it never holds more than Max, and a new scope
// starts full. This is the shape of gRPC's retry throttling and Finagle's
// RetryBudget. The zero value is on, with the defaults below.
type Budget struct {
	// Ratio is the tokens each logical call deposits: the long-run share of
	// calls that may be retried or hedged. If zero, 0.1 is used. If
	// negative, the budget is off and only Attempts bounds amplification.
	Ratio float64

	// MinPerSecond is the floor: tokens added per second whatever the
	// traffic. If zero, 1 is used. If negative, there is no floor.
	MinPerSecond float64

	// Max is the most tokens the bucket holds, and what it starts with.
	// If zero, 10 is used; otherwise it must be at least 1.
	Max float64
}

func (b *Budget) validate() error {
	return joinErrs(
		fieldErrIf(math.IsNaN(b.Ratio) || math.IsInf(b.Ratio, 0),
			"Budget.Ratio", "must be a finite number, got %v", b.Ratio),
		fieldErrIf(math.IsNaN(b.MinPerSecond) || math.IsInf(b.MinPerSecond, 0),
			"Budget.MinPerSecond", "must be a finite number, got %v", b.MinPerSecond),
		fieldErrIf(b.Max != 0 && !(b.Max >= 1 && b.Max < math.Inf(1)),
			"Budget.Max", "must be 0 (default) or a finite number >= 1, got %v", b.Max),
	)
}

// BudgetBucket is the runtime state of a Budget: one per scope, shared by
// the scope's retries and hedges. It is safe for concurrent use; a nil
// *BudgetBucket is an unlimited budget.
type BudgetBucket struct {
	ratio, perSecond, max float64

	mu     sync.Mutex
	tokens float64
	last   time.Time // when the floor was last accrued
}

// NewBudgetBucket returns the runtime state of b, full, or nil when b is
// off (negative Ratio).
func NewBudgetBucket(b Budget, now time.Time) *BudgetBucket {
	if b.Ratio < 0 {
		return nil
	}
	bb := &BudgetBucket{
		ratio:     or(b.Ratio, 0.1),
		perSecond: max(or(b.MinPerSecond, 1), 0),
		max:       or(b.Max, 10),
		last:      now,
	}
	bb.tokens = bb.max
	return bb
}

// accrue adds the floor's tokens for the time since the last accrual. The
// caller holds b.mu.
func (b *BudgetBucket) accrue(now time.Time) {
	if dt := now.Sub(b.last); dt > 0 {
		b.tokens = min(b.max, b.tokens+b.perSecond*dt.Seconds())
		b.last = now
	}
}

// Deposit records one logical call.
func (b *BudgetBucket) Deposit(now time.Time) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.accrue(now)
	b.tokens = min(b.max, b.tokens+b.ratio)
	b.mu.Unlock()
}

// Withdraw takes one token for a retry or a hedge, and reports whether
// there was one to take.
func (b *BudgetBucket) Withdraw(now time.Time) bool {
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
	return true
}

// Balance returns the tokens in the bucket at now; +Inf for a nil bucket.
func (b *BudgetBucket) Balance(now time.Time) float64 {
	if b == nil {
		return math.Inf(1)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.accrue(now)
	return b.tokens
}
