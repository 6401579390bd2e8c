package transport

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/lane"
	"github.com/resilix/resilix/internal/timing"
	"github.com/resilix/resilix/policy"
)

// leg is one wire attempt: the request it sends, the permits it holds and,
// once sent, what came back.
type leg struct {
	n           int
	kind        policy.AttemptKind
	retryReason policy.RetryReason // of a retry
	req         *http.Request
	// own holds req when req is the leg's own shallow copy, and the body
	// wrapper its response will need, in one allocation; nil when req is
	// the caller's, a hedge leg's deep copy, or a copy whose response needs
	// no wrapper (only its body is replayed).
	own *ownRequest
	// src is the caller's own body as the leg sends it, when its reads
	// may fail, which tells its error from the dependency's; nil when
	// the leg sends no such body (or the call's Replay reads it, which
	// keeps its error itself).
	src *httpx.Source
	// mismatched: the leg sends an in-memory body whose length is not
	// the request's ContentLength (see httpx.Mismatched).
	mismatched bool

	// ctx is the attempt's context: the caller's, or a child whose cancel
	// is held when the attempt has a timeout or may be discarded.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// expires is when the attempt's per-attempt timeout (Timeout.PerAttempt,
	// or the call's Override) is due, set by prepare; zero when it has none.
	// timer keeps it, or, when roundTimed (a hedged round's inline leg),
	// the round's timer.
	expires    time.Time
	timer      *alarm
	roundTimed bool
	// late is, for an attempt its timeout ended, how long after expires
	// the client ended it (see send); zero otherwise.
	late time.Duration

	permits // what it holds of the admission gates and its lane, until end

	// drewToken: the leg drew a token from the budget (a retry round's first
	// leg, or a hedge), which it refunds if its answer is the call's
	// success (see refund).
	drewToken bool

	// until is the caller's deadline (zero: none) and left the value of
	// a propagated attempt's timeout header, written by send as the
	// request is handed to the base (see leftHeader); nil when there is
	// none.
	until time.Time
	left  []string
	conn  *connStamp // writes left again once the base has a connection; nil when it cannot

	dispatch   time.Time // set by prepare just before the wire call, when the leg is timed
	resp       *http.Response
	err        error
	outcome    policy.Outcome
	retryAsked bool // the answer asks for a retry: Retry.If says so, or, with no If, it is a Failure
	latency    time.Duration

	// sent is the lane it was sent on, kept for AttemptDone after lane is
	// cleared. In a hedged round, where a leg that lost is reported by the
	// round's owner, it is read there only once legOnLane says it is set.
	sent *lane.Lane[*lanePool]

	// shared: the leg is a hedged round's, whose state word it shares
	// with the round's owner (see legBack); read and written atomically.
	shared bool
	state  uint32
	// grace, on a hedge leg that lost, cancels it when its time to bring
	// its headers runs out (see round.decide); set before it is lost.
	grace *time.Timer
	// tie reads the 1xx answers of a leg marked as tied; nil when it is
	// not. unstarted: the leg was cancelled, before it said it started,
	// because another leg of its tied round did (see round.untie).
	tie       *tieWatch
	unstarted bool
}

// The bits of a hedged round's leg's state word: where the leg (its own
// goroutine, or the caller's for the inline leg) and the round's owner
// meet. Each bit is set by one side only, and a bit of the owner's is
// set only while the leg's that rules it out is not (compare-and-swap),
// so that each side learns from one atomic step what the other did:
//
//	legBack     the leg's: its wire call returned (comeBack), or it panicked (post)
//	legPosted   the leg's: its answer is on its way to the owner (post)
//	legLost     the owner's, before legBack: decided while the leg was on the wire (drop)
//	legDropped  the owner's, after legBack and before legPosted: decided without its answer (drop)
//	legExpired  the owner's, before legBack: the inline leg's per-attempt timeout came (expire)
//	legOnLane   the leg's: sent is set (tookLane)
const (
	legBack uint32 = 1 << iota
	legPosted
	legLost
	legDropped
	legExpired
	legOnLane
)

// comeBack marks leg l back from the wire, and returns its state as it
// was: whether it was lost, or timed out, while on the wire.
func (l *leg) comeBack() uint32 { return atomic.OrUint32(&l.state, legBack) }

// post marks l's answer on its way to its round's owner, and l back if
// it is not (a panic), unless the round was decided without it; it
// reports whether it did.
func (l *leg) post() bool {
	for {
		old := atomic.LoadUint32(&l.state)
		if old&(legLost|legDropped) != 0 {
			return false
		}
		if atomic.CompareAndSwapUint32(&l.state, old, old|legBack|legPosted) {
			return true
		}
	}
}

// drop settles l as its round is decided without it: lost when still on
// the wire, dropped when back but not posted, and left as it is when
// posted. It returns l's state as it leaves it.
func (l *leg) drop() uint32 {
	for {
		old := atomic.LoadUint32(&l.state)
		next := old | legDropped
		switch {
		case old&legPosted != 0:
			return old
		case old&legBack == 0:
			next = old | legLost
		}
		if atomic.CompareAndSwapUint32(&l.state, old, next) {
			return next
		}
	}
}

// lose settles l as lost while its round goes on, when it is still on
// the wire: a tied leg whose twin started first (see round.untie). It
// returns l's state as it leaves it.
func (l *leg) lose() uint32 {
	for {
		old := atomic.LoadUint32(&l.state)
		if old&(legBack|legPosted|legLost) != 0 {
			return old
		}
		if atomic.CompareAndSwapUint32(&l.state, old, old|legLost) {
			return old | legLost
		}
	}
}

// expire marks l, a round's inline leg, timed out unless it is back, and
// reports whether it did: the round's owner then cancels it.
func (l *leg) expire() bool {
	for {
		old := atomic.LoadUint32(&l.state)
		if old&legBack != 0 {
			return false
		}
		if atomic.CompareAndSwapUint32(&l.state, old, old|legExpired) {
			return true
		}
	}
}

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
	l.expires, l.late = time.Time{}, 0
	if kind == policy.AttemptRetry {
		l.retryReason = c.retryReason
	}
	d := c.timeout
	if d > 0 {
		if dl, ok := c.ctx.Deadline(); ok && dl.Before(admitted.Add(d)) {
			d = 0 // the caller's deadline comes first: the attempt's timer could not fire
		}
	}
	if d > 0 || discardable || c.s.set.idle > 0 {
		l.ctx, l.cancel = context.WithCancelCause(c.ctx)
	}
	// The caller's own body, when its reads may fail, is sent through a
	// Source, which keeps its error: the caller's, not the dependency's
	// (see send). A Replay keeps it itself.
	watch := c.rb == nil && httpx.Fallible(body)
	l.req, l.src = c.req, nil
	l.mismatched = c.rb == nil && !watch && httpx.Mismatched(body, c.req.ContentLength)
	switch {
	case kind == policy.AttemptHedge:
		l.req = c.req.Clone(l.ctx)
		if watch {
			l.src = new(httpx.Source)
			l.src.Reset(body)
			body = l.src
		}
		l.req.Body = body
	case !watch && l.cancel == nil && !l.bulkhead && l.own == nil && body != c.req.Body:
		// Only the body changes (a replayed one), and the response will
		// need no wrapper: a plain copy.
		l.req = c.req.WithContext(l.ctx)
		l.req.Body = body
	case watch || l.ctx != c.ctx || body != c.req.Body:
		if l.own == nil {
			l.own = new(ownRequest)
		}
		l.own.req = *c.req.WithContext(l.ctx) // inlined: the copy is made in place
		if watch {
			l.src = &l.own.src
			l.src.Reset(body)
			body = l.src
		}
		l.own.req.Body = body
		l.req = &l.own.req
	}
	if c.s.set.propagate {
		c.stamp(l)
	}
	l.tie, l.unstarted = nil, false // marked by its round (see markTie)
	timed := c.s.set.timed || timesAttemptsOf(c.t.obs)
	if !timed && d == 0 {
		return
	}
	// When the leg leaves. A gate may have made it wait, and a wait is
	// neither the dependency's latency nor the attempt's time. (Hedge
	// legs never wait at a gate.)
	sent := admitted
	if kind != policy.AttemptHedge && c.s.set.mayQueue() {
		sent = timing.Since(admitted)
	}
	if timed {
		l.dispatch = sent
	}
	if d == 0 {
		return
	}
	l.expires = sent.Add(d)
	if l.conn != nil {
		l.conn.end = l.expires // the attempt's own end, for the time left once connected
	}
	if !l.roundTimed { // else the round's timer keeps its time, with the first hedge's
		l.timer = newAlarm(c.start, l.expires, l.cancel)
	}
}

// mayQueue reports whether an admission gate may hold a leg for a while:
// the limiter's queue, a bulkhead's or a rate limit's MaxWait, or a rate
// limit's store. The throttler and the breaker answer at once.
func (ch *compiledSet) mayQueue() bool {
	return ch.limiter != nil || ch.bulkhead != nil || ch.rateLimit != nil
}

// send makes the wire call, judges its answer and ends the attempt (see
// end): the breaker learns the outcome at headers; the context and the
// bulkhead slot are released now, or, when a response came back, when its
// body is closed or read to the end. A leg of a hedged round that lost
// while on the wire teaches nothing: it is released as discarded and what
// it got is closed; nor does a leg whose request net/http refused to send
// (httpx.Invalid), released as Invalid without asking Classify or
// Retry.If. If the base panics, everything the leg holds is released and
// the panic goes on.
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
	if timed && (!s.set.dateBySend || timesAttemptsOf(c.t.obs)) {
		now = l.answered()
	}
	resp, err = sane(resp, err)

	var st uint32 // a hedged round's leg's state, as it came back
	if l.shared {
		st = l.comeBack()
	}
	fired := st&legExpired != 0 // the attempt's timer fired before its headers came
	if l.timer != nil {
		fired = !l.timer.stop()
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
		// How long after its deadline the client ended it. A leg that is
		// not timed informs no gate, but its lane and the observer.
		if timed && now.IsZero() {
			now = l.answered()
		}
		at := now
		if at.IsZero() {
			at = timing.Since(l.expires)
		}
		l.late = max(at.Sub(l.expires), 0)
	}

	if st&legLost != 0 {
		c.end(l, endLostBack, exit{resp: resp, err: err, r: discarded(now)})
		return
	}
	expired := false
	switch {
	case c.ctx.Err() != nil:
		l.outcome = policy.Canceled
		expired = resp == nil && c.ctx.Err() == context.DeadlineExceeded
	case err != nil && (httpx.Invalid(err) || c.bodyAtFault(l, err)):
		// net/http would not send the request as it is, or the caller's
		// body failed to read or did not match its ContentLength: the
		// caller's bug, and no word from the dependency. No Classify, no
		// If, no retry.
		l.outcome = policy.Invalid
	default:
		l.outcome = s.set.classify(resp, err)
		if r := s.set.retry; r != nil && r.If != nil {
			l.retryAsked = r.If(resp, err)
		} else {
			l.retryAsked = l.outcome == policy.Failure
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

	r := result{
		now:      now,
		outcome:  l.outcome,
		judged:   l.outcome,
		latency:  l.latency,
		sampled:  resp != nil || timedOut,
		accepted: l.throttled && !expired && s.set.throttler.Accepted(resp, err),
		expired:  expired,
		pushback: resp,
	}
	if timedOut && l.outcome.Evidence() && timing.Stalled(l.late) {
		// The client's own stall ended it, not the dependency's silence:
		// its gates learn what they learn of a caller's cancellation,
		// nothing. The call, its retry and the observer see the timeout.
		r.outcome, r.judged, r.stalled = policy.Canceled, policy.Canceled, true
	}
	c.end(l, endAnswered, exit{resp: resp, err: err, r: r})
}

// ending is which end of a leg's attempt end is asked for. A leg sent
// ends as endAnswered or endPanicked, or, lost while on the wire, twice:
// as endLost when its round is decided and as endLostBack when its wire
// call returns. A round abandoned for a panic ends its legs still on the
// wire as endLost, its inline leg after that leg's own endPanicked.
type ending uint8

const (
	// endAnswered: back from the wire with its answer, which is evidence
	// (send). Everything ends, and the observer is told its outcome.
	endAnswered ending = iota
	// endLost: lost to another leg's win while on the wire, as its round
	// is decided (round.discard). Only its context (unless it has a
	// grace) and the observer's report end now, as Discarded: at the
	// moment of its cancellation, as Observer.AttemptDone promises. What
	// it holds on the wire is let go as its wire call returns.
	endLost
	// endLostBack: a lost leg's wire call has returned (send). Its answer
	// is disposed of, and its lane, gates and context let go as
	// Discarded; the observer was told at endLost.
	endLostBack
	// endPanicked: a panic before its base returned (abandon).
	// Its lane, gates and context are let go, since a panic says nothing
	// about the dependency; the observer is not told of it.
	endPanicked
)

// exit is how a leg's attempt came back, as end is told: the base's
// answer and error, and what its gates learn (r.judged and r.pushback
// before its lane's word on them).
type exit struct {
	resp *http.Response
	err  error
	r    result
}

// end is the one place where a leg's attempt ends, as grpc-go's
// csAttempt.finish is for its attempts: its lane learns how it went
// first, then its gates (finish); its context and bulkhead slot are let
// go, or handed to the answer's body, which lets them go once done with
// (see releaser); and last the observer is told (AttemptDone). How much of
// that happens is e's (see ending). Each part ends once: the lane and the
// gates' permits are cleared as they are told, the context's cancel
// does nothing a second time, and only endAnswered and endLost report.
func (c *call) end(l *leg, e ending, x exit) {
	resp, err := x.resp, x.err
	switch e {
	case endLost:
		if l.grace == nil {
			l.cancel(errDiscarded)
		}
		var sent *lane.Lane[*lanePool]
		if atomic.LoadUint32(&l.state)&legOnLane != 0 { // l may still be taking its lane (see sent)
			sent = l.sent
		}
		c.attemptDone(l, sent, policy.Discarded, x.r.latency, nil, nil, false)
		return
	case endLostBack:
		// Its time on the wire is a lower bound of the lane's latency,
		// and no evidence of its health; with no headers, the lane is
		// silent until it answers (see lane.TakeOnce).
		silent := resp == nil && !httpx.Undialed(err) && !l.unstarted
		// A hedge leg whose headers came within its grace has its body
		// drained, here on its own goroutine, so that its connection is
		// kept; any other answer is closed.
		if l.grace != nil && l.grace.Stop() {
			httpx.Drain(resp)
		} else if resp != nil {
			closeBody(resp.Body)
		}
		if l.lane != nil {
			c.leaveLane(l, nil, nil, policy.Discarded, silent)
		}
		c.finish(&l.permits, x.r, false)
		free(l.cancel, nil)
		l.resp, l.err, l.outcome = nil, errDiscarded, policy.Discarded
		return
	case endPanicked:
		if l.lane != nil {
			c.leaveLane(l, nil, nil, policy.Canceled, false)
		}
		c.finish(&l.permits, x.r, false)
		free(l.cancel, nil)
		return
	}

	// Answered. The lane learns first; then the throttler, the breaker
	// and the limiter, at headers; the bulkhead holds its slot until the
	// body is done with.
	r := x.r
	if l.lane != nil {
		rep := c.leaveLane(l, resp, err, r.outcome, false)
		if rep.Explained && !l.bp.Probe() { // a half-open breaker's probe is the host's evidence
			r.judged = policy.Discarded
		}
		if rep.Held {
			r.pushback = nil
		}
	}
	bulkhead := c.finish(&l.permits, r, true)
	if resp == nil {
		free(l.cancel, bulkhead)
	} else if l.cancel != nil || bulkhead != nil {
		var rel *releaser
		if l.own != nil {
			rel = &l.own.body
		} else {
			rel = new(releaser)
		}
		rel.rc, rel.cancel, rel.bulkhead = resp.Body, l.cancel, bulkhead
		// An upgraded stream may rightly be quiet; an empty body cannot
		// stall.
		if d := c.s.set.idle; d > 0 && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != http.NoBody {
			watch(rel, d, &c.t.watchdogs)
		}
		resp.Body = wrapBody(resp.Body, rel)
	}
	l.resp, l.err = resp, err
	// The observer hears the outcome as classified, the one the call and
	// its retry go by, and whether the gates took it for the client's
	// stall.
	c.attemptDone(l, l.sent, l.outcome, l.latency, resp, err, r.stalled)
}

// bodyAtFault reports whether err, leg l's error, is the caller's body's
// doing: the error the body returned as the leg read or closed it, or a
// body that does not match the request's ContentLength, whose refusal by
// net/http may come back as the read error of the connection it closed
// for it (over HTTP/1 the two race).
func (c *call) bodyAtFault(l *leg, err error) bool {
	length := c.req.ContentLength
	switch {
	case l.mismatched:
		return true
	case l.src != nil:
		return l.src.Failed(err) || l.src.Mismatch(length)
	case c.rb != nil:
		be := c.rb.Err()
		return be != nil && errors.Is(err, be) || c.rb.Mismatch(length)
	}
	return false
}

// tookLane keeps the lane leg l was sent on for AttemptDone (see sent).
func (l *leg) tookLane() {
	l.sent = l.lane
	if l.shared {
		atomic.OrUint32(&l.state, legOnLane)
	}
}

// answered reads the time leg l's answer came back, and sets its latency
// from it.
func (l *leg) answered() time.Time {
	now := timing.Since(l.dispatch)
	l.latency = now.Sub(l.dispatch)
	return now
}

// abandon ends a leg whose base panicked: its timer is stopped, and the
// rest ends as endPanicked.
func (c *call) abandon(l *leg) {
	if l.timer != nil {
		l.timer.stop()
	}
	c.end(l, endPanicked, exit{r: discarded(time.Now())})
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
// reader of the caller's body it sends and the body wrapper of the
// response it gets, so that an attempt that needs them allocates once.
// The wrapper, once in use, keeps the copy alive, as the response's
// Request field does anyway.
type ownRequest struct {
	req  http.Request
	src  httpx.Source // the caller's body, when the leg watches its reads
	body releaser
}

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

// takeLane picks the lane leg l is sent on, among those its call has not
// used yet, and returns its pool; it starts a refresh of the key's
// Endpoints in the background if one is due. A lane placed anew (Redial)
// has its idle connections closed first, until it succeeds, so that its
// attempt dials: the failed answer's connection is closed once its body
// is done with.
func (c *call) takeLane(l *leg) http.RoundTripper {
	s := c.s
	if l.took = l.dispatch; l.took.IsZero() { // a timed leg's dispatch is now
		l.took = timing.Since(c.start)
	}
	if s.lanes.StartRefresh(l.took) {
		go s.resolve(c.t.obs, hostport(l.req))
	}
	if used := atomic.LoadUint64(&c.used); c.sendsOnce(l.req) {
		l.lane = s.lanes.TakeOnce(l.took, used)
	} else {
		l.lane = s.lanes.Take(l.took, used)
	}
	if l.lane.Redial.Load() {
		l.lane.Pool.CloseIdleConnections()
	}
	atomic.OrUint64(&c.used, 1<<l.lane.Index)
	return l.lane.Pool
}

// sendsOnce reports whether req, a leg's request, is one the call may
// not send twice, as its retry would judge it (see backoff): its method
// (or key, or mark) does not allow it, or its body cannot be sent again.
// Such a leg takes its lane with TakeOnce. A body the replay buffer keeps
// can be sent again once it is complete, or, while still being read, when
// its announced size fits the buffer: one of unknown size may outgrow it,
// and when in doubt, resilix does not repeat.
func (c *call) sendsOnce(req *http.Request) bool {
	if !httpx.Repeatable(req, markedRepeatable(c.ctx)) {
		return true
	}
	if rb := c.rb; rb != nil {
		n := req.ContentLength
		return !rb.Replayable() || !rb.Complete() && (n <= 0 || n > int64(c.s.set.replay))
	}
	return !httpx.Rewindable(req)
}

// leaveLane tells leg l's lane how its attempt went: outcome o, resp the
// answer if any, err the attempt's error if any (a refused or timed-out
// dial, or no headers within the attempt's timeout, takes the lane out
// at once, unless the client ended the timeout late: see lane.Answer).
// It closes the idle connections of the lanes the outcome ejected, and
// of a lane drained by it.
func (c *call) leaveLane(l *leg, resp *http.Response, err error, o policy.Outcome, silent bool) lane.Report[*lanePool] {
	var now time.Time
	if l.latency > 0 { // send read the time of the answer, from took
		now = l.took.Add(l.latency)
	} else {
		now = timing.Since(l.took)
	}
	var a lane.Answer
	if v := httpx.PushbackValue(resp); v != "" {
		a.Hold, _ = httpx.ParseRetryAfter(v, now)
	}
	a.Hint, _ = httpx.PushbackHint(resp) // the server's own, shorter word for how long it means
	_, timedOut := err.(*attemptTimeoutError)
	switch {
	case resp == nil && httpx.Undialed(err):
		a.Kind = lane.Unreached
	case timedOut: // no headers within the attempt's timeout
		a.Kind, a.Late = lane.Mute, l.late
	case silent || resp == nil && o == policy.Failure:
		a.Kind = lane.Silent
	}
	c.readLoad(resp, &a)
	rep := c.s.lanes.Done(l.lane, now, now.Sub(l.took), o, a)
	l.lane = nil
	obs := c.t.obs
	// The lane's return came before the outcome that may eject it again.
	if e := rep.Returned; e.Lane != nil && obs != nil && obs.LaneReturned != nil {
		obs.LaneReturned(c.laneEjection(e))
	}
	for _, e := range rep.Ejected {
		e.Lane.Pool.CloseIdleConnections()
		if obs != nil && obs.LaneEjected != nil {
			obs.LaneEjected(c.laneEjection(e))
		}
	}
	if rep.Drained != nil {
		rep.Drained.Pool.CloseIdleConnections()
	}
	return rep
}

// laneName names the lane leg l was last sent on, for AttemptInfo.Lane:
// its address, or its index when it has none; "" when it took none.
func (l *leg) laneName() string { return laneName(l.sent) }

func laneName(sent *lane.Lane[*lanePool]) string {
	if sent == nil {
		return ""
	}
	return policy.LaneName(sent.Addr, sent.Index)
}

// attemptDone tells the observer that leg l's attempt ended with outcome
// o after latency, on lane sent, with resp or err, and whether its
// timeout was the client's stall. It reads of l only what is fixed before
// the leg is sent, so that the goroutine that decided a round may report
// a leg still on the wire (see end).
func (c *call) attemptDone(l *leg, sent *lane.Lane[*lanePool], o policy.Outcome, latency time.Duration, resp *http.Response, err error, stalled bool) {
	if obs := c.t.obs; obs != nil && obs.AttemptDone != nil {
		info := policy.AttemptInfo{
			Context: c.ctx,
			Key:     c.s.key,
			Kind:    l.kind,
			Attempt: l.n,
			Outcome: o,
			Latency: latency,
			Err:     err,
			Reason:  l.retryReason,
			Lane:    laneName(sent),
			Stalled: stalled,
		}
		if sent != nil {
			info.LaneIndex = sent.Index
		}
		if resp != nil {
			info.StatusCode = resp.StatusCode
		}
		obs.AttemptDone(info)
	}
}
