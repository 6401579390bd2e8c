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
// caller's goroutine with one timer armed, for the first hedge and the
// leg's per-attempt timeout. The first acceptable answer (a Success that
// asks for no retry, or a request net/http refused to send, which every
// leg would get again) wins and the legs still on the wire lose; if no
// leg's answer is acceptable, the last one goes back to retry, which asks
// it whether to retry.
//
// One goroutine at a time owns the round, as owner says: the caller's,
// while its inline leg runs and after, unless the timer fires first. Then
// the timer's goroutine takes the round (see fire) and runs it to its
// decision as a select loop (see own) over the legs' answers, a timer of
// its own for the next hedge and the inline leg's timeout, and the body a
// hedge awaits; each hedge leg runs on a goroutine of its own and posts
// its answer on results; the caller, back from its inline leg, posts its
// answer there too and waits for the decision (done). Most rounds end
// with the timer unfired: the caller, back first, takes the round by one
// compare-and-swap and judges its answer alone, and the round goes back
// to a pool.
//
// Where a leg and the owner meet is the leg's state word (see legBack):
// as a leg comes back it learns whether it was lost or timed out, and as
// it posts its answer whether the round was decided without it; the owner
// deciding the round learns of each leg whether it is still on the wire
// (lost: cancelled and reported discarded at once; it teaches nothing
// when it comes back), back but not posted (it disposes of its answer
// itself), or posted (the owner receives and disposes of it). So no leg
// ever waits for the owner, and the owner, once decided, waits only for
// answers already on their way.
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

	owner atomic.Uint32 // roundInline, roundCaller or roundFired
	timer *roundTimer   // the first fire's; fires once at most

	// Made by the timer's first fire before it takes the round, so that
	// the caller, finding it taken, finds them.
	results chan legDone  // each leg's answer, posted once (see report)
	done    chan struct{} // closed once the timer's goroutine is done with the round
	// bodyRead says that the body a hedge awaits has been read; made by
	// the first hedge that awaits it (see awaitBody).
	bodyRead chan struct{}
	// starts tells the owner of a tied round the leg that said it started
	// first (see started), made with results.
	starts chan *leg
	// Of a tied round, set by a base's goroutine (see started): the first
	// leg that said it started, and a later one that said so too.
	starter atomic.Pointer[leg]
	twice   atomic.Pointer[leg]

	// The rest is the owner's.
	legs    []*leg // every leg sent, in order; legs[0] runs inline
	live    int    // legs sent whose answer the owner has not received, and which it still awaits
	winner  *leg
	failed  *leg      // the last leg that failed; earlier ones are discarded
	panic   *legPanic // a hedge leg's panic, or the owner's, to re-raise on the caller's goroutine
	state   roundState
	due     time.Time // the next hedge; zero: none pending
	expires time.Time // the inline leg's per-attempt timeout; zero: none pending
	refused int       // hedges the budget refused in this round: later tries back off
	awaits  bool      // a hedge awaits the body the inline leg is sending (see awaitBody)
}

// The owners of a round, in its owner word. Its transitions:
//
//	roundInline → roundCaller  the inline leg came back before the timer fired (hedged)
//	roundInline → roundFired   the timer fired first (fire)
const (
	roundInline uint32 = iota // the caller's goroutine runs the inline leg; the timer has not fired
	roundCaller               // the caller's, to its end: no hedge was started
	roundFired                // the timer's goroutine's, until the round is decided
)

// roundState is where a round is in its owner's eyes. Its transitions:
//
//	roundOpen → roundClosed     the inline leg came back (back)
//	roundOpen → roundDecided    a leg won, or the round was abandoned (decide)
//	roundClosed → roundDecided  the same
type roundState uint8

const (
	roundOpen    roundState = iota // the inline leg is on the wire: hedges may start
	roundClosed                    // no more legs start; the legs on the wire may still win
	roundDecided                   // a winner, or abandoned: whatever comes back now is thrown away
)

// legDone is a leg's answer, as posted to its round's owner: the leg,
// back from send, or gone in a panic (a hedge leg's, p, to re-raise; the
// inline leg's, with p nil, already on its way to the caller).
type legDone struct {
	l        *leg
	panicked bool
	p        *legPanic
}

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

// hedged runs a round whose first leg has passed the admission gates.
func (c *call) hedged(first *leg, kind policy.AttemptKind, body io.ReadCloser, now time.Time, threshold, wait time.Duration) (*http.Response, error) {
	h := c.s.hedge
	r := newRound(c.start)
	r.c, r.h, r.max, r.threshold, r.first, r.getBody = *c, h, h.Config().MaxConcurrent, threshold, *first, c.req.GetBody
	l := &r.first
	l.shared, l.roundTimed = true, true
	r.c.prepare(l, kind, body, true, now)
	r.markTie(l)
	r.legs = append(r.legBuf[:0], l)
	r.live = 1
	r.due, r.expires = now.Add(wait), l.expires
	r.timer = newRoundTimer(c.start, r.next().Sub(now), r)

	back := false
	defer func() {
		if !back {
			r.inlinePanicked(l)
		}
	}()
	r.c.send(l)
	back = true
	reuse := false
	if r.owner.CompareAndSwap(roundInline, roundCaller) {
		// Back before the timer fired: no hedge was started, and the
		// round is the caller's alone. A timer that could not be
		// stopped has begun its fire, which finds the round taken; the
		// round is not reused while that fire may still read it.
		reuse = r.timer.stop() && !inBubble(c.start)
		r.back(legDone{l: l})
	} else {
		r.report(legDone{l: l})
		<-r.done
	}
	resp, err := r.collect()
	c.callTally = r.c.callTally
	c.used = atomic.LoadUint64(&r.c.used) // a loser may still be picking
	if reuse {
		*r = round{}
		rounds.Put(r)
	}
	return resp, err
}

// inlinePanicked ends the round of an inline leg that panicked (the base,
// or a user func), before the panic reaches the caller: the timer is
// stopped, or the round's owner is told, which abandons it, and waited
// for, so that no leg starts once the caller is gone. An answer the round
// was decided on is thrown away.
func (r *round) inlinePanicked(l *leg) {
	if r.owner.CompareAndSwap(roundInline, roundCaller) {
		r.timer.stop()
		return
	}
	r.report(legDone{l: l, panicked: true})
	<-r.done
	if r.winner != nil {
		httpx.Discard(r.winner.resp)
	}
	if r.failed != nil {
		httpx.Discard(r.failed.resp)
	}
}

// next returns when the round's timer is next needed: the earlier of the
// next hedge and the inline leg's expiry, or the zero time when neither
// is pending.
func (r *round) next() time.Time {
	if r.expires.IsZero() || !r.due.IsZero() && r.due.Before(r.expires) {
		return r.due
	}
	return r.expires
}

// fire runs on the round's timer, once. Unless the caller is back first,
// it takes the round and runs it to its decision (see own). An inline leg
// already back leaves nothing to do: no leg may start, its timeout is
// moot, and the caller is about to take the round.
func (r *round) fire() {
	if atomic.LoadUint32(&r.first.state)&legBack != 0 {
		return
	}
	r.results = make(chan legDone, min(r.max, r.c.attempts))
	r.done = make(chan struct{})
	if r.c.tie == tieRound {
		r.starts = make(chan *leg, 1)
	}
	if r.owner.CompareAndSwap(roundInline, roundFired) {
		r.own()
	}
}

// own runs the round on the timer's goroutine, from its first fire until
// it is decided: a select loop over the legs' answers, its timer (the
// next hedge, the inline leg's timeout) and the body a hedge awaits. The
// loop ends once the round is decided or every leg has come back, the
// inline leg among them, after which no leg starts. What was posted and
// not yet received is then received and thrown away, and the caller,
// waiting on done, collects the round.
func (r *round) own() {
	defer close(r.done)
	r.loop()
	for ; r.live > 0; r.live-- {
		m := <-r.results // posted before the round was decided: on its way
		if !m.panicked {
			httpx.Discard(m.l.resp)
		}
	}
}

// loop is own's select loop. A panic in it (GetBody, an observer) would
// kill the process: it abandons the round, and the panic is handed to the
// caller.
func (r *round) loop() {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
		if p := recover(); p != nil {
			r.abandon(newLegPanic(p))
		}
	}()
	r.tick(time.Now())
	for r.state != roundDecided && r.live > 0 {
		var fire <-chan time.Time
		if next := r.next(); !next.IsZero() && r.state == roundOpen {
			if d := time.Until(next); t == nil {
				t = time.NewTimer(d)
			} else {
				t.Reset(d)
			}
			fire = t.C
		}
		select {
		case m := <-r.results:
			r.back(m)
		case now := <-fire:
			r.tick(now)
		case <-r.bodyRead:
			if r.awaits {
				r.hedge(time.Now())
			}
		case s := <-r.starts:
			r.untie(s)
		}
	}
}

// tick does what the round's timer is due for at now: it cancels the
// inline leg if its per-attempt timeout has come, and sends a hedge if
// one is due (see hedge).
func (r *round) tick(now time.Time) {
	if !r.expires.IsZero() && !now.Before(r.expires) {
		r.expires = time.Time{}
		if r.first.expire() {
			r.first.cancel(policy.ErrAttemptTimeout)
		}
	}
	if !r.due.IsZero() && !now.Before(r.due) {
		r.due = time.Time{} // the hedge sets the next one, if it starts
		r.hedge(now)
	}
}

// hedge runs when a hedge is due, and is the one place where a hedge is
// decided: first the checks, which take nothing (the hedging gates, then
// whether the first leg is still sending a body the hedge would replay),
// then what the leg takes (see take), each step given back exactly when a
// later one refuses, and last the leg is sent (see launch), which alone
// spends WinRate's credit. What the hedge took is given back on every
// path, a panic's included (see loop).
func (r *round) hedge(now time.Time) {
	c := &r.c
	r.awaits = false // decided now, if it awaited the body
	if r.over() || r.starter.Load() != nil {
		return
	}
	if why := r.gate(now); why != 0 {
		c.suppress(why)
		return
	}
	// A body the first leg is still sending is waited for before anything
	// is taken: the hedge is decided again, from the hedging gates, once
	// the body is in.
	if r.bodyPending() {
		if !r.awaitBody() {
			c.suppress(policy.HedgeBodyPending)
		}
		return
	}
	var tk hedgeTake
	defer tk.giveBack(c, now)
	l, why := r.take(now, &tk)
	if l == nil {
		if why != 0 {
			c.suppress(why)
		}
		return
	}
	r.launch(l, now, &tk)
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
// admitted, or nil and why not.
//
// Hedges come due in bursts (a hiccup makes every call in flight cross
// the threshold at once) and a burst can empty the budget, which refills
// with traffic within a few thresholds; a call still on the wire one
// threshold later is very likely a slow one. So a round the budget
// refused asks again one threshold later, three times, then backing off
// (two, four, ...), so that the timer work of a round whose budget stays
// empty is bounded.
func (r *round) take(now time.Time, tk *hedgeTake) (l *leg, why policy.SuppressReason) {
	c := &r.c
	if !c.s.budget.WithdrawHedge(now) {
		r.due = now.Add(r.threshold << max(0, min(r.refused-2, 16)))
		r.refused++
		return nil, policy.HedgeBudget
	}
	tk.token = true
	if tk.body, why = r.body(); why != 0 {
		return nil, why
	}
	l = new(leg)
	if err := c.admit(&l.permits, ask{kind: policy.AttemptHedge, now: now}); err != nil {
		return nil, policy.HedgeRejected
	}
	tk.leg = l
	return l, 0
}

// launch sends hedge leg l, admitted by take, unless the round can send
// no more legs or the rate limit has no token for it, in which case tk
// is left for hedge to give back. The token is taken only once the round
// is known to send the leg, since it cannot be given back (a hedge takes
// one only from a bucket full but for one, and never waits: see
// gate.RateLimiter.AcquireHedge). Once the leg is in the round, WinRate's
// credit is spent (hedge.State.Started).
func (r *round) launch(l *leg, now time.Time, tk *hedgeTake) {
	c := &r.c
	if r.ended() {
		return
	}
	if ok, retryAfter := c.s.rate.AcquireHedge(c.ctx, now, c.prio); !ok {
		c.refuse(policy.AttemptHedge, policy.GateRateLimit, policy.ErrRateLimited, retryAfter, false)
		c.suppress(policy.HedgeRejected)
		return
	}

	// Undecided: the caller is still inside RoundTrip, so its request may
	// be read (and is copied deeply for this leg).
	l.shared = true
	c.prepare(l, policy.AttemptHedge, tk.body, true, now)
	r.markTie(l)
	*tk = hedgeTake{} // spent: the leg holds it all now
	l.drewToken = true
	r.legs = append(r.legs, l)
	r.live++
	if r.live < r.max && c.spent() < c.attempts {
		r.due = now.Add(r.threshold)
	}

	// The leg goes on the wire as launch returns, after it was reported
	// started, and even if an observer panics: it is counted in live, so
	// the round awaits it (and, abandoned, cancels it).
	defer func() { go r.run(l) }()
	r.h.Started(now)
	if o := c.t.obs; o != nil && o.HedgeStarted != nil {
		o.HedgeStarted(policy.HedgeInfo{Context: c.ctx, Key: c.s.key, Priority: c.prio, Attempt: l.n, Threshold: r.threshold, Tied: c.tie == tieRound})
	}
}

// over reports whether the round can start no more legs: it is not
// open, or the inline leg is back, which the owner has yet to receive.
func (r *round) over() bool {
	return r.state != roundOpen || atomic.LoadUint32(&r.first.state)&legBack != 0
}

// ended reports whether the round can send no more legs: it is over, or
// at MaxConcurrent legs, or the call's Attempts are spent, or a leg of a
// tied round said it started.
func (r *round) ended() bool {
	return r.over() || r.live >= r.max || r.c.spent() >= r.c.attempts || r.starter.Load() != nil
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
// or too large, it is suppressed for that. The read's end is told on
// bodyRead (by the goroutine that read it: the inline leg's), which the
// owner's loop selects on. It reports whether the hedge awaits: not when
// no read will end it (the call is over). A round whose inline leg comes
// back first ends with the hedge unsent, reported as HedgeBodyPending
// (see back).
func (r *round) awaitBody() bool {
	rb := r.c.rb
	if r.bodyRead == nil {
		r.bodyRead = make(chan struct{}, 1)
	}
	switch {
	case rb.WhenRead(r.wake):
	case rb.Complete() || rb.TooLarge() || rb.Err() != nil:
		r.wake() // read meanwhile: decided again at once
	default:
		return false
	}
	r.awaits = true
	return true
}

// wake tells the round's owner that the body a hedge awaits has been
// read. It never blocks: one word pending is enough.
func (r *round) wake() {
	select {
	case r.bodyRead <- struct{}{}:
	default:
	}
}

// gate asks the hedging gates, in their order (see hedge.State.Gate),
// which take nothing; the budget, the last, is asked by take.
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

// run sends a hedge leg on its own goroutine and posts its answer. A
// panic there could not be recovered by anyone, so it is caught and
// posted, to be re-raised on the caller's goroutine.
func (r *round) run(l *leg) {
	defer func() {
		if p := recover(); p != nil {
			r.report(legDone{l: l, panicked: true, p: newLegPanic(p)})
		}
	}()
	r.c.send(l)
	r.report(legDone{l: l})
}

// report posts leg m.l's answer to the round's owner, unless the round
// was decided without it: lost on the wire, the leg was reported and
// disposed of as it came back (see send); dropped once back, its answer
// is thrown away here. It never blocks: results has room for every leg
// that may be in flight at once.
func (r *round) report(m legDone) {
	if m.l.post() {
		r.results <- m
		return
	}
	if !m.panicked && atomic.LoadUint32(&m.l.state)&legDropped != 0 {
		httpx.Discard(m.l.resp)
	}
}

// back gives the round's owner a leg's answer, and takes it off the legs
// it awaits (live). The first acceptable answer wins: the legs still on
// the wire lose, are cancelled and reported as discarded at once, so the
// caller never waits on a loser. An answer that is not acceptable (a
// Failure, or one that asks for a retry) supersedes the one before it,
// which is thrown away. A panic abandons the round.
func (r *round) back(m legDone) {
	c := &r.c
	l := m.l
	r.live--
	if l == &r.first {
		// The inline leg is back: whatever happens, no more legs start.
		r.expires = time.Time{}
		if r.state == roundOpen {
			r.state = roundClosed
		}
		if r.awaits {
			// The hedge awaiting the body will not be sent.
			r.awaits = false
			c.suppress(policy.HedgeBodyPending)
		}
	}
	if m.panicked {
		r.abandon(m.p)
		return
	}
	if l.outcome == policy.Failure || l.retryAsked {
		if r.failed != nil {
			httpx.Discard(r.failed.resp)
		}
		r.failed = l
		return
	}
	r.winner = l
	if l.tie != nil && l.outcome == policy.Success {
		r.h.Ties().Served(l.tie.signalled.Load())
	}
	losers := r.decide(l, true)

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

// decide marks the round decided, with winner w (nil: abandoned): no
// more legs start, and every other leg the owner has not received is
// settled (see leg.drop): lost when still on the wire, dropped when back
// but not posted, or left awaited (live) when its answer is on its way.
// It returns the losers.
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
func (r *round) decide(w *leg, spare bool) []*leg {
	r.state = roundDecided
	var losers []*leg
	for _, o := range r.legs {
		if o == w || atomic.LoadUint32(&o.state)&(legPosted|legLost) != 0 {
			continue // received, or on its way, or lost already (see untie)
		}
		if spare && o != &r.first && atomic.LoadUint32(&o.state)&legBack == 0 {
			// Set before the leg can learn it lost (see drop).
			cancel := o.cancel
			o.grace = time.AfterFunc(httpx.DrainTime, func() { cancel(errDiscarded) })
		}
		st := o.drop()
		if st&legPosted != 0 {
			continue // posted meanwhile: on its way
		}
		r.live--
		if st&legLost != 0 {
			losers = append(losers, o)
		} else if o.grace != nil {
			o.grace.Stop() // back meanwhile: dropped, with no grace to run
			o.grace = nil
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
// leg did, or the owner (p is kept for the caller to re-raise). The legs
// on the wire are cancelled and the failure held is thrown away. A panic
// once the round is decided has no caller left to reach: it is dropped,
// its leg's permits already returned.
func (r *round) abandon(p *legPanic) {
	if r.state == roundDecided {
		return
	}
	r.panic = p
	losers := r.decide(nil, false)
	if r.failed != nil {
		httpx.Discard(r.failed.resp)
		r.failed = nil
	}
	r.discard(losers, time.Now())
}

// collect gives the caller, once the round is its own again (decided, or
// every leg back), the round's answer, and counts in the call's tally
// what its Report needs.
func (r *round) collect() (*http.Response, error) {
	w, failed, p := r.winner, r.failed, r.panic
	if twice := r.twice.Load(); twice != nil {
		r.c.tellRanTwice(twice, r.threshold)
	}
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

// A roundTimer is a hedged round's timer, for its first hedge and its
// inline leg's timeout (see round.fire). It fires once at most: the
// goroutine it fires on, taking the round, runs a timer of its own. Stopped
// before it fired, it goes back to a pool (when it came from there); one
// that fired is left to the garbage collector, since its round.fire may
// still be running. r is set before the timer is armed and read only by
// the timer's func.
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
// func began; it then goes back to the pool if it came from there. It
// must not be used again.
func (rt *roundTimer) stop() bool {
	if !rt.t.Stop() {
		return false
	}
	if rt.pooled {
		rt.r = nil
		roundTimers.Put(rt)
	}
	return true
}
