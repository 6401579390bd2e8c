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
// Withdraws and each hedge WithdrawHedge before it is sent, and one that
// proves worth it (a retry that succeeds, a hedge that wins) Refunds (or
// RefundHedge) its token, so that only waste stays spent.
//
// A hedge also needs a token of the hedges' allowance, a second bucket
// inside the first: each call adds half of Ratio to it, it holds half of
// Max, at most 10, and it has no floor. So hedges that all lose take at
// most half of the bucket at once, never the retries' half: below a Max of
// 2 the allowance holds less than a token and no hedge goes (with Max 1, one
// losing hedge would leave the next 503 no token for its retry). Hedges buy
// latency, not answers: in a brownout's first moments, before the latency
// quantile has caught up, nearly every call comes due for a hedge and
// nearly every hedge loses, and the allowance holds that to half of Ratio
// and 10 tokens, while retries, which turn a failure into an answer, have
// the whole of Ratio and Max.
//
// The allowance also lets go of what it holds above one token, with a
// time constant of hedgeTau (2 s), so that it holds one token and about
// what the last two seconds of calls deposited, no more than 10: a client
// of 12.8 calls a second, one of a fleet of 200 small ones, holds about
// 3.6 at most, where an allowance of 10 each sent the fleet 2000 hedges into a
// collapse's first second. A scope that has hedged nothing for a while
// has one hedge ready, and its calls add to it; one of 50 calls a second
// or more deposits faster than the allowance lets go, and keeps its 10.
//
// It is safe for concurrent use; a nil *Budget is an unlimited budget.
type Budget struct {
	ratio, perSecond, max float64
	hedgeRatio, hedgeMax  float64

	// full is true while tokens is max: a Deposit then has nothing to
	// add, and returns after one atomic load (the healthy case, where
	// nothing withdraws). Written under mu.
	full atomic.Bool

	mu     sync.Mutex
	tokens float64
	hedges float64   // the hedges' allowance, in [0, hedgeMax]
	last   time.Time // when the floor was last accrued; stale while full
	// hedgeAt is when the allowance last let go of what it holds (see
	// accrue); not moved while full.
	hedgeAt time.Time
}

// hedgeTau is the time constant with which the hedges' allowance lets go
// of what it holds: about two seconds of deposits, as Max's default is two
// seconds of the floor.
const hedgeTau = 2 * time.Second

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
		hedgeAt:   now,
	}
	bb.hedgeRatio, bb.hedgeMax = b.Ratio/2, min(b.Max/2, 10)
	bb.tokens, bb.hedges = bb.max, bb.hedgeMax
	bb.full.Store(true)
	return bb
}

// accrue adds the floor's tokens for the time since the last accrual, and
// lets the hedges' allowance go by exp(−dt/hedgeTau) for the time since
// it last did, full or not. The caller holds b.mu.
func (b *Budget) accrue(now time.Time) {
	if b.full.Load() {
		// Full until now, whatever last says: no floor accrued.
		b.last = now
	} else if dt := now.Sub(b.last); dt > 0 {
		b.tokens = min(b.max, b.tokens+b.perSecond*dt.Seconds())
		b.last = now
	}
	if dt := now.Sub(b.hedgeAt); dt > 0 {
		if keep := min(1, b.hedgeMax); b.hedges > keep {
			b.hedges = keep + (b.hedges-keep)*math.Exp(-dt.Seconds()/hedgeTau.Seconds())
		}
		b.hedgeAt = now
		b.setFull()
	}
}

// Deposited is what one Deposit added to each of the budget's buckets:
// Ratio to the tokens and Ratio/2 to the hedges' allowance, each less what
// its cap left no room for.
type Deposited struct{ Tokens, Hedges float64 }

// Deposit records one logical call, and returns what it added.
func (b *Budget) Deposit(now time.Time) Deposited {
	if b == nil {
		return Deposited{}
	}
	if b.full.Load() {
		return Deposited{}
	}
	b.mu.Lock()
	b.accrue(now)
	tokens, hedges := b.tokens, b.hedges
	b.tokens = min(b.max, b.tokens+b.ratio)
	b.hedges = min(b.hedgeMax, b.hedges+b.hedgeRatio)
	b.setFull()
	d := Deposited{Tokens: b.tokens - tokens, Hedges: b.hedges - hedges}
	b.mu.Unlock()
	return d
}

// setFull sets full from both buckets. The caller holds b.mu.
func (b *Budget) setFull() { b.full.Store(b.tokens >= b.max && b.hedges >= b.hedgeMax) }

// TakeBack removes what a Deposit added, for a call that turned out to be
// none (a request net/http refused to send): it earns its retries and
// hedges nothing. Each bucket is taken back by what was added to it, since
// only one may have had room (the floor refills the tokens, never the
// hedges). The balance never goes below zero.
func (b *Budget) TakeBack(d Deposited) {
	if b == nil || d == (Deposited{}) {
		return
	}
	b.mu.Lock()
	b.tokens = max(0, b.tokens-d.Tokens)
	b.hedges = max(0, b.hedges-d.Hedges)
	b.setFull()
	b.mu.Unlock()
}

// Withdraw takes one token for a retry, and reports whether there was one
// to take.
func (b *Budget) Withdraw(now time.Time) bool { return b.withdraw(now, false) }

// WithdrawHedge takes one token for a hedge, and one of the hedges'
// allowance, and reports whether there were both to take.
func (b *Budget) WithdrawHedge(now time.Time) bool { return b.withdraw(now, true) }

func (b *Budget) withdraw(now time.Time, hedge bool) bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.accrue(now)
	if b.tokens < 1 || hedge && b.hedges < 1 {
		return false
	}
	b.tokens--
	if hedge {
		b.hedges--
	}
	b.full.Store(false)
	return true
}

// Refund gives back the token of a retry that was worth it: one that
// succeeded. Only waste then stays spent. Call it once for a Withdraw that
// returned true, and never for one that did not: the bucket cannot tell.
func (b *Budget) Refund(now time.Time) { b.refund(now, false) }

// RefundHedge gives back the tokens of a hedge that won, as Refund does
// for a retry; call it once for a WithdrawHedge that returned true.
func (b *Budget) RefundHedge(now time.Time) { b.refund(now, true) }

func (b *Budget) refund(now time.Time, hedge bool) {
	if b == nil {
		return
	}
	if b.full.Load() {
		return
	}
	b.mu.Lock()
	b.accrue(now)
	b.tokens = min(b.max, b.tokens+1)
	if hedge {
		b.hedges = min(b.hedgeMax, b.hedges+1)
	}
	b.setFull()
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
