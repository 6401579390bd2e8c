package transport

import (
	"context"
	"net/http"
	"time"

	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/internal/lane"
	"github.com/resilix/resilix/policy"
)

// permits is what one leg holds of its key's admission gates, from admit
// to finish, and of its lanes, from takeLane to leaveLane: every leg
// passes through admit and finish, and finish is the one place where what
// a leg took of the gates ends (a leg sent ends both in call.end). Adding
// a gate touches its field here, admit and finish.
type permits struct {
	// lane is the lane the leg is sent on (Set.Replicas), from the time
	// took until the lane is told how it went; nil otherwise.
	lane *lane.Lane[*lanePool]
	took time.Time

	throttled bool // the throttler admitted it and awaits its outcome
	bp        gate.BreakerPermit
	breaker   bool // bp is held
	lp        gate.LimiterPermit
	limiter   bool // lp is held
	bulkhead  bool // a bulkhead slot is held
	// inherited is the superseded response whose bulkhead slot this leg
	// took over, until the leg is sent: a refused leg gives it back.
	inherited *releaser
}

// ask is what admit asks the gates for: a leg of kind, at now.
type ask struct {
	kind policy.AttemptKind
	now  time.Time
	// wait: a gate with a queue (the limiter, a bulkhead's or a rate
	// limit's MaxWait) may hold the leg there; else it refuses at once.
	// Hedge legs never wait: a hedge that has to queue is no longer worth
	// sending.
	wait bool
	// prev is the response the leg would supersede, if any: when it
	// holds a bulkhead slot the leg takes the slot over rather than queue
	// behind its own call (permits.inherited says so), and gives it back
	// if a later gate refuses.
	prev *http.Response
}

// result is how a leg went, as finish tells the gates.
type result struct {
	now     time.Time
	outcome policy.Outcome // what the throttler, the limiter and the latency window learn
	judged  policy.Outcome // what the breaker learns: outcome, or Discarded where the lane explains it
	latency time.Duration
	// sampled: latency is a sample of the dependency's (an answer's, or a
	// timeout's lower bound); a refused connection's speed says nothing
	// of how long the dependency takes to answer.
	sampled  bool
	accepted bool // the throttler's: the dependency took the request
	// expired: the caller's deadline ended the attempt before its
	// headers came (outcome Canceled). The throttler counts it as a
	// request the dependency did not accept: it had the request for as
	// long as the caller could wait, and whatever work it does on it now
	// is for nobody.
	expired bool
	// stalled: the client's own stall ended the attempt at its timeout
	// (see timing.Stalled), after its deadline: outcome and judged are
	// Canceled, since it is no evidence about the dependency.
	stalled  bool
	pushback *http.Response // the answer whose pushback the throttler may obey, or nil
}

// discarded is the result of a leg that teaches nothing: refused by a
// later gate, not sent, lost to another leg, or gone in a panic.
func discarded(now time.Time) result {
	return result{now: now, outcome: policy.Discarded, judged: policy.Discarded}
}

// admit passes a leg through the admission gates in their order,
// throttler → breaker → limiter → bulkhead → rate limit, and either
// records their permits in p or returns the refusal, a
// *policy.RejectedError, having given back what earlier gates granted. A
// hedge leg is not asked the rate limit here: its round takes that token
// last, as the leg is sent, since it cannot be given back (see
// round.launch). When the caller's own context ends while a gate waits,
// it returns that context's error rather than a refusal.
func (c *call) admit(p *permits, a ask) error {
	s := c.s
	if s.breakerOf().Isolated() { // before any gate, so that none moves for it
		return c.refuse(a.kind, policy.GateBreaker, policy.ErrIsolated, 0, false)
	}
	if s.throttle != nil {
		d := s.throttle.Admit(a.now, c.prio, c.tenant)
		if !d.OK {
			return c.refuse(a.kind, policy.GateThrottler, policy.ErrThrottled, d.RetryAfter, d.HeavyTenant)
		}
		p.throttled = true
	}
	if s.breaker != nil {
		bp, d := s.breaker.Allow(a.now)
		c.transition(d.Change)
		if !d.OK {
			c.finish(p, discarded(a.now), false)
			if d.Isolated { // since the check above
				return c.refuse(a.kind, policy.GateBreaker, policy.ErrIsolated, 0, false)
			}
			return c.refuse(a.kind, policy.GateBreaker, policy.ErrCircuitOpen, d.RetryAfter, false)
		}
		p.bp, p.breaker = bp, true
	}
	if s.limiter != nil {
		var lp gate.LimiterPermit
		var d gate.LimiterDecision
		if a.wait {
			lp, d = s.limiter.Acquire(c.ctx, a.now, c.prio, c.tenant)
		} else {
			lp, d = s.limiter.TryAcquire(a.now, c.prio, c.tenant)
		}
		if !d.OK {
			c.finish(p, discarded(a.now), false)
			if d.Reason == gate.LimiterCanceled {
				return c.ctx.Err()
			}
			return c.refuse(a.kind, policy.GateLimiter, policy.ErrShed, 0, d.HeavyTenant)
		}
		p.lp, p.limiter = lp, true
	}
	if s.bulkhead != nil {
		if r := heldSlot(a.prev); r != nil {
			r.bulkhead, p.inherited = nil, r
		} else if a.wait && !s.bulkhead.Acquire(c.ctx) || !a.wait && !s.bulkhead.TryAcquire() {
			c.finish(p, discarded(a.now), false)
			if err := c.callerDone(); a.wait && err != nil {
				return err
			}
			return c.refuse(a.kind, policy.GateBulkhead, policy.ErrBulkheadFull, 0, false)
		}
		p.bulkhead = true
	}
	if s.rate != nil && a.kind != policy.AttemptHedge {
		if ok, ra := s.rate.AcquireFor(c.ctx, a.now, c.prio); !ok {
			c.finish(p, discarded(a.now), false)
			if err := c.callerDone(); a.wait && err != nil {
				return err
			}
			return c.refuse(a.kind, policy.GateRateLimit, policy.ErrRateLimited, ra, false)
		}
	}
	return nil
}

// callerDone returns the error of the caller's context if it has ended,
// counting a deadline that has passed before the context's own timer
// noticed (a gate's wait bounded by the deadline may end first).
func (c *call) callerDone() error { return contextDone(c.ctx, time.Now()) }

// finish ends what p holds of the gates with r: the throttler, the
// breaker and the limiter learn r (a Discarded one teaches them nothing),
// the latency window learns it when it is evidence, and the bulkhead slot
// is released, or given back to the response it was taken over from;
// unless keep: the answer's body then holds the slot until it is done
// with (see releaser), and finish returns it.
func (c *call) finish(p *permits, r result, keep bool) *gate.Bulkhead {
	s := c.s
	if p.throttled {
		o := r.outcome
		if r.expired {
			o = policy.Failure
		}
		c.pushedBack(s.throttle.Done(r.now, o, r.accepted, r.pushback))
		p.throttled = false
	}
	if p.breaker {
		c.transition(s.breaker.Done(r.now, p.bp, r.judged))
		p.breaker = false
	}
	if p.limiter {
		c.limitMoved(s.limiter.Release(p.lp, r.now, r.latency, r.outcome))
		p.limiter = false
	}
	if s.hedge != nil && r.outcome.Evidence() {
		if r.sampled {
			s.hedge.Record(r.now, r.latency, r.outcome)
		}
		s.hedge.Observe(r.now, r.outcome)
	}
	if !p.bulkhead {
		return nil
	}
	p.bulkhead = false
	switch {
	case keep:
		p.inherited = nil
		return s.bulkhead
	case p.inherited != nil:
		p.inherited.bulkhead, p.inherited = s.bulkhead, nil
	default:
		s.bulkhead.Release()
	}
	return nil
}

// contextDone returns the error of a context that is done at now: its
// own, or context.DeadlineExceeded for a deadline that has passed before
// the context's timer noticed.
func contextDone(ctx context.Context, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !now.Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// refund gives back the budget token of a leg whose answer is the call's
// success: a retry whose round it answered, unhedged or as the round's
// winner, or a hedge that won. A call refunds at most once, for the one
// wire call its answer came from: in a hedged retry round won by a hedge
// the hedge's token comes back and the retry's, which paid for the leg
// that lost, stays spent. So what stays spent is a token for each wire
// call the caller's answer did not come from, but the call's first. A
// hedge gives back its allowance's token too (see gate.Budget).
func (c *call) refund(now time.Time, kind policy.AttemptKind) {
	if kind == policy.AttemptHedge {
		c.s.budget.RefundHedge(now)
		return
	}
	c.s.budget.Refund(now)
}
