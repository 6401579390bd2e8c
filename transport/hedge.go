package transport

import (
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// round is one hedged logical attempt. The first leg runs inline on the
// caller's goroutine with one timer armed; only when the timer fires and
// every gate passes does a hedge leg get a goroutine, and the round a
// channel. The first acceptable answer wins and the other legs are
// cancelled; if every leg fails, the last failure goes back to retry.
type round struct {
	c         call // a copy, so the caller's call stays on its stack
	h         *policy.HedgeState
	max       int // Hedge.MaximumConcurrent
	threshold time.Duration

	first  leg     // the inline leg, legs[0]
	legBuf [3]*leg // legs' storage for the default MaximumConcurrent

	mu      sync.Mutex
	legs    []*leg // every leg sent, in order; legs[0] runs inline
	live    int    // legs sent and not yet reported
	over    bool   // no more legs may start
	winner  *leg
	failed  []*leg // legs that reported a failure, in order
	results chan *leg
	timer   *time.Timer
	outcome policy.Outcome
}

// hedgeAfter reports whether this round hedges and, if so, the threshold
// and how long to wait before the first hedge: the threshold, or the time
// left before the deadline if that is shorter. A request that may not be
// sent twice is never hedged; a window still warming is counted.
func (c *call) hedgeAfter(now time.Time) (threshold, wait time.Duration, ok bool) {
	h := c.s.hedge
	if h == nil || !c.replayable() {
		return 0, 0, false
	}
	threshold, ok = h.Threshold(now)
	if !ok {
		c.suppress(policy.HedgeWarming)
		return 0, 0, false
	}
	wait = threshold
	if dl, has := c.ctx.Deadline(); has {
		wait = min(wait, dl.Sub(now))
	}
	return threshold, wait, wait > 0
}

// hedged runs a round whose first leg has passed the admission gates.
func (c *call) hedged(first *leg, kind policy.AttemptKind, body io.ReadCloser, replay bool, threshold, wait time.Duration) (*http.Response, error) {
	h := c.s.hedge
	r := &round{c: *c, h: h, max: h.Config().MaximumConcurrent, threshold: threshold, first: *first}
	l := &r.first
	r.c.prepare(l, kind, body, replay, true)
	r.legs = append(r.legBuf[:0], l)
	r.live = 1
	r.mu.Lock()
	r.timer = time.AfterFunc(wait, r.fire)
	r.mu.Unlock()

	r.c.send(l)
	r.report(l)
	resp, err := r.collect()
	c.wire, c.outcome = r.c.wire, r.outcome
	return resp, err
}

// fire runs on the timer's goroutine: it asks the hedging gates in order
// and, if all pass, sends one more leg.
func (r *round) fire() {
	c := &r.c
	now := time.Now()
	r.mu.Lock()
	if r.over {
		r.mu.Unlock()
		return
	}
	why := r.gate(now)
	r.mu.Unlock()
	if why != 0 {
		c.suppress(why)
		return
	}

	l := new(leg)
	if err := c.admit(l, policy.AttemptHedge, now, false); err != nil {
		c.suppress(policy.HedgeRejected)
		return
	}
	body, err := c.newBody()
	if err != nil {
		c.unadmit(l, now)
		c.suppress(policy.HedgeBodyError)
		return
	}

	// The budget is charged last, under the round's lock, so that a token
	// is spent only on a hedge that starts.
	r.mu.Lock()
	ended := r.over || r.live >= r.max || c.wire >= c.s.chain.attempts
	if ended || !c.s.budget.Withdraw(now) {
		r.mu.Unlock()
		closeBody(body)
		c.unadmit(l, now)
		if !ended {
			c.suppress(policy.HedgeBudget)
		}
		return
	}
	c.prepare(l, policy.AttemptHedge, body, true, true)
	r.legs = append(r.legs, l)
	r.live++
	if r.results == nil {
		r.results = make(chan *leg, r.max)
	}
	if r.live < r.max && c.wire < c.s.chain.attempts {
		r.timer.Reset(r.threshold)
	}
	r.mu.Unlock()

	r.h.Started(now)
	if o := c.t.obs; o != nil && o.HedgeStarted != nil {
		o.HedgeStarted(policy.HedgeInfo{Key: c.s.key, Priority: c.prio, Attempt: l.n, Threshold: r.threshold})
	}
	go r.run(l)
}

// gate asks the hedging gates after warming, in order: deadline,
// concurrency, priority, health, value. The budget is asked last, by fire.
// r.mu is held.
func (r *round) gate(now time.Time) policy.SuppressReason {
	c := &r.c
	if dl, ok := c.ctx.Deadline(); ok && dl.Sub(now) < r.h.Median(now) {
		return policy.HedgeDeadline
	}
	if r.live >= r.max || c.wire >= c.s.chain.attempts {
		return policy.HedgeConcurrency
	}
	if c.prio == shedding.Bulk {
		return policy.HedgePriority
	}
	rate := r.h.Rate(now)
	if c.s.breaker != nil {
		rate = c.s.breaker.Rate(now)
	}
	if !r.h.Healthy(rate) {
		return policy.HedgeHealth
	}
	if !r.h.Value(now) {
		return policy.HedgeValue
	}
	return 0
}

// run sends a hedge leg on its own goroutine.
func (r *round) run(l *leg) {
	r.c.send(l)
	r.report(l)
	r.results <- l // buffered for every leg: never blocks
}

// report settles a finished leg. The first acceptable answer wins: the
// legs still in flight are cancelled and observed as discarded at once, so
// the caller never waits on a loser. A leg that finishes after the round
// was won is closed.
func (r *round) report(l *leg) {
	c := &r.c
	now := time.Now()
	r.mu.Lock()
	l.done = true
	r.live--
	if l == r.legs[0] {
		// The inline leg is back: whatever happens, no more legs start.
		r.over = true
		r.timer.Stop()
	}
	if r.winner != nil {
		// Lost: cancelled and observed when the winner was chosen.
		r.mu.Unlock()
		if l.resp != nil {
			closeBody(l.resp.Body)
		}
		return
	}
	if l.outcome == policy.Failure {
		r.failed = append(r.failed, l)
		r.mu.Unlock()
		c.attemptDone(l)
		return
	}
	r.winner = l
	r.over = true
	r.timer.Stop()
	var losers []*leg
	for _, o := range r.legs {
		if !o.done {
			losers = append(losers, o)
		}
	}
	r.mu.Unlock()

	for _, o := range losers {
		o.cancel(errDiscarded)
		elapsed := now.Sub(o.dispatch)
		if elapsed >= r.threshold {
			// A leg cut short in the tail took at least this long. Left
			// out, the slow calls that hedging rescues would vanish from
			// the window, the quantile would sink, and more than 1 - q of
			// calls would be hedged; recorded at this lower bound, they
			// stay above the threshold, where they belong.
			r.h.Record(now, elapsed)
		}
		c.attemptDone(&leg{n: o.n, kind: o.kind, outcome: policy.Discarded, latency: elapsed})
	}
	c.attemptDone(l)
	if l.kind == policy.AttemptHedge && l.outcome == policy.Success {
		r.h.Won(now)
		if o := c.t.obs; o != nil && o.HedgeWon != nil {
			o.HedgeWon(policy.HedgeInfo{Key: c.s.key, Priority: c.prio, Attempt: l.n, Threshold: r.threshold})
		}
	}
}

// collect waits, after the inline leg has reported, for the round to be
// decided: a winner, or every leg failed. Superseded failures are drained
// and closed; the last one is the round's verdict.
func (r *round) collect() (*http.Response, error) {
	r.mu.Lock()
	for r.winner == nil && r.live > 0 {
		ch := r.results
		r.mu.Unlock()
		<-ch
		r.mu.Lock()
	}
	w, failed := r.winner, r.failed
	r.mu.Unlock()
	if w != nil {
		for _, f := range failed {
			httpx.Discard(f.resp)
		}
		r.outcome = w.outcome
		return w.resp, w.err
	}
	last := failed[len(failed)-1]
	for _, f := range failed[:len(failed)-1] {
		httpx.Discard(f.resp)
	}
	r.outcome = last.outcome
	return last.resp, last.err
}

func (c *call) suppress(why policy.SuppressReason) {
	if o := c.t.obs; o != nil && o.HedgeSuppressed != nil {
		o.HedgeSuppressed(policy.HedgeSuppression{Key: c.s.key, Priority: c.prio, Reason: why})
	}
}
