package gate

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/policy"
)

// Bulkhead is the runtime state of a Bulkhead: a counting semaphore of
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
// A nil *Bulkhead is a bulkhead that is off: it admits everything. A
// Bulkhead is safe for concurrent use.
type Bulkhead struct {
	sem     chan struct{} // one element per slot in use
	maxWait time.Duration
	waiting atomic.Int64
}

// NewBulkhead returns the runtime state of b, with every slot free. b
// must be valid (MaxConcurrent > 0, MaxWait >= 0); Set.Validate checks it.
func NewBulkhead(b policy.Bulkhead) *Bulkhead {
	return &Bulkhead{
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
func (g *Bulkhead) Acquire(ctx context.Context) bool {
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

// TryAcquire takes a slot if one is free, and reports whether it got one,
// never waiting, whatever MaxWait; when it did, the caller must call
// Release exactly once.
func (g *Bulkhead) TryAcquire() bool {
	if g == nil {
		return true
	}
	select {
	case g.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

// wait is Acquire's slow path: the bulkhead is full and MaxWait > 0.
func (g *Bulkhead) wait(ctx context.Context) bool {
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
func (g *Bulkhead) Release() {
	if g == nil {
		return
	}
	select {
	case <-g.sem:
	default:
		panic("resilix: Bulkhead.Release without a matching Acquire")
	}
}

// InFlight returns the number of slots in use.
func (g *Bulkhead) InFlight() int {
	if g == nil {
		return 0
	}
	return len(g.sem)
}

// waiters returns the number of calls waiting for a slot.
func (g *Bulkhead) waiters() int {
	if g == nil {
		return 0
	}
	return int(g.waiting.Load())
}
