package transport

import (
	"context"
	"net/http"
	"time"

	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/lane"
	"github.com/resilix/resilix/internal/orca"
	"github.com/resilix/resilix/policy"
)

// What a call tells its Config.Observer, one helper per event (but
// AttemptDone's, leg.go's attemptDone, and the hedges' own in hedge.go):
// each builds the event from the call and calls the Observer's func, if
// set, with no lock held.

func (c *call) laneEjection(e lane.Ejection[*lanePool]) policy.LaneEjection {
	return policy.LaneEjection{Context: c.ctx, Key: c.s.key, Addr: e.Lane.Addr, Index: e.Lane.Index, Reason: e.Reason, For: e.For}
}

func (t *Transport) malformed(ctx context.Context, s *scope, header, value string) {
	s.malformed.Add(1)
	if o := t.obs; o != nil && o.MalformedHeader != nil {
		o.MalformedHeader(policy.MalformedHeader{Context: ctx, Key: s.key, Header: header, Value: httpx.Reported(value)})
	}
}

func (c *call) skipped(why policy.SkipReason, g policy.Gate) {
	c.skip = why
	if o := c.t.obs; o != nil && o.RetrySkipped != nil {
		o.RetrySkipped(policy.RetrySkip{Context: c.ctx, Key: c.s.key, Priority: c.prio, Reason: why, Gate: g, Attempt: c.wire, BodyTooLarge: c.tooLarge})
	}
}

// pushedBack reports an answer that armed the throttler's pushback.
func (c *call) pushedBack(p gate.Pushback) {
	if !p.Armed() {
		return
	}
	if o := c.t.obs; o != nil && o.Pushback != nil {
		o.Pushback(policy.Pushback{Context: c.ctx, Key: c.s.key, StatusCode: p.StatusCode, RetryAfter: p.RetryAfter})
	}
}

func (c *call) limitMoved(ch gate.LimitChange) {
	if !ch.Changed() {
		return
	}
	if o := c.t.obs; o != nil && o.LimitTransition != nil {
		o.LimitTransition(policy.LimitTransition{Context: c.ctx, Key: c.s.key, From: ch.From, To: ch.To})
	}
}

func (c *call) refuse(kind policy.AttemptKind, g policy.Gate, sentinel error, retryAfter time.Duration, heavy bool) *policy.RejectedError {
	err := &policy.RejectedError{Gate: g, Err: sentinel, Key: c.s.key, Priority: c.prio, RetryAfter: retryAfter}
	if o := c.t.obs; o != nil && o.Refused != nil {
		o.Refused(policy.Refusal{Context: c.ctx, Key: c.s.key, Kind: kind, Gate: g, Priority: c.prio, HeavyTenant: heavy, Err: err})
	}
	return err
}

func (c *call) transition(ch gate.BreakerChange) {
	if !ch.Changed() {
		return
	}
	if o := c.t.obs; o != nil && o.BreakerTransition != nil {
		o.BreakerTransition(policy.BreakerTransition{Context: c.ctx, Key: c.s.key, From: ch.From, To: ch.To})
	}
}

func (c *call) suppress(why policy.SuppressReason) {
	if o := c.t.obs; o != nil && o.HedgeSuppressed != nil {
		o.HedgeSuppressed(policy.HedgeSuppression{Context: c.ctx, Key: c.s.key, Priority: c.prio, Reason: why})
	}
}

// readLoad reads the load report on resp, the answer of an attempt on a
// lane, into a, as the lane is to keep it (see laneLoad), and counts a
// malformed one (Observer's MalformedHeader, Snapshot.MalformedHeaders).
func (c *call) readLoad(resp *http.Response, a *lane.Answer) {
	var v string
	var bad bool
	if a.Load, a.Reported, v, bad = laneLoad(resp); bad {
		c.t.malformed(c.ctx, c.s, orca.Header, v)
	}
}
