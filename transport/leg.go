package transport

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/lane"
	"github.com/resilix/resilix/internal/timing"
	"github.com/resilix/resilix/policy"
)

// leg is one wire attempt: the request it sends, the permits it holds and,
// once sent, what came back.
type leg struct {
	n    int
	kind policy.AttemptKind
	why  policy.RetryReason // of a retry
	req  *http.Request
	// own holds req when req is the leg's own shallow copy, and the body
	// wrapper its response will need, in one allocation; nil when req is
	// the caller's, a hedge leg's deep copy, or a copy whose response needs
	// no wrapper (only its body is replayed).
	own *ownRequest

	// ctx is the attempt's context: the caller's, or a child whose cancel
	// is held when the attempt has a timeout or may be discarded.
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *alarm // Timeout.PerAttempt, or the call's Override
	// roundTimed: the leg is a hedged round's inline leg, whose per-attempt
	// timeout the round's timer keeps (round.expires) instead of a timer
	// of its own.
	roundTimed bool

	permits // what it holds of the admission gates, from admit to finish

	// paid: the leg drew a token from the budget (a retry round's first
	// leg, or a hedge), which it refunds if its answer is the call's
	// success (see refund).
	paid bool

	// until is the caller's deadline (zero: none) and left the value of
	// a propagated attempt's timeout header, written by send as the
	// request is handed to the base (see leftHeader); nil when there is
	// none.
	until time.Time
	left  []string

	dispatch time.Time // set by prepare just before the wire call, when the leg is timed
	resp     *http.Response
	err      error
	outcome  policy.Outcome
	again    bool // the answer asks for a retry: Retry.If says so, or, with no If, it is a Failure
	latency  time.Duration

	// lane is the lane the leg is sent on (Set.Replicas), from the time
	// took until the lane is told how it went; nil otherwise.
	lane *lane.Lane[*lanePool]
	took time.Time
	// sent is the lane it was sent on, kept for AttemptDone after lane is
	// cleared; in a hedged round, guarded by the round's lock, since a leg
	// that lost is reported by the goroutine that decided the round.
	sent *lane.Lane[*lanePool]

	// A hedged round's legs; guarded by the round's lock.
	round *round
	state legState
	// grace, on a hedge leg that lost, cancels it when its time to bring
	// its headers runs out (see round.decideLocked); set as it is lost.
	grace *time.Timer
}

// legState is where a hedged round's leg is. Its transitions:
//
//	legOnWire → legAnswered  its answer came before the round was decided: evidence (round.settle)
//	legOnWire → legLost      the round was decided while it was on the wire: discarded (round.decideLocked)
//	any → legEnded           done with: reported (round.report), or gone in a panic (round.run)
type legState uint8

const (
	legOnWire legState = iota
	legAnswered
	legLost
	legEnded
)

// errDiscarded is the cancellation cause of a hedge leg that lost.
var errDiscarded = errors.New("resilix: hedge leg discarded")

// prepare builds the leg's request: the caller's own when nothing about it
// changes, else a shallow copy with the attempt's context and body; a hedge
// leg, which may still be running after the call is over, gets a deep copy
// (Request.Clone), so that it never reads what the caller may reuse. The
// caller's request is never modified. A leg that may be discarded always
// gets a cancellable context. admitted is the time its admission gates
// read. A per-attempt timeout that could only fire after the caller's
// deadline is not armed: the caller's context ends the attempt first.
func (c *call) prepare(l *leg, kind policy.AttemptKind, body io.ReadCloser, discardable bool, admitted time.Time) {
	c.wire++
	l.n, l.kind, l.ctx, l.sent = c.wire, kind, c.ctx, nil
	if kind == policy.AttemptRetry {
		l.why = c.why
	}
	d := c.timeout
	if d > 0 {
		if dl, ok := c.ctx.Deadline(); ok && dl.Before(admitted.Add(d)) {
			d = 0 // the caller's deadline comes first: the attempt's timer could not fire
		}
	}
	if d > 0 || discardable || c.s.chain.idle > 0 {
		l.ctx, l.cancel = context.WithCancelCause(c.ctx)
	}
	l.req = c.req
	switch {
	case kind == policy.AttemptHedge:
		l.req = c.req.Clone(l.ctx)
		l.req.Body = body
	case l.cancel == nil && !l.bulkhead && l.own == nil && body != c.req.Body:
		// Only the body changes (a replayed one), and the response will
		// need no wrapper: a plain copy.
		l.req = c.req.WithContext(l.ctx)
		l.req.Body = body
	case l.ctx != c.ctx || body != c.req.Body:
		if l.own == nil {
			l.own = new(ownRequest)
		}
		l.own.req = *c.req.WithContext(l.ctx) // inlined: the copy is made in place
		l.own.req.Body = body
		l.req = &l.own.req
	}
	if c.s.chain.propagate {
		c.stamp(l)
	}
	timed := c.s.chain.timed || timesAttemptsOf(c.t.obs)
	if !timed && d == 0 {
		return
	}
	// When the leg leaves. A gate may have made it wait, and a wait is
	// neither the dependency's latency nor the attempt's time. (Hedge
	// legs never wait at a gate.)
	sent := admitted
	if kind != policy.AttemptHedge && c.s.chain.mayQueue() {
		sent = timing.Since(admitted)
	}
	if timed {
		l.dispatch = sent
	}
	switch {
	case d == 0:
	case l.round != nil:
		// The inline leg of a hedged round: the round's one timer keeps
		// its time, with the hedges'.
		l.round.expires, l.roundTimed = sent.Add(d), true
	default:
		l.timer = newAlarm(c.start, sent.Add(d), l.cancel)
	}
}

// mayQueue reports whether an admission gate may hold a leg for a while:
// the limiter's queue, a bulkhead's or a rate limit's MaxWait, or a rate
// limit's store. The throttler and the breaker answer at once.
func (ch *chain) mayQueue() bool {
	return ch.limiter != nil || ch.bulkhead != nil || ch.rateLimit != nil
}

// send makes the wire call and settles what it holds: the breaker learns
// the outcome at headers; the context and the bulkhead slot are released
// now, or, when a response came back, when its body is closed or read to
// the end. A leg of a hedged round that lost while on the wire teaches
// nothing: it is released as discarded and what it got is closed; nor
// does a leg whose request net/http refused to send (httpx.Invalid),
// released as Invalid without asking Classify or Retry.If. If the base
// panics, everything the leg holds is released and the panic goes on.
//
// With Replicas, the call goes out on a lane the call has not used yet,
// and the lane learns first: a failure its lane explains (see
// lane.Report) is no evidence for the key's breaker, and a Retry-After
// that held its lane back does not push the key back.
func (c *call) send(l *leg) {
	s := c.s
	sent := false
	defer func() {
		if !sent {
			c.abandon(l)
		}
	}()
	rt := c.t.base
	if s.lanes != nil {
		rt = c.takeLane(l)
		l.tookLane()
	}
	if l.left != nil {
		c.leftHeader(l, time.Now())
	}
	resp, err := rt.RoundTrip(l.req)
	sent = true
	var now time.Time // the time of the answer: read only when the leg is timed
	timed := !l.dispatch.IsZero()
	if timed && (!s.chain.dateBySend || timesAttemptsOf(c.t.obs)) {
		now = l.answered()
	}
	resp, err = sane(resp, err)

	fired := false // the attempt's timer fired before its headers came
	switch {
	case l.timer != nil:
		fired = !l.timer.stop()
	case l.roundTimed:
		fired = l.round.headers()
	}
	timedOut := false
	if fired && c.ctx.Err() == nil {
		// The attempt ran out of time. If headers raced the timer and
		// lost, the context is cancelled, or about to be (the timer's
		// func runs on a goroutine of its own), and the body would fail
		// mid-read: it is the timeout it looks like.
		if resp != nil {
			closeBody(resp.Body)
			resp = nil
		}
		err = &attemptTimeoutError{after: c.timeout}
		timedOut = true
	}

	if l.round != nil && !l.round.settle(l) {
		// Lost. A hedge leg whose headers came within its grace has its
		// body drained, here on its own goroutine, so that its
		// connection is kept; any other answer is closed.
		if l.grace != nil && l.grace.Stop() {
			httpx.Drain(resp)
		} else if resp != nil {
			closeBody(resp.Body)
		}
		if l.lane != nil {
			// Its time on the wire is a lower bound of the lane's
			// latency, and no evidence of its health.
			c.leaveLane(l, nil, nil, policy.Discarded)
		}
		c.finish(&l.permits, discarded(now), false)
		free(l.cancel, nil)
		l.resp, l.err, l.outcome = nil, errDiscarded, policy.Discarded
		return
	}
	switch {
	case c.ctx.Err() != nil:
		l.outcome = policy.Canceled
	case err != nil && httpx.Invalid(err):
		// net/http would not send the request as it is: the caller's
		// bug, and no word from the dependency. No Classify, no If, no
		// retry.
		l.outcome = policy.Invalid
	default:
		l.outcome = s.chain.classify(resp, err)
		if r := s.chain.retry; r != nil && r.If != nil {
			l.again = r.If(resp, err)
		} else {
			l.again = l.outcome == policy.Failure
		}
	}

	if timed && now.IsZero() {
		// dateBySend: only the breaker will learn, and only a failure
		// needs the time it came back.
		if l.outcome == policy.Success {
			now = l.dispatch
		} else {
			now = l.answered()
		}
	}

	// The lane learns first; then the throttler, the breaker and the
	// limiter, at headers; the bulkhead holds its slot until the body is
	// done with.
	judged, pushback := l.outcome, resp // what the key's breaker and throttler learn
	if l.lane != nil {
		rep := c.leaveLane(l, resp, err, l.outcome)
		if rep.Explained && !l.bp.Probe() { // a half-open breaker's probe is the host's evidence
			judged = policy.Discarded
		}
		if rep.Held {
			pushback = nil
		}
	}
	bulkhead := c.finish(&l.permits, result{
		now:      now,
		outcome:  l.outcome,
		judged:   judged,
		latency:  l.latency,
		sampled:  resp != nil || timedOut,
		accepted: l.throttled && s.chain.throttler.Accepted(resp, err),
		pushback: pushback,
	}, true)
	if resp == nil {
		free(l.cancel, bulkhead)
	} else if l.cancel != nil || bulkhead != nil {
		var r *releaser
		if l.own != nil {
			r = &l.own.body
		} else {
			r = new(releaser)
		}
		r.rc, r.cancel, r.bulkhead = resp.Body, l.cancel, bulkhead
		// An upgraded stream may rightly be quiet; an empty body cannot
		// stall.
		if d := s.chain.idle; d > 0 && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != http.NoBody {
			watch(r, d, &c.t.watchdogs)
		}
		resp.Body = wrapBody(resp.Body, r)
	}
	l.resp, l.err = resp, err
}

// tookLane keeps the lane leg l was sent on for AttemptDone (see sent).
func (l *leg) tookLane() {
	if r := l.round; r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	l.sent = l.lane
}

// answered reads the time leg l's answer came back, and sets its latency
// from it.
func (l *leg) answered() time.Time {
	now := timing.Since(l.dispatch)
	l.latency = now.Sub(l.dispatch)
	return now
}

// abandon releases what a leg holds when its base panicked: its timer, its
// context, and its permits, as discarded, since a panic says nothing about
// the dependency.
func (c *call) abandon(l *leg) {
	if l.timer != nil {
		l.timer.stop()
	}
	if l.lane != nil {
		c.leaveLane(l, nil, nil, policy.Canceled)
	}
	c.finish(&l.permits, discarded(time.Now()), false)
	free(l.cancel, nil)
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

// ownRequest is a leg's shallow copy of the caller's request beside the
// body wrapper of the response it gets, so that an attempt that needs both
// allocates once. The wrapper, once in use, keeps the copy alive, as the
// response's Request field does anyway.
type ownRequest struct {
	req  http.Request
	body releaser
}

// releaser is a response body that releases what its attempt held, the
// attempt's context and its bulkhead slot, exactly once: at EOF, at a read
// error, or at Close.
type releaser struct {
	rc       io.ReadCloser
	cancel   context.CancelCauseFunc
	bulkhead *gate.Bulkhead // nil once a retry took the slot over
	done     atomic.Bool
	idle     *watchdog // Timeout.Idle's, or nil
}

func (r *releaser) release() {
	if r.done.CompareAndSwap(false, true) {
		if r.idle != nil {
			r.idle.stop()
		}
		free(r.cancel, r.bulkhead)
	}
}

// free releases what an attempt held: its context, if it has its own, and
// its bulkhead slot, if it took one.
func free(cancel context.CancelCauseFunc, bulkhead *gate.Bulkhead) {
	if cancel != nil {
		cancel(context.Canceled)
	}
	if bulkhead != nil {
		bulkhead.Release()
	}
}

func (r *releaser) Read(p []byte) (int, error) {
	w := r.idle
	if w == nil {
		n, err := r.rc.Read(p)
		if err != nil {
			r.release()
		}
		return n, err
	}
	w.reads.Add(1) // odd: a Read waits
	n, err := r.rc.Read(p)
	w.reads.Add(1)
	if err != nil {
		if err != io.EOF && w.fired.Load() {
			err = &idleTimeoutError{after: w.d}
		}
		r.release()
	}
	return n, err
}

func (r *releaser) Close() error {
	err := r.rc.Close()
	r.release()
	return err
}

func (r *releaser) unwrap() *releaser { return r }

// wrapBody returns r as the body in place of b, keeping what b can do
// beyond reading: an upgraded (101) connection stays writable, and
// half-closable where b is (httputil.ReverseProxy calls CloseWrite).
func wrapBody(b io.ReadCloser, r *releaser) io.ReadCloser {
	rw, ok := b.(io.ReadWriteCloser)
	if !ok {
		return r
	}
	if cw, ok := b.(interface{ CloseWrite() error }); ok {
		return &releaserRWC{releaserRW{r, rw}, cw}
	}
	return &releaserRW{r, rw}
}

// releaserRW keeps an upgraded body writable.
type releaserRW struct {
	*releaser
	w io.Writer
}

func (r *releaserRW) Write(p []byte) (int, error) { return r.w.Write(p) }

// releaserRWC keeps an upgraded body half-closable too.
type releaserRWC struct {
	releaserRW
	cw interface{ CloseWrite() error }
}

func (r *releaserRWC) CloseWrite() error { return r.cw.CloseWrite() }

// heldSlot returns the releaser of resp's body if it still holds a
// bulkhead slot, or nil. resp must not be in use by anyone else.
func heldSlot(resp *http.Response) *releaser {
	if resp == nil {
		return nil
	}
	b, ok := resp.Body.(interface{ unwrap() *releaser })
	if !ok {
		return nil
	}
	r := b.unwrap()
	if r.bulkhead == nil || r.done.Load() {
		return nil
	}
	return r
}

// idleChecks is how many times per Idle a watchdog looks at its body.
const idleChecks = 4

// watchdog bounds the waits of a response body's reads by Timeout.Idle
// with one timer, and no timer work per Read. Each Read adds one to reads
// as it starts and one as it ends, so reads is odd while a Read waits. The
// timer wakes every Idle/idleChecks; a wake that finds the same waiting
// Read (the same odd count) as the last idleChecks wakes before it knows
// that Read has waited at least Idle, and at most Idle/idleChecks more,
// and fires: it cancels the attempt's context with the idle error, which
// makes net/http end the Read and drop the connection, and stops for good;
// the Read's error releases what the attempt held. Otherwise it re-arms. A
// wake after the body is released does nothing, and nothing re-arms it:
// the timer ends with the body.
type watchdog struct {
	d     time.Duration
	r     *releaser
	reads atomic.Uint64
	fired atomic.Bool
	live  *atomic.Int64 // the transport's count of watchdogs not stopped

	mu      sync.Mutex
	timer   *time.Timer
	seen    uint64 // reads at the last wake
	waited  int    // wakes in a row that found the same Read waiting
	stopped bool
}

// watch starts a watchdog of Idle d over r's reads.
func watch(r *releaser, d time.Duration, live *atomic.Int64) {
	w := &watchdog{d: d, r: r, live: live}
	live.Add(1)
	r.idle = w
	w.mu.Lock()
	w.timer = time.AfterFunc(d/idleChecks, w.wake)
	w.mu.Unlock()
}

func (w *watchdog) wake() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	switch v := w.reads.Load(); {
	case v%2 == 0 || v != w.seen:
		w.seen, w.waited = v, 0 // nothing waits, or a new Read does
	default:
		w.waited++
	}
	if w.waited < idleChecks {
		w.timer.Reset(w.d / idleChecks)
		w.mu.Unlock()
		return
	}
	// Fired: the watchdog's work ends here. What the attempt holds is
	// released as the Read fails, which cancelling makes net/http's do
	// at once; a base deaf to cancellation keeps its slot until the
	// caller closes the body, so the bulkhead still bounds its exchanges.
	w.fired.Store(true)
	w.stopLocked()
	w.mu.Unlock()
	if w.r.cancel != nil {
		w.r.cancel(&idleTimeoutError{after: w.d})
	}
}

// stop ends the watchdog, once.
func (w *watchdog) stop() {
	w.mu.Lock()
	w.stopLocked()
	w.mu.Unlock()
}

func (w *watchdog) stopLocked() {
	if !w.stopped {
		w.stopped = true
		w.timer.Stop()
		w.live.Add(-1)
	}
}

// idleTimeoutError is the error of a response body read that waited
// Timeout.Idle for its next bytes. It matches policy.ErrAttemptTimeout and
// context.DeadlineExceeded, and is a net.Error whose Timeout is true.
type idleTimeoutError struct{ after time.Duration }

func (e *idleTimeoutError) Error() string {
	return "resilix: attempt timed out: no response body bytes for " + e.after.String()
}

func (e *idleTimeoutError) Is(target error) bool {
	return target == policy.ErrAttemptTimeout || target == context.DeadlineExceeded
}

func (e *idleTimeoutError) Timeout() bool   { return true }
func (e *idleTimeoutError) Temporary() bool { return true }

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

// attemptsError is the error of a call that made more than one wire
// attempt, the last of which failed with err: it says how many were made,
// "resilix: 3 attempts: " before err's message (without err's own
// "resilix: " prefix), and unwraps to err, so that errors.Is and errors.As
// reach everything err wraps.
type attemptsError struct {
	n   int
	err error
}

func (e *attemptsError) Error() string {
	return "resilix: " + strconv.Itoa(e.n) + " attempts: " + strings.TrimPrefix(e.err.Error(), "resilix: ")
}

func (e *attemptsError) Unwrap() error { return e.err }

// Timeout reports whether the last attempt's error says it timed out.
// http.Client's *url.Error asks its Err directly, without unwrapping, so
// without this a timeout would stop being one once wrapped. It is not a
// net.Error (no Temporary), so that errors.As finds a net.Error only where
// the last attempt's error has one.
func (e *attemptsError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.err, &t) && t.Timeout()
}
