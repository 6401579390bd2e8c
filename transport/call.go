package transport

import (
	"io"
	"math/bits"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/attempt"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/timing"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/tenant"
)

// RoundTrip runs req through the key's chain. It follows the
// http.RoundTripper contract: req is never modified, req.Body is closed on
// every path, and exactly one of the results is non-nil.
//
// Three requests get an error at once, before any policy runs, with the
// body closed and no Observer told: a nil request ("resilix: nil
// Request"), one with a nil URL ("resilix: nil Request.URL"), and one
// whose context carries an Override with a negative Attempts or
// PerAttempt (the error names the field and its value). A request with a
// nil Header is run as if its Header were empty: the caller's request
// keeps its nil, as the contract asks.
//
// A request whose context is already done (cancelled, or past its
// deadline) gets the context's error before its key's state is even
// looked up: it asks no gate, spends no token, creates no key, and is
// reported to Observer.CallDone as Canceled, with no wire attempt.
//
// When the call made more than one wire attempt and the last one failed
// with an error, the error returned says how many were made, as in
// "resilix: 3 attempts: attempt timed out: no response headers after 1s",
// and unwraps to the last attempt's error. A call that made one attempt
// returns that attempt's error as it is, as does a request net/http
// refused to send, which makes one attempt (see "What could not be sent"
// in the package doc), and the caller's own cancellation or deadline comes
// back as its context's error, never wrapped.
//
// When the request's context carries a Report (see WithReport), RoundTrip
// writes what the call did to it as it returns, on the caller's
// goroutine, on every path above but a nil request or URL.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	req, err := checkRequest(req)
	if err != nil {
		return nil, err
	}
	o, _ := OverrideFrom(req.Context())
	rep := reportOf(req.Context())
	if err := o.check(); err != nil {
		closeBody(req.Body)
		if rep != nil {
			*rep = Report{RoundTrips: rep.RoundTrips + 1}
		}
		return nil, err
	}
	start := time.Now()
	if err := contextDone(req.Context(), start); err != nil {
		closeBody(req.Body)
		if rep != nil {
			*rep = Report{RoundTrips: rep.RoundTrips + 1, Outcome: policy.Canceled}
		}
		t.doneBefore(req, start, err)
		return nil, err
	}
	s := t.scopes.enter(t.key(req), start)
	defer s.leave()
	c := call{callPlan: callPlan{
		t:     t,
		s:     s,
		req:   req,
		ctx:   req.Context(),
		start: start,
		rep:   rep,
	}}
	c.narrow(&o)
	c.prio, c.prioNamed = t.priority(req, c.s)
	if c.s.throttle != nil || c.s.limiter != nil || c.s.set.propagate {
		c.tenant = t.tenant(req)
	}
	resp, err := c.run()
	if err != nil && c.wire > 1 && c.outcome != policy.Canceled {
		err = &attemptsError{n: c.wire, err: err}
	}
	c.done(resp, err)
	return resp, err
}

// doneBefore reports a call whose context was done before it began: a
// call of its key, Canceled, with no wire attempt. Its key is computed but
// its state neither looked up nor created.
func (t *Transport) doneBefore(req *http.Request, start time.Time, err error) {
	if o := t.obs; o != nil && o.CallDone != nil {
		prio, _ := t.priority(req, nil)
		o.CallDone(policy.CallInfo{
			Context:  req.Context(),
			Key:      t.key(req),
			Priority: prio,
			Outcome:  policy.Canceled,
			Duration: time.Since(start),
			Err:      err,
		})
	}
}

// priority reads the call's priority: the context's, else the header's
// (under any spelling of its name, see httpx.First) unless the transport
// distrusts headers, else Critical, and whether the call named it (by the
// context, or a header that parses). A malformed header is tolerated, and
// counted in s unless s is nil.
func (t *Transport) priority(req *http.Request, s *scope) (shedding.Priority, bool) {
	if p, ok := shedding.PriorityFrom(req.Context()); ok && p.Valid() {
		return p, true
	}
	if t.distrust {
		return shedding.Critical, false
	}
	v, ok := httpx.First(req.Header, t.priorityHeader)
	if !ok {
		return shedding.Critical, false
	}
	p, err := shedding.ParsePriority(v)
	if err != nil {
		if s != nil {
			t.malformed(req.Context(), s, t.priorityHeader, v)
		}
		return p, false
	}
	return p, true
}

// tenant reads the call's tenant id: the context's, else the header's,
// under any spelling of its name, unless the transport distrusts headers.
func (t *Transport) tenant(req *http.Request) string {
	if id, ok := tenant.From(req.Context()); ok || t.distrust {
		return id
	}
	v, _ := httpx.First(req.Header, t.tenantHeader)
	return v
}

// run admits the call's first attempt, has a copy of its body kept when
// the body has no GetBody and the call may send it again (see buffers),
// and runs the retry loop.
func (c *call) run() (*http.Response, error) {
	if !c.repeat {
		c.deposit = c.s.budget.Deposit(c.start)
	}
	var l leg
	if err := c.admit(&l.permits, ask{kind: policy.AttemptFirst, now: c.start, wait: true}); err != nil {
		closeBody(c.req.Body)
		c.outcome = policy.Rejected
		if rej, refused := err.(*policy.RejectedError); refused {
			c.refusal = rej
		} else {
			c.outcome = policy.Canceled
		}
		return nil, err
	}
	if !c.buffers() {
		return c.retry(&l, c.req.Body)
	}
	// The call is over for the buffered body when run returns, or when
	// a base's panic passes through it (see httpx.Replay.Release).
	c.rb = httpx.NewReplay(c.req.Body, c.s.set.replay, c.req.ContentLength)
	answered := false
	defer func() { c.rb.Release(answered) }()
	resp, err := c.retry(&l, c.rb.Next())
	answered = resp != nil
	return resp, err
}

// retry is the retry loop: it sends the first round, whose leg l is
// admitted, with body, then rounds until one asks for no retry (see
// leg.retryAsked), attempts or budget run out, or the next one could not start
// before the deadline; l is reused for each. The response a retry would
// supersede is kept until the retry is admitted: when a gate refuses it,
// the caller gets that response, intact. A first round that net/http
// would not send (policy.Invalid) was no call: it takes back its deposit,
// which would otherwise pay for other calls' retries.
func (c *call) retry(l *leg, body io.ReadCloser) (*http.Response, error) {
	resp, err := c.round(l, policy.AttemptFirst, body, c.start)
	if c.outcome == policy.Invalid {
		c.s.budget.TakeBack(c.deposit)
		return resp, err
	}
	for c.retryAsked && c.mayRetry {
		now := time.Now()
		free := c.unsentElsewhere(err, now)
		if c.spent() >= c.attempts && !free {
			break
		}
		delay, why := c.backoff(resp, err, now)
		body = nil // the replayed body of the next round
		if why == 0 && c.rb == nil {
			var gerr error
			if body, gerr = c.newBody(); gerr != nil {
				why = policy.SkipBodyError
			}
		}
		if why == 0 && !free && !c.s.budget.Withdraw(now) {
			closeBody(body)
			why = policy.SkipBudget
		}
		if why != 0 {
			c.skipped(why, 0)
			return resp, err
		}
		if !timing.Sleep(c.ctx, delay) {
			closeBody(body)
			httpx.Discard(resp)
			c.outcome = policy.Canceled
			return nil, c.ctx.Err()
		}
		c.retriesBegun++
		now = time.Now()
		*l = leg{drewToken: !free}
		if aerr := c.admit(&l.permits, ask{kind: policy.AttemptRetry, now: now, wait: true, prev: resp}); aerr != nil {
			closeBody(body)
			if rej, refused := aerr.(*policy.RejectedError); refused {
				c.refusal = rej
				c.skipped(policy.SkipGate, rej.Gate)
				return resp, err // the upstream's last word stands
			}
			httpx.Discard(resp)
			c.outcome = policy.Canceled
			return nil, aerr
		}
		if c.rb != nil {
			// The buffered body is taken over only now that the retry
			// is admitted: until then the attempt before may still be
			// sending it, for the response the caller would get. It may
			// have passed the bound meanwhile.
			if body = c.rb.Next(); body == nil {
				c.finish(&l.permits, discarded(now), false)
				c.skipped(c.bodySkip(), 0)
				return resp, err
			}
		}
		// Superseded, now that the retry is on its way. Drained in the
		// background, unless the retry took over its bulkhead slot: it
		// is then closed at once, so that the bulkhead's bound holds.
		if l.inherited != nil {
			l.inherited = nil
			closeBody(resp.Body)
		} else {
			httpx.Discard(resp)
		}
		c.retriesSent++
		if free {
			c.freed++
		}
		resp, err = c.round(l, policy.AttemptRetry, body, now)
	}
	return resp, err
}

// round makes one logical attempt whose first leg l has been admitted: a
// single leg, or, when the set hedges and the request may be sent twice,
// a hedged round. The first round sends the caller's own body (or a reader
// of it that keeps a copy); later ones a replayed body.
func (c *call) round(l *leg, kind policy.AttemptKind, body io.ReadCloser, now time.Time) (*http.Response, error) {
	if threshold, wait, ok := c.hedgeAfter(now); ok {
		return c.hedged(l, kind, body, now, threshold, wait)
	}
	c.prepare(l, kind, body, false, now)
	c.send(l)
	c.outcome, c.retryAsked = l.outcome, l.retryAsked
	if c.rep != nil {
		c.lane = l.laneName()
	}
	if l.drewToken && l.outcome == policy.Success && !l.retryAsked {
		c.refund(timing.Since(c.start), l.kind)
	}
	return l.resp, l.err
}

// replayable reports whether the request may be sent more than once: its
// method (or key, or mark) allows it, and its body can be sent again, or,
// kept by the replay buffer, may still be.
func (c *call) replayable() bool {
	if !httpx.Repeatable(c.req, markedRepeatable(c.ctx)) {
		return false
	}
	if c.rb != nil {
		return c.rb.Replayable()
	}
	return httpx.Rewindable(c.req)
}

// backoff returns the wait before the next round, or why there is none:
// the backoff (or Retry.Delay), stretched by a 429's or 503's Retry-After.
// It sets c.why, why the retry would be sent: an attempt whose error
// proves the request unsent (httpx.Unsent) may be retried whatever the
// method; any other only when the request may be sent twice. Either way
// the body must be replayable.
//
// With Replicas, it sets c.elsewhere when a lane the call has not used is
// open at now (neither ejected nor held), which the retry will take: an
// unsent attempt's retry is then sent at once (and draws no token, see
// retry), since the replica that refused it says nothing of the others;
// and a 429's or 503's Retry-After is the replica's that answered, whose
// lane it holds back (see leaveLane), so the retry waits the backoff
// alone. With no such lane open now, a Retry-After stretches the wait, or
// ends the call when it asks more than MaxRetryAfter, but only up to when
// the first lane the call has not used opens: the Retry-After binds its
// own replica, and the retry goes to that lane.
func (c *call) backoff(resp *http.Response, err error, now time.Time) (time.Duration, policy.SkipReason) {
	r := c.s.set.retry
	c.retryReason = policy.RetryAsked
	var opens time.Duration // until a lane the call has not used is open, if other
	other := false
	if c.s.lanes != nil {
		opens, other = c.s.lanes.OpenIn(now, atomic.LoadUint64(&c.used))
	}
	c.elsewhere = other && opens == 0
	if err != nil && httpx.Unsent(err) {
		c.retryReason = policy.RetryUnsent
	}
	if c.retryReason != policy.RetryUnsent && !httpx.Repeatable(c.req, markedRepeatable(c.ctx)) {
		return 0, policy.SkipNotReplayable
	}
	if c.rb != nil {
		if !c.rb.Replayable() {
			return 0, c.bodySkip()
		}
	} else if !httpx.Rewindable(c.req) {
		return 0, policy.SkipNotReplayable
	}
	if err != nil && httpx.Permanent(err) {
		return 0, policy.SkipPermanent
	}
	var d time.Duration
	switch {
	case c.retryReason == policy.RetryUnsent && c.elsewhere:
	case r.Delay != nil:
		d = max(r.Delay(c.retriesBegun+1), 0)
	default:
		d = r.Backoff(c.retriesBegun, rand.Float64())
	}
	if v := httpx.PushbackValue(resp); v != "" && r.MaxRetryAfter >= 0 {
		ra, ok := httpx.ParseRetryAfter(v, now)
		switch {
		case !ok:
			c.t.malformed(c.ctx, c.s, "Retry-After", v)
		case c.elsewhere:
			// The replica's, whose lane it holds: the retry goes to
			// another.
		case other && opens < ra && opens <= r.MaxRetryAfter:
			d = max(d, opens) // another replica's lane opens first
		case ra > r.MaxRetryAfter:
			return 0, policy.SkipRetryAfter
		default:
			d = max(d, ra)
		}
	}
	if dl, ok := c.ctx.Deadline(); ok && !now.Add(d).Before(dl) {
		return 0, policy.SkipDeadline
	}
	return d, 0
}

// unsentElsewhere reports whether the retry of the last attempt, which
// ended in err, is free: the attempt provably never reached a server, and
// a lane the call has not used is open at now. The retry then goes there
// at once, draws no token from the budget, and does not use up Attempts
// (see spent), neither its own nor those of the rounds after it, as
// gRPC's retry design (gRFC A6) retries an RPC that never left the client
// transparently, outside its policy's attempts. The lanes bound it: each
// free retry takes a lane the call had not used, so that the call has
// always used more lanes than it sent free retries; the last check keeps
// that bound should the lane be taken out between this look and the pick.
func (c *call) unsentElsewhere(err error, now time.Time) bool {
	if c.s.lanes == nil || err == nil || !httpx.Unsent(err) {
		return false
	}
	used := atomic.LoadUint64(&c.used)
	wait, ok := c.s.lanes.OpenIn(now, used)
	return ok && wait == 0 && c.freed < bits.OnesCount64(used)
}

// buffers reports whether the call keeps a copy of the request's body as
// its first attempt reads it: the body has no GetBody, the set's
// ReplayBuffer is on, and the call could send it again, as a retry (of an
// attempt that never left, whatever the method) or a hedge.
func (c *call) buffers() bool {
	b := c.req.Body
	if b == nil || b == http.NoBody || c.req.GetBody != nil || c.s.set.replay < 0 {
		return false
	}
	return c.mayRetry || c.mayHedge && httpx.Repeatable(c.req, markedRepeatable(c.ctx))
}

// bodySkip says why the buffered body cannot be replayed.
func (c *call) bodySkip() policy.SkipReason {
	if c.rb.Err() != nil {
		return policy.SkipBodyError
	}
	c.tooLarge = c.rb.TooLarge()
	return policy.SkipNotReplayable
}

// newBody returns a fresh copy of the request body for a replay, from
// GetBody.
func (c *call) newBody() (io.ReadCloser, error) {
	if c.req.GetBody == nil {
		return c.req.Body, nil // nil or http.NoBody, as backoff checked
	}
	return c.req.GetBody()
}

// narrow sets what the call may do: its key's set, as o narrows it, and
// as the attempt rule does: a call made for a request that is itself a
// retry or a hedge (attempt.Repeated) is sent once, and leaves the budget
// alone (see "Across services" in the package doc).
func (c *call) narrow(o *Override) {
	ch := c.s.set
	c.attempts, c.timeout = ch.attempts, ch.timeout
	if o.Attempts > 0 {
		c.attempts = min(c.attempts, o.Attempts)
	}
	if ch.attempts > 1 && attempt.Repeated(c.ctx) {
		c.attempts, c.repeat = 1, true
		c.s.repeats.Add(1)
	}
	if o.PerAttempt > 0 && (c.timeout == 0 || o.PerAttempt < c.timeout) {
		c.timeout = o.PerAttempt
	}
	c.mayRetry = ch.retry != nil && !o.NoRetry && c.attempts > 1
	c.mayHedge = c.s.hedge != nil && !o.NoHedge && c.attempts > 1
}

// done records the call as RoundTrip returns resp and err, once: what the
// caller's Report and Observer.CallDone share (the outcome, the status,
// the wire attempts) is read into one policy.CallInfo, from which, with
// the call's tally, the Report is written. It runs on the caller's
// goroutine: a hedged round collected, once decided, what the tally
// needs (see round.collect). Nothing is built when neither is asked for.
func (c *call) done(resp *http.Response, err error) {
	o := c.t.obs
	tell := o != nil && o.CallDone != nil
	if c.rep == nil && !tell {
		return
	}
	info := policy.CallInfo{
		Context:      c.ctx,
		Key:          c.s.key,
		Priority:     c.prio,
		Outcome:      c.outcome,
		WireAttempts: c.wire,
		Err:          err,
	}
	if resp != nil {
		info.StatusCode = resp.StatusCode
	}
	if r := c.rep; r != nil {
		*r = Report{
			RoundTrips:   r.RoundTrips + 1,
			Outcome:      info.Outcome,
			StatusCode:   info.StatusCode,
			WireAttempts: info.WireAttempts,
			Retries:      c.retriesSent,
			Hedges:       c.hedges,
			HedgeWon:     c.hedgeWon,
			Exhausted:    c.retryAsked && c.mayRetry && c.spent() >= c.attempts && c.skip == 0 && c.refusal == nil,
			Skipped:      c.skip,
			Refusal:      c.refusal,
			Lanes:        c.used,
			Lane:         c.lane,
		}
		if c.refusal != nil {
			r.Gate = c.refusal.Gate
		}
	}
	if tell {
		info.Duration = time.Since(c.start)
		o.CallDone(info)
	}
}

// hedgeAfter reports whether this round hedges and, if so, the threshold
// and how long to wait before the first hedge: the threshold, or the time
// left before the deadline if that is shorter. A request that may not be
// sent twice is never hedged, nor a call whose Override rules hedging
// out; a window still warming is counted.
func (c *call) hedgeAfter(now time.Time) (threshold, wait time.Duration, ok bool) {
	h := c.s.hedge
	c.tie = tieOff
	if !c.mayHedge || !c.replayable() {
		return 0, 0, false
	}
	threshold, ok = h.Threshold(now)
	if !ok {
		c.suppress(policy.HedgeWarming)
		return 0, 0, false
	}
	wait = threshold
	if h.Tied() {
		c.tie = tieLearn
		if d, ok := h.Ties().Delay(now); ok {
			c.tie, wait = tieRound, min(wait, d)
		}
	}
	if dl, has := c.ctx.Deadline(); has {
		wait = min(wait, dl.Sub(now))
	}
	if wait <= 0 {
		c.tie = tieOff
		return 0, 0, false
	}
	return threshold, wait, true
}
