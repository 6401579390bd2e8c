package transport

import (
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/hedge"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/timing"
	"github.com/resilix/resilix/policy"
)

// round is one hedged logical attempt. The first leg runs inline on the
// caller's goroutine with one timer armed; only when the timer fires and
// every gate passes does a hedge leg get a goroutine. The first acceptable
// answer (a Success that asks for no retry, or a request net/http refused
// to send, which every leg would get again) wins and the legs still on the
// wire lose; if no leg's answer is acceptable, the last one goes back to
// retry, which asks it whether to retry.
//
// A leg is settled exactly once, under the round's lock, by whichever comes
// first: its own answer (the leg is then evidence, taught to the gates
// with its outcome), or another leg's win while it is still on the wire
// (it is then lost: cancelled, reported discarded, and it teaches nothing
// when it comes back). No leg ever sends on anything, so no leg can block
// once the caller has gone, however many legs the round started.
//
// The caller's request is read only while the round is undecided and the
// caller is inside RoundTrip: a hedge leg sends a deep copy, so a loser
// still inside a slow base never touches the request the caller may reuse.
type round struct {
	c         call // a copy, so the caller's call stays on its stack
	h         *hedge.State
	max       int // Hedge.MaxConcurrent
	threshold time.Duration
	getBody   func() (io.ReadCloser, error) // the request's, read once by the caller

	first  leg     // the inline leg, legs[0]
	legBuf [3]*leg // legs' storage for the default MaxConcurrent

	mu    sync.Mutex
	cond  sync.Cond // on mu: signalled when a leg ends or a hedge's decision does
	state roundState
	// hedging is where the next hedge stands: none pending, being
	// decided (the round waits for the decision), or awaiting the body
	// the first leg is still sending (see awaitBody).
	hedging hedgeState
	legs    []*leg // every leg sent, in order; legs[0] runs inline
	live    int    // legs sent and not yet ended
	winner  *leg
	failed  *leg // the last leg that failed; earlier ones are discarded
	starter *leg // the first leg of a tied round that said it started
	twice   *leg // a later leg of that round that said so too
	panic   any  // a hedge leg's panic, to re-raise on the caller's goroutine
	// timer is the round's one timer: it fires for the next hedge, due,
	// and for the inline leg's per-attempt timeout, expires, whichever
	// comes first (a zero time is none); expired says that it cancelled
	// the inline leg before its headers came.
	timer   *roundTimer // nil once stopped
	due     time.Time
	expires time.Time
	expired bool
	refused int // hedges the budget refused in this round: later tries back off
	// rang: the timer's func has run, or may run, so a fire may still be
	// using the round after the caller is done with it.
	rang bool
}

// roundState is where a round is in its life. Its transitions:
//
//	roundOpen → roundClosed   the inline leg came back (report)
//	roundOpen → roundDecided  a leg won, a leg panicked (decideLocked)
//	roundClosed → roundDecided  the same, or the caller collected it
type roundState uint8

const (
	roundOpen    roundState = iota // the inline leg is on the wire: hedges may start
	roundClosed                    // no more legs may start; the legs on the wire may still win
	roundDecided                   // a winner, a panic, or collected: whatever ends now is thrown away
)

// hedgeState is where a round's next hedge stands. Its transitions:
//
//	hedgeIdle → hedgeDeciding          its time came and the hedging gates passed (hedge)
//	hedgeDeciding → hedgeIdle          sent, or refused (hedge, launch, budgetRefusedLocked)
//	hedgeDeciding → hedgeAwaitingBody  the first leg is still sending the body (awaitBody)
//	hedgeAwaitingBody → hedgeIdle      the body is in and the timer fires (hedge), or the inline leg came back (report)
type hedgeState uint8

const (
	hedgeIdle hedgeState = iota
	hedgeDeciding
	hedgeAwaitingBody
)

// over reports whether the round can start no more legs. r.mu is held.
func (r *round) over() bool { return r.state != roundOpen }

// rounds holds the rounds that ended without their timer ever firing:
// most rounds, since most calls are not hedged.
var rounds sync.Pool

// newRound returns a zero round, from the pool unless the call runs in a
// synctest bubble (see alarm).
func newRound(start time.Time) *round {
	if !inBubble(start) {
		if r, _ := rounds.Get().(*round); r != nil {
			return r
		}
	}
	return new(round)
}

// release puts the round back in the pool (outside a synctest bubble)
// once the caller has its answer, when nothing else can still reach it:
// its timer never fired. A fire may run on after it has re-armed the
// timer or after the round was decided, and only a fire sends hedge legs,
// whose goroutines, grace timers and drains hold the round. The inline
// leg's request copy and body wrapper, which the caller keeps, are not in
// the round.
func (r *round) release() {
	r.mu.Lock()
	reusable := !r.rang && !inBubble(r.c.start)
	r.mu.Unlock()
	if reusable {
		*r = round{}
		rounds.Put(r)
	}
}

// hedged runs a round whose first leg has passed the admission gates.
func (c *call) hedged(first *leg, kind policy.AttemptKind, body io.ReadCloser, now time.Time, threshold, wait time.Duration) (*http.Response, error) {
	h := c.s.hedge
	r := newRound(c.start)
	r.c, r.h, r.max, r.threshold, r.first, r.getBody = *c, h, h.Config().MaxConcurrent, threshold, *first, c.req.GetBody
	r.cond.L = &r.mu
	l := &r.first
	l.round = r
	r.c.prepare(l, kind, body, true, now)
	r.c.markTie(l)
	r.legs = append(r.legBuf[:0], l)
	r.live = 1
	r.mu.Lock()
	r.due = now.Add(wait)
	r.timer = newRoundTimer(c.start, r.nextLocked().Sub(now), r)
	r.mu.Unlock()

	done := false
	defer func() {
		if !done {
			// The inline leg panicked (the base or a user func): end
			// the round before the panic reaches the caller.
			r.abandon(nil)
		}
	}()
	r.c.send(l)
	r.report(l)
	resp, err := r.collect()
	done = true
	c.callTally = r.c.callTally
	c.used = atomic.LoadUint64(&r.c.used) // a loser may still be picking
	r.release()
	return resp, err
}

// nextLocked returns when the round's timer is next needed: the earlier
// of the next hedge and the inline leg's expiry, or the zero time when
// neither is pending. r.mu is held.
func (r *round) nextLocked() time.Time {
	if r.expires.IsZero() || !r.due.IsZero() && r.due.Before(r.expires) {
		return r.due
	}
	return r.expires
}

// armLocked sets the round's timer for what is next pending, as of now,
// unless the round is over. r.mu is held.
func (r *round) armLocked(now time.Time) {
	if next := r.nextLocked(); !next.IsZero() && !r.over() {
		r.timer.t.Reset(next.Sub(now))
	}
}

// stopLocked stops the round's timer, once: a stopped timer may be in
// another round's hands by the next call. A timer that could not be
// stopped before its func began marks the round rang. A timer that has
// rung before is not reused even when stopped in time: it was set again
// after it rang, so a func of an earlier ring may still be reading it.
// r.mu is held.
func (r *round) stopLocked() {
	if r.timer != nil {
		if !r.timer.stop(!r.rang) {
			r.rang = true
		}
		r.timer = nil
	}
}

// headers stops the inline leg's per-attempt timeout as its headers come
// back, and reports whether the timer had already fired for it.
func (r *round) headers() (expired bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expires = time.Time{}
	return r.expired
}

// fire runs on the round's timer. It cancels the inline leg if its
// per-attempt timeout has come, and sends a hedge if one is due (see
// hedge), re-arming the timer for what is left.
func (r *round) fire() {
	now := time.Now()
	r.mu.Lock()
	r.rang = true
	if r.over() {
		r.mu.Unlock()
		return
	}
	expire := !r.expires.IsZero() && !now.Before(r.expires)
	if expire {
		r.expires, r.expired = time.Time{}, true
	}
	due := !r.due.IsZero() && !now.Before(r.due)
	if due {
		r.due = time.Time{} // the hedge sets the next one, if it starts
	}
	r.armLocked(now)
	r.mu.Unlock()
	if expire {
		r.first.cancel(policy.ErrAttemptTimeout)
	}
	if due {
		r.hedge(now)
	}
}

// hedge runs on the round's timer when a hedge is due, and is the one
// place where a hedge is decided: first the checks, which take nothing
// (the hedging gates, then whether the first leg is still sending a body
// the hedge would replay), then what the leg takes (see take), each step
// given back exactly when a later one refuses, and last the leg is sent
// (see launch), which alone spends WinRate's credit. A panic here
// (GetBody, an observer) would kill the process: what the hedge took is
// given back, and the panic is handed to the caller.
func (r *round) hedge(now time.Time) {
	c := &r.c
	var tk hedgeTake
	deciding := false // hedgeDeciding is this decision's to end
	defer func() {
		p := recover()
		tk.giveBack(c, now)
		if deciding {
			// No leg after all: the round must not wait for one.
			r.mu.Lock()
			r.hedging = hedgeIdle
			r.cond.Broadcast()
			r.mu.Unlock()
		}
		if p != nil {
			r.abandon(newLegPanic(p))
		}
	}()
	r.mu.Lock()
	if r.over() {
		r.mu.Unlock()
		return
	}
	why := r.gate(now)
	r.hedging = hedgeIdle // decided now, if it awaited the body
	if why == 0 {
		r.hedging, deciding = hedgeDeciding, true
	}
	r.mu.Unlock()
	if why != 0 {
		c.suppress(why)
		return
	}
	// A body the first leg is still sending is waited for before anything
	// is taken: the hedge is decided again, from the hedging gates, once
	// the body is in.
	if r.bodyPending() {
		waits := r.awaitBody()
		if waits {
			deciding = false // awaitBody ended the decision
		} else {
			c.suppress(policy.HedgeBodyPending)
		}
		return
	}
	l, why, rearmed := r.take(now, &tk)
	if rearmed {
		deciding = false // the budget's refusal ended the decision
	}
	if l == nil {
		if why != 0 {
			c.suppress(why)
		}
		return
	}
	r.launch(l, now, &tk, &deciding)
}

// hedgeTake is what a hedge has taken on its way to the wire and not yet
// spent: the budget's token (with the hedges' allowance's), its body, and
// its leg's admission permits. Until the leg is sent, giveBack returns
// each exactly, as x/time/rate's Reservation.Cancel gives back tokens.
type hedgeTake struct {
	token bool
	body  io.ReadCloser
	leg   *leg // admitted: it holds the admission gates' permits
}

// giveBack returns what tk holds, as a hedge that was not sent: the
// permits as Discarded, the body closed, the budget's token refunded. It
// does nothing once the leg is sent (see launch).
func (tk *hedgeTake) giveBack(c *call, now time.Time) {
	if tk.leg != nil {
		c.finish(&tk.leg.permits, discarded(now), false)
	}
	closeBody(tk.body)
	if tk.token {
		c.s.budget.RefundHedge(now)
	}
	*tk = hedgeTake{}
}

// take takes, into tk, what a hedge leg needs, in an order where nothing
// stays spent when a later step refuses: the budget's token, which is
// given back exactly, then the body, then the admission gates, whose
// permits are given back as Discarded. (The rate limit's token, which
// cannot be given back, is taken last, by launch.) It returns the leg,
// admitted, or nil and why not: 0 when the round can send no more legs.
//
// Hedges come due in bursts (a hiccup makes every call in flight cross
// the threshold at once) and a burst can empty the budget, which refills
// with traffic within a few thresholds; a call still on the wire one
// threshold later is very likely a slow one. So a round the budget
// refused asks again one threshold later, three times, then backing off
// (two, four, ...), so that the timer work of a round whose budget stays
// empty is bounded; rearmed says so, the decision being over.
func (r *round) take(now time.Time, tk *hedgeTake) (l *leg, why policy.SuppressReason, rearmed bool) {
	c := &r.c
	r.mu.Lock()
	if r.ended() {
		r.mu.Unlock()
		return nil, 0, false
	}
	if !c.s.budget.WithdrawHedge(now) {
		r.budgetRefusedLocked(now)
		r.mu.Unlock()
		return nil, policy.HedgeBudget, true
	}
	tk.token = true
	r.mu.Unlock()
	if tk.body, why = r.body(); why != 0 {
		return nil, why, false
	}
	l = new(leg)
	if err := c.admit(&l.permits, ask{kind: policy.AttemptHedge, now: now}); err != nil {
		return nil, policy.HedgeRejected, false
	}
	tk.leg = l
	return l, 0, false
}

// launch sends hedge leg l, admitted by take, unless the round can send
// no more legs or the rate limit has no token for it, in which case tk
// is left for hedge to give back. Sending l ends the decision (deciding).
// The token is taken under the round's
// lock, with the check that the round may still send a leg, since it
// cannot be given back (a hedge takes one only from a bucket full but for
// one, and never waits: see gate.RateLimiter.AcquireHedge). Once the leg
// is in the round, WinRate's credit is spent (hedge.State.Started).
func (r *round) launch(l *leg, now time.Time, tk *hedgeTake, deciding *bool) {
	c := &r.c
	r.mu.Lock()
	if r.ended() {
		r.mu.Unlock()
		return
	}
	if ok, retryAfter := c.s.rate.AcquireHedge(c.ctx, now, c.prio); !ok {
		r.mu.Unlock()
		c.refuse(policy.AttemptHedge, policy.GateRateLimit, policy.ErrRateLimited, retryAfter, false)
		c.suppress(policy.HedgeRejected)
		return
	}

	// Not over: the caller is still inside RoundTrip, so its request may
	// be read (and is copied deeply for this leg).
	c.prepare(l, policy.AttemptHedge, tk.body, true, now)
	c.markTie(l)
	*tk = hedgeTake{} // spent: the leg holds it all now
	l.round, l.drewToken = r, true
	r.legs = append(r.legs, l)
	r.live++
	r.hedging, *deciding = hedgeIdle, false
	if r.live < r.max && c.spent() < c.attempts {
		r.due = now.Add(r.threshold)
		r.armLocked(now)
	}
	r.mu.Unlock()

	// The leg goes on the wire as launch returns, after it was reported
	// started, and even if an observer panics: it is counted in live, so
	// the round waits for it (and, abandoned, cancels it).
	defer func() { go r.run(l) }()
	r.h.Started(now)
	if o := c.t.obs; o != nil && o.HedgeStarted != nil {
		o.HedgeStarted(policy.HedgeInfo{Context: c.ctx, Key: c.s.key, Priority: c.prio, Attempt: l.n, Threshold: r.threshold, Tied: c.tie == tieRound})
	}
}

// ended reports whether the round can send no more legs: it is over, or
// at MaxConcurrent legs, or the call's Attempts are spent, or a leg of a
// tied round said it started. r.mu is held.
func (r *round) ended() bool {
	return r.over() || r.live >= r.max || r.c.spent() >= r.c.attempts || r.starter != nil
}

// budgetRefusedLocked ends a hedge's decision for a budget with no token,
// the round not ended: it asks again one threshold later (three times,
// then backing off), done deciding before the timer can fire again, so
// that the next fire's decision is the one the round waits for. r.mu is
// held.
func (r *round) budgetRefusedLocked(now time.Time) {
	r.hedging = hedgeIdle
	r.cond.Broadcast()
	r.due = now.Add(r.threshold << max(0, min(r.refused-2, 16)))
	r.refused++
	r.armLocked(now)
}

// bodyPending reports whether the first leg is still sending a body
// without GetBody that the hedge could replay once it is complete. Once
// false it stays false.
func (r *round) bodyPending() bool {
	rb := r.c.rb
	return r.getBody == nil && rb != nil && rb.Err() == nil && !rb.TooLarge() && !rb.Complete()
}

// body returns a hedge leg's body, or why it has none: GetBody failed, or
// a body without GetBody cannot be replayed from its copy. A hedge never
// reads the caller's body itself: while the first leg is still sending it
// (bodyPending), the hedge waits for it (see awaitBody), and the first leg
// goes on.
func (r *round) body() (io.ReadCloser, policy.SuppressReason) {
	switch rb := r.c.rb; {
	case r.getBody != nil:
		b, err := r.getBody()
		if err != nil {
			return nil, policy.HedgeBodyError
		}
		return b, 0
	case rb == nil:
		return r.c.req.Body, 0 // none, or http.NoBody
	case rb.Err() != nil:
		return nil, policy.HedgeBodyError
	case rb.TooLarge():
		return nil, policy.HedgeBodyTooLarge
	case !rb.Complete():
		// Not after bodyPending said false: a body is never pending
		// again once complete, failed or too large.
		return nil, policy.HedgeBodyPending
	}
	// Complete: the hedge replays the copy alone, and never reads on
	// from the caller's body.
	return r.c.rb.Next(), 0
}

// awaitBody has the hedge now due, which found the first leg still
// sending a body without GetBody, decided again once the body has been
// read as far as it will be: complete, the hedge replays the copy; failed
// or too large, it is suppressed for that. It reports whether the hedge
// waits: not when the round is over. A round whose inline leg comes back
// first ends with the hedge unsent, reported as HedgeBodyPending (see
// report). The round cannot go back to the pool meanwhile: its timer has
// rung. Awaiting ends the hedge's decision: the round does not wait for
// the body, which the inline leg is sending.
func (r *round) awaitBody() bool {
	r.mu.Lock()
	if r.over() {
		r.mu.Unlock()
		return false
	}
	r.hedging = hedgeAwaitingBody
	r.cond.Broadcast()
	r.mu.Unlock()
	rb := r.c.rb
	switch {
	case rb.WhenRead(r.bodyRead):
	case rb.Complete() || rb.TooLarge() || rb.Err() != nil:
		r.bodyRead() // read meanwhile: decided again at once
	default:
		// No read will end it (the call is over): nothing to wait for,
		// unless the inline leg's report took the hedge over already.
		r.mu.Lock()
		defer r.mu.Unlock()
		waited := r.hedging == hedgeAwaitingBody
		if waited {
			r.hedging = hedgeIdle
		}
		return !waited
	}
	return true
}

// bodyRead runs once the body a hedge awaits has been read: it sets the
// round's timer to fire at once, for the hedge, unless the round is over.
// It runs on the goroutine that read the body (the first leg's) and only
// takes the round's lock. The hedge still awaits until the timer's fire
// decides it: a round whose inline leg comes back before then reports it
// HedgeBodyPending.
func (r *round) bodyRead() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hedging != hedgeAwaitingBody || r.over() {
		return
	}
	now := time.Now()
	r.due = now
	r.armLocked(now)
}

// gate asks the hedging gates, in their order (see hedge.State.Gate),
// which take nothing; the budget, the last, is asked by hedge. r.mu is
// held.
func (r *round) gate(now time.Time) policy.SuppressReason {
	c := &r.c
	dl, _ := c.ctx.Deadline()
	return r.h.Gate(now, hedge.Due{
		Deadline: dl,
		Live:     r.live,
		Wire:     c.spent(),
		Attempts: c.attempts,
		Priority: c.prio,
		Breaker:  c.s.breaker,
	})
}

// run sends a hedge leg on its own goroutine. A panic there could not be
// recovered by anyone, so it is caught and handed to the caller's
// goroutine, which re-raises it.
func (r *round) run(l *leg) {
	defer func() {
		if p := recover(); p != nil {
			r.mu.Lock()
			if l.state != legEnded {
				l.state = legEnded
				r.live--
			}
			r.mu.Unlock()
			r.abandon(newLegPanic(p))
		}
	}()
	r.c.send(l)
	r.report(l)
}

// settle decides, as leg l's answer comes back from the base, whether l is
// evidence (true) or was lost to another leg's win while on the wire
// (false). It is the one place where that is decided.
func (r *round) settle(l *leg) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l.state == legLost {
		return false
	}
	l.state = legAnswered
	return true
}

// report gives the round a leg that has been through send, where its
// attempt ended (see end), and takes it off the round's count of legs
// sent and not yet ended (live). The first acceptable
// answer wins: the legs still on the wire lose, are cancelled and reported
// as discarded at once, so the caller never waits on a loser. An answer
// that is not acceptable (a Failure, or one that asks for a retry)
// supersedes the one before it, which is thrown away. Anything that
// ends after the round was decided is thrown away.
func (r *round) report(l *leg) {
	c := &r.c
	r.mu.Lock()
	lost := l.state == legLost
	l.state = legEnded
	r.live--
	defer r.cond.Broadcast()
	if l == r.legs[0] {
		// The inline leg is back: whatever happens, no more legs start.
		if r.state == roundOpen {
			r.state = roundClosed
		}
		r.stopLocked()
		if r.hedging == hedgeAwaitingBody {
			// The hedge waiting for the body will not be sent; reported
			// once r.mu is let go, as report returns.
			r.hedging = hedgeIdle
			defer c.suppress(policy.HedgeBodyPending)
		}
	}
	if lost {
		// Reported discarded when it lost; send closed what it got.
		r.mu.Unlock()
		return
	}
	if r.state == roundDecided {
		r.mu.Unlock()
		httpx.Discard(l.resp)
		return
	}
	if l.outcome == policy.Failure || l.retryAsked {
		superseded := r.failed
		r.failed = l
		r.mu.Unlock()
		if superseded != nil {
			httpx.Discard(superseded.resp)
		}
		return
	}
	r.winner = l
	if l.tie != nil && l.outcome == policy.Success {
		r.h.Ties().Served(l.tie.signalled)
	}
	losers := r.decideLocked(true)
	r.mu.Unlock()

	won := l.kind == policy.AttemptHedge && l.outcome == policy.Success
	refunds := l.drewToken && l.outcome == policy.Success
	var now time.Time // read only when something needs it
	if len(losers) > 0 || won || refunds {
		now = timing.Since(c.start)
	}
	if refunds {
		c.refund(now, l.kind)
	}
	r.discard(losers, now)
	if won {
		r.h.Won(now)
		if o := c.t.obs; o != nil && o.HedgeWon != nil {
			o.HedgeWon(policy.HedgeInfo{Context: c.ctx, Key: c.s.key, Priority: c.prio, Attempt: l.n, Threshold: r.threshold})
		}
	}
}

// decideLocked marks the round decided: no more legs start, and every leg
// still on the wire is lost. It returns the losers. r.mu is held.
//
// With spare, a round won by a leg, a losing hedge leg is not cancelled at
// once: over HTTP/1.1 a request cancelled in flight closes its connection,
// so every hedge would cost a dial. It gets httpx.DrainTime to bring its
// headers, and is then drained on its own goroutine like a superseded
// response (see end); when its time runs out first, its grace timer
// cancels it. (The round's threshold would be a tighter bound, but where
// the latency is the client's own scheduling noise, as on loopback, a
// loser a few scheduling delays from its headers would lose its
// connection.) The inline leg, which the caller's goroutine is waiting
// on, is cancelled at once (by discard), as is every leg of an abandoned
// round.
func (r *round) decideLocked(spare bool) []*leg {
	r.stopLocked()
	r.state = roundDecided
	var losers []*leg
	for _, o := range r.legs {
		if o.state == legOnWire {
			o.state = legLost
			losers = append(losers, o)
			if spare && o != &r.first {
				cancel := o.cancel
				o.grace = time.AfterFunc(httpx.DrainTime, func() { cancel(errDiscarded) })
			}
		}
	}
	return losers
}

// discard ends the legs that lost as endLost: cancelled, but those given
// a grace, and reported, once, as discarded.
func (r *round) discard(losers []*leg, now time.Time) {
	c := &r.c
	for _, o := range losers {
		elapsed := now.Sub(o.dispatch)
		if elapsed >= r.threshold {
			// A leg cut short in the tail took at least this long. Left
			// out, the slow calls that hedging rescues would vanish from
			// the window, the quantile would sink, and more than 1 - q of
			// calls would be hedged; recorded at this lower bound, they
			// stay above the threshold, where they belong. A lost leg
			// records nothing when it comes back, so this is its only
			// sample.
			r.h.Record(now, elapsed, policy.Discarded)
		}
		c.end(o, endLost, exit{r: result{now: now, outcome: policy.Discarded, judged: policy.Discarded, latency: elapsed}})
	}
}

// abandon decides the round without a winner: the inline leg panicked
// (p is nil: the panic is already on its way to the caller), or a hedge
// leg did (p is kept for the caller to re-raise). The legs on the wire are
// cancelled and the failure held is thrown away. A panic on a leg that
// ends after the round was decided has no caller left to reach: it is
// dropped, its leg's permits already returned.
func (r *round) abandon(p any) {
	r.mu.Lock()
	if r.state == roundDecided {
		r.mu.Unlock()
		return
	}
	r.panic = p
	losers := r.decideLocked(false)
	failed := r.failed
	r.failed = nil
	r.cond.Broadcast()
	r.mu.Unlock()
	r.discard(losers, time.Now())
	if failed != nil {
		httpx.Discard(failed.resp)
	}
}

// collect waits, after the inline leg has reported, for the round to be
// decided: a winner, a panic, or every leg ended (and fire done deciding
// whether to start one more).
func (r *round) collect() (*http.Response, error) {
	r.mu.Lock()
	for r.state != roundDecided && (r.live > 0 || r.hedging == hedgeDeciding) {
		r.cond.Wait()
	}
	r.state = roundDecided // whatever ends now is thrown away
	w, failed, p, twice := r.winner, r.failed, r.panic, r.twice
	r.failed = nil
	// Over: no more legs start (see hedge), and what the caller's Report
	// needs is read here, under the lock, so that a loser still on the
	// wire has no part in it.
	r.c.hedges += len(r.legs) - 1
	if w != nil && w.kind == policy.AttemptHedge && w.outcome == policy.Success {
		r.c.hedgeWon = true
	}
	if r.c.rep != nil {
		switch {
		case w != nil:
			r.c.lane = w.laneName()
		case failed != nil:
			r.c.lane = failed.laneName()
		}
	}
	r.mu.Unlock()
	if twice != nil {
		r.c.tellRanTwice(twice, r.threshold)
	}
	if p != nil {
		panic(p)
	}
	if w != nil {
		if failed != nil {
			httpx.Discard(failed.resp)
		}
		r.c.outcome, r.c.retryAsked = w.outcome, w.retryAsked
		return w.resp, w.err
	}
	r.c.outcome, r.c.retryAsked = failed.outcome, failed.retryAsked
	return failed.resp, failed.err
}

// legPanic carries a hedge leg's panic to the caller's goroutine, with
// the stack of the goroutine it happened on (as x/sync/singleflight does).
type legPanic struct {
	value any
	stack []byte
}

func newLegPanic(v any) *legPanic { return &legPanic{value: v, stack: debug.Stack()} }

func (p *legPanic) Error() string {
	return fmt.Sprintf("resilix: panic in a hedge leg: %v\n\n%s", p.value, p.stack)
}

// Unwrap returns the panic's value when it is an error.
func (p *legPanic) Unwrap() error {
	err, _ := p.value.(error)
	return err
}

// A roundTimer is a hedged round's one timer, for its next hedge and its
// inline leg's timeout (see round.fire). Stopped before it ever fired, it
// goes back to a pool (when it came from there); one that fired is left to
// the garbage collector, since its round.fire may still be running, even
// once set again and stopped in time. r is set before the timer is armed
// and read only by the timer's func.
type roundTimer struct {
	t      *time.Timer
	pooled bool
	r      *round
}

// roundTimers holds the pooled round timers, stopped.
var roundTimers sync.Pool

// newRoundTimer returns a timer that calls r.fire after d. start is the
// call's start time, as for newAlarm.
func newRoundTimer(start time.Time, d time.Duration, r *round) *roundTimer {
	if !inBubble(start) {
		if rt, _ := roundTimers.Get().(*roundTimer); rt != nil {
			rt.r = r
			rt.t.Reset(d)
			return rt
		}
	}
	rt := &roundTimer{pooled: !inBubble(start), r: r}
	rt.t = time.AfterFunc(d, rt.ring)
	return rt
}

func (rt *roundTimer) ring() { rt.r.fire() }

// stop stops the timer and reports whether it was stopped before its
// func began; it goes back to the pool if it came from there and reuse
// says that no func of its can be running. It must not be used again.
func (rt *roundTimer) stop(reuse bool) bool {
	if !rt.t.Stop() {
		return false
	}
	if rt.pooled && reuse {
		rt.r = nil
		roundTimers.Put(rt)
	}
	return true
}
