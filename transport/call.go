package transport

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// RoundTrip runs req through the key's chain. It follows the
// http.RoundTripper contract: req is never modified, req.Body is closed on
// every path, and exactly one of the results is non-nil.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	c := call{
		t:     t,
		s:     t.scopes.get(t.key(req), start),
		req:   req,
		ctx:   req.Context(),
		start: start,
	}
	c.prio = t.priority(req, c.s)
	resp, err := c.run()
	if o := t.obs; o != nil && o.CallDone != nil {
		info := policy.CallInfo{
			Key:          c.s.key,
			Priority:     c.prio,
			Outcome:      c.outcome,
			Duration:     time.Since(start),
			WireAttempts: c.wire,
			Err:          err,
		}
		if resp != nil {
			info.StatusCode = resp.StatusCode
		}
		o.CallDone(info)
	}
	return resp, err
}

// priority reads the call's priority: the context's, else the header's,
// else Critical. A malformed header is counted and tolerated.
func (t *Transport) priority(req *http.Request, s *scope) shedding.Priority {
	if p, ok := shedding.PriorityFrom(req.Context()); ok && p.Valid() {
		return p
	}
	vs := req.Header[t.priorityHeader]
	if len(vs) == 0 {
		return shedding.Critical
	}
	p, err := shedding.ParsePriority(vs[0])
	if err != nil {
		t.malformed(s, t.priorityHeader, vs[0])
	}
	return p
}

func (t *Transport) malformed(s *scope, header, value string) {
	s.malformed.Add(1)
	if o := t.obs; o != nil && o.MalformedHeader != nil {
		o.MalformedHeader(policy.MalformedHeader{Key: s.key, Header: header, Value: value})
	}
}

// call is the state of one logical call. It lives on RoundTrip's stack.
type call struct {
	t     *Transport
	s     *scope
	req   *http.Request
	ctx   context.Context
	start time.Time
	prio  shedding.Priority

	wire    int            // wire attempts made
	outcome policy.Outcome // of what the call returns
}

// run is the retry loop: attempts until one is not a failure, attempts or
// budget run out, or the next one could not start before the deadline.
func (c *call) run() (*http.Response, error) {
	ch := c.s.chain
	c.s.budget.Deposit(c.start)
	var body io.ReadCloser // the replayed body of the next attempt
	for n := 1; ; n++ {
		kind := policy.AttemptFirst
		if n > 1 {
			kind = policy.AttemptRetry
		}
		resp, err := c.attempt(n, kind, body)
		if c.outcome != policy.Failure || ch.retry == nil || n >= ch.attempts {
			return resp, err
		}
		now := time.Now()
		delay, why := c.backoff(n, resp, now)
		if why == 0 && !c.s.budget.Withdraw(now) {
			why = policy.SkipBudget
		}
		if why == 0 {
			var gerr error
			if body, gerr = c.newBody(); gerr != nil {
				why = policy.SkipBodyError
			}
		}
		if why != 0 {
			c.skipped(why, n)
			return resp, err
		}
		httpx.Discard(resp)
		if !sleep(c.ctx, delay) {
			closeBody(body)
			c.outcome = policy.Canceled
			return nil, c.ctx.Err()
		}
	}
}

// backoff returns the wait before retry n, or why there is no retry.
func (c *call) backoff(n int, resp *http.Response, now time.Time) (time.Duration, policy.SkipReason) {
	r := c.s.chain.retry
	if !httpx.Replayable(c.req, markedRepeatable(c.ctx)) {
		return 0, policy.SkipNotReplayable
	}
	d := r.Backoff(n, rand.Float64())
	if resp != nil && r.MaxRetryAfter >= 0 {
		if v := resp.Header.Get("Retry-After"); v != "" {
			ra, ok := httpx.ParseRetryAfter(v, now)
			switch {
			case !ok:
				c.t.malformed(c.s, "Retry-After", v)
			case ra > r.MaxRetryAfter:
				return 0, policy.SkipRetryAfter
			default:
				d = max(d, ra)
			}
		}
	}
	if dl, ok := c.ctx.Deadline(); ok && !now.Add(d).Before(dl) {
		return 0, policy.SkipDeadline
	}
	return d, 0
}

// newBody returns a fresh copy of the request body for a replay.
func (c *call) newBody() (io.ReadCloser, error) {
	if c.req.GetBody == nil {
		return c.req.Body, nil // nil or http.NoBody, as Replayable checked
	}
	return c.req.GetBody()
}

func (c *call) skipped(why policy.SkipReason, n int) {
	if o := c.t.obs; o != nil && o.RetrySkipped != nil {
		o.RetrySkipped(policy.RetrySkip{Key: c.s.key, Priority: c.prio, Reason: why, Attempt: n})
	}
}

// attempt makes wire attempt n. For n > 1, body is the replayed body. It
// sets c.outcome to the attempt's classification.
func (c *call) attempt(n int, kind policy.AttemptKind, body io.ReadCloser) (*http.Response, error) {
	ch := c.s.chain
	r := c.req
	var l *leg
	if ch.timeout > 0 {
		actx, cancel := context.WithCancelCause(c.ctx)
		l = &leg{ctx: actx, cancel: cancel}
		l.timer = time.AfterFunc(ch.timeout, l.expire)
		r = r.WithContext(actx)
	} else if n > 1 {
		r = r.WithContext(c.ctx)
	}
	if n > 1 {
		r.Body = body
	}

	c.wire++
	dispatch := time.Now()
	resp, err := c.t.base.RoundTrip(r)
	latency := time.Since(dispatch)
	resp, err = sane(resp, err)

	if l != nil {
		resp, err = l.settle(c, resp, err, ch.timeout)
	}

	switch {
	case c.ctx.Err() != nil:
		c.outcome = policy.Canceled
	default:
		c.outcome = ch.classify(resp, err)
	}
	if o := c.t.obs; o != nil && o.AttemptDone != nil {
		info := policy.AttemptInfo{
			Key:     c.s.key,
			Kind:    kind,
			Attempt: n,
			Outcome: c.outcome,
			Latency: latency,
			Err:     err,
		}
		if resp != nil {
			info.StatusCode = resp.StatusCode
		}
		o.AttemptDone(info)
	}
	return resp, err
}

// errNilResponse replaces a base RoundTripper's (nil, nil).
var errNilResponse = errors.New("resilix: base RoundTripper returned a nil response and a nil error")

// sane enforces the RoundTripper contract on what the base returned.
func sane(resp *http.Response, err error) (*http.Response, error) {
	switch {
	case err != nil && resp != nil:
		closeBody(resp.Body)
		return nil, err
	case err == nil && resp == nil:
		return nil, errNilResponse
	case resp != nil && resp.Body == nil:
		resp.Body = http.NoBody
	}
	return resp, err
}

func closeBody(b io.ReadCloser) {
	if b != nil {
		_ = b.Close()
	}
}

// sleep waits d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// leg holds what one wire attempt must release once its response is done
// with: the attempt's context and timer. Once headers arrive it becomes the
// response body, and releases on EOF, read error or Close, exactly once.
type leg struct {
	rc     io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	done   atomic.Bool
}

func (l *leg) expire() { l.cancel(policy.ErrAttemptTimeout) }

// settle is called with the base's results. It turns a per-attempt timeout
// into an error that says so, and either releases the leg now or hands it
// the response body to release later.
func (l *leg) settle(c *call, resp *http.Response, err error, after time.Duration) (*http.Response, error) {
	fired := !l.timer.Stop()
	if err == nil && fired {
		// Headers raced the timer and lost: the context is already
		// cancelled, so the body would fail mid-read. Treat it as the
		// timeout it is.
		closeBody(resp.Body)
		resp, err = nil, context.Canceled
	}
	if err != nil {
		if c.ctx.Err() == nil && errors.Is(context.Cause(l.ctx), policy.ErrAttemptTimeout) {
			err = &attemptTimeoutError{after: after}
		}
		l.release()
		return nil, err
	}
	l.rc = resp.Body
	if rw, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = &legRW{leg: l, w: rw}
	} else {
		resp.Body = l
	}
	return resp, nil
}

func (l *leg) release() {
	if l.done.CompareAndSwap(false, true) {
		l.cancel(context.Canceled)
	}
}

func (l *leg) Read(p []byte) (int, error) {
	n, err := l.rc.Read(p)
	if err != nil {
		l.release()
	}
	return n, err
}

func (l *leg) Close() error {
	err := l.rc.Close()
	l.release()
	return err
}

// legRW keeps a 101 Switching Protocols body writable.
type legRW struct {
	*leg
	w io.Writer
}

func (l *legRW) Write(p []byte) (int, error) { return l.w.Write(p) }

// attemptTimeoutError is the error of an attempt cut short by
// Timeout.PerAttempt. It matches policy.ErrAttemptTimeout and
// context.DeadlineExceeded, and is a net.Error whose Timeout is true.
type attemptTimeoutError struct{ after time.Duration }

func (e *attemptTimeoutError) Error() string {
	return "resilix: attempt timed out: no response headers after " + e.after.String()
}

func (e *attemptTimeoutError) Is(target error) bool {
	return target == policy.ErrAttemptTimeout || target == context.DeadlineExceeded
}

func (e *attemptTimeoutError) Timeout() bool   { return true }
func (e *attemptTimeoutError) Temporary() bool { return true }
