package policy

import (
	"context"
	"sync/atomic"
	"time"
)

// Bulkhead caps the calls in flight to one scope.
type Bulkhead struct {
	// MaxConcurrent is the most calls in flight at once. Required: it
	// must be > 0.
	MaxConcurrent int

	// MaxWait is how long a call waits for a free slot. If zero, a call
	// that finds the bulkhead full fails at once with ErrBulkheadFull.
	// A wait never outlives the caller's deadline.
	MaxWait time.Duration
}

func (b *Bulkhead) validate() error {
	return joinErrs(
		fieldErrIf(b.MaxConcurrent <= 0, "Bulkhead.MaxConcurrent", "must be > 0, got %d", b.MaxConcurrent),
		fieldErrIf(b.MaxWait < 0, "Bulkhead.MaxWait", "must be >= 0, got %v", b.MaxWait),
	)
}

// BulkheadGate is the runtime state of a Bulkhead: a counting semaphore of
// MaxConcurrent slots, one per scope, that bounds how many exchanges with
// the scope are in flight at once.
//
// A slot is taken by Acquire and held for the whole exchange, response body
// included: the transport releases it when the caller closes the response
// body or reads it to EOF (or when the attempt ends without a response, or
// is discarded as a hedge loser). So a caller that keeps bodies open holds
// slots, which is the point: the bulkhead bounds connections and buffers,
// not only time to headers. The gate never reads or closes a body itself.
//
// Acquire is allocation-free when a slot is free or when MaxWait is zero;
// only a call that has to wait allocates (one timer). Waiters are served in
// the order they started waiting: a released slot goes to the longest
// waiter, never to a newcomer that did not wait. A waiter that
// gives up (MaxWait or the caller's deadline) never held a slot, so nothing
// leaks. A refusal is reported to the caller as ErrBulkheadFull.
//
// A nil *BulkheadGate is a bulkhead that is off: it admits everything. A
// BulkheadGate is safe for concurrent use.
type BulkheadGate struct {
	sem     chan struct{} // one element per slot in use
	maxWait time.Duration
	waiting atomic.Int64
}

// NewBulkheadGate returns the runtime state of b, with every slot free. b
// must be valid (MaxConcurrent > 0, MaxWait >= 0); Set.Validate checks it.
func NewBulkheadGate(b Bulkhead) *BulkheadGate {
	return &BulkheadGate{
		sem:     make(chan struct{}, max(b.MaxConcurrent, 1)),
		maxWait: max(b.MaxWait, 0),
	}
}

// Acquire takes a slot and reports whether it got one; when it did, the
// caller must call Release exactly once.
//
// When every slot is taken, Acquire fails at once if MaxWait is zero.
// Otherwise it waits for a slot until the earliest of MaxWait and ctx's
// end (its deadline or cancellation), so a wait never outlives the caller's
// deadline; when ctx is already done or its deadline already passed, it
// fails at once.
func (g *BulkheadGate) Acquire(ctx context.Context) bool {
	if g == nil {
		return true
	}
	select {
	case g.sem <- struct{}{}:
		return true
	default:
	}
	if g.maxWait <= 0 {
		return false
	}
	return g.wait(ctx)
}

// wait is Acquire's slow path: the bulkhead is full and MaxWait > 0.
func (g *BulkheadGate) wait(ctx context.Context) bool {
	d := g.maxWait
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline))
	}
	if d <= 0 || ctx.Err() != nil {
		return false
	}
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case g.sem <- struct{}{}:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// Release gives back a slot taken by a successful Acquire, waking the
// longest waiter if there is one. Calling it more often than Acquire
// succeeded is a bug in the caller, and panics.
func (g *BulkheadGate) Release() {
	if g == nil {
		return
	}
	select {
	case <-g.sem:
	default:
		panic("resilix: BulkheadGate.Release without a matching Acquire")
	}
}

// InFlight returns the number of slots in use.
func (g *BulkheadGate) InFlight() int {
	if g == nil {
		return 0
	}
	return len(g.sem)
}

// Waiting returns the number of calls waiting for a slot.
func (g *BulkheadGate) Waiting() int {
	if g == nil {
		return 0
	}
	return int(g.waiting.Load())
}
