package transport

import (
	"errors"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/timing"
	"github.com/resilix/resilix/policy"
)

// tieMode is how a hedged round of a key with Hedge.Tied uses ties.
type tieMode uint8

const (
	// tieOff: the round is not tied, and marks nothing.
	tieOff tieMode = iota
	// tieLearn: the upstream has not been heard to speak ties (or no
	// longer is): the round hedges as usual, and marks its first leg
	// only, to hear whether its server answers with the start signal.
	tieLearn
	// tieRound: every leg is marked, the twin goes out after the ties'
	// delay, and the first leg to say it started has the others
	// cancelled.
	tieRound
)

// maxInformational is the most 1xx answers a tied leg accepts before its
// attempt fails: net/http's own bound when nobody reads them. A server
// sends one; a hostile one could send 1xx answers without end.
const maxInformational = 5

// errTooManyInformational fails a tied leg whose server sent more than
// maxInformational 1xx answers.
var errTooManyInformational = errors.New("resilix: too many 1xx informational responses")

// errTwinStarted is the cancellation cause of a tied leg whose twin said
// it started first.
var errTwinStarted = errors.New("resilix: tied leg cancelled: its twin started first")

// marksTie reports whether leg l is sent marked as tied: every leg of a
// tied round, and the first leg of a call whose key is learning.
func (c *call) marksTie(l *leg) bool {
	switch c.tie {
	case tieRound:
		return true
	case tieLearn:
		return l.n == 1
	}
	return false
}

// markTie marks leg l of round r, prepared, as tied when the round
// marks it (see marksTie): the tie header, on a header of the leg's own,
// and a hook on its 1xx answers (see tieWatch). Only a round's legs are
// marked, which live on the heap: a leg of a round that does not hedge
// stays on its caller's stack.
func (r *round) markTie(l *leg) {
	c := &r.c
	if !c.marksTie(l) {
		return
	}
	if l.kind != policy.AttemptHedge && !c.s.set.propagate {
		// The leg's request shares the caller's header (stamp gives it
		// one of its own).
		if l.req == c.req {
			l.req = c.req.WithContext(l.ctx)
		}
		l.req.Header = l.req.Header.Clone()
		if l.req.Header == nil {
			l.req.Header = make(http.Header, 1)
		}
	}
	l.req.Header[httpx.TieHeader] = tieMark
	l.tie = &tieWatch{l: l, r: r}
	l.req = l.req.WithContext(httptrace.WithClientTrace(l.req.Context(), &httptrace.ClientTrace{Got1xxResponse: l.tie.got1xx}))
}

// tieMark is the tie header's value on a tied leg, shared by every leg:
// net/http reads a request's header and never writes it.
var tieMark = []string{"1"}

// tieWatch reads a tied leg's 1xx answers. Its hook runs on the base's
// goroutine that reads the answer (for HTTP/2, the connection's), so it
// counts, tells the round (see started), and does nothing that could
// block. It is the leg's, and knows the leg's round: the leg does not.
type tieWatch struct {
	l         *leg
	r         *round
	n         int         // 1xx answers so far
	signalled atomic.Bool // a start signal came
}

func (w *tieWatch) got1xx(code int, h textproto.MIMEHeader) error {
	w.n++
	if w.n > maxInformational {
		return errTooManyInformational
	}
	if code != http.StatusEarlyHints || len(h[httpx.TieHeader]) != 1 || h[httpx.TieHeader][0] != httpx.TieStarted {
		return nil // another 1xx, or a signal not ours: not a start
	}
	w.r.started(w.l, time.Now())
	return nil
}

// tellRanTwice tells the observer that leg l of a tied round said it
// started after another leg had (see started).
func (c *call) tellRanTwice(l *leg, threshold time.Duration) {
	if o := c.t.obs; o != nil && o.TieRanTwice != nil {
		o.TieRanTwice(policy.HedgeInfo{Context: c.ctx, Key: c.s.key, Priority: c.prio, Attempt: l.n, Threshold: threshold, Tied: true})
	}
}

// started learns, on the base's goroutine, that leg l's request has
// started at its server, at now. The first leg of a tied round to say so
// is the round's starter: the round sends no more legs (see ended), and
// its owner, if the timer has given it one (see fire), is told on starts
// to cancel the legs that have not said so (see untie). Before the timer
// has fired there is no other leg, and the fire that comes later finds
// the starter (the starter is stored before the owner word is read, and
// the fire reads the starter after it took the word). A second leg that
// says so means both ran: told as the round ends (see collect).
func (r *round) started(l *leg, now time.Time) {
	if !l.tie.signalled.CompareAndSwap(false, true) {
		return
	}
	if !l.dispatch.IsZero() {
		r.h.Ties().Signalled(now, now.Sub(l.dispatch))
	}
	if r.c.tie != tieRound {
		return
	}
	if !r.starter.CompareAndSwap(nil, l) {
		r.twice.CompareAndSwap(nil, l)
		return
	}
	if r.owner.Load() == roundFired {
		r.starts <- l // the one send: starts has room for it
	}
}

// untie runs on the round's owner once leg s has said it started: every
// other leg on the wire that has not said so is lost, as far as the
// client knows still in its server's queue. It is cancelled at once, and
// reported discarded (and to TieCancelled). The round goes on, waiting
// for s; it sends no more legs. A leg that said it started too is left to
// finish: both ran.
//
// A lost leg that drew a budget token gives it back only when it had
// been on its way for at least the ties' delay (see unheard): its silence
// then says it was still queued, and it cost its server a place in the
// queue, not the work. One cancelled sooner keeps its token: its signal
// may still have been on its way, and it may have run, as it does when a
// server starts both legs before the first one's signal reaches the
// client. Were its token given back, such twins would run without bound.
func (r *round) untie(s *leg) {
	c := &r.c
	r.due = time.Time{}
	if r.state == roundDecided {
		return
	}
	var lost []*leg
	for _, o := range r.legs {
		if o == s || o.tie == nil || o.tie.signalled.Load() {
			continue
		}
		o.unstarted = true // read by the leg only once it learns it lost
		if o.lose()&legLost == 0 {
			o.unstarted = false // back, or posted: its answer is the round's
			continue
		}
		r.live--
		o.cancel(errTwinStarted)
		lost = append(lost, o)
	}
	if len(lost) == 0 {
		return
	}
	now := timing.Since(c.start)
	r.discard(lost, now)
	for _, o := range lost {
		if o.drewToken && r.unheard(o, now) {
			c.refund(now, o.kind)
		}
		if ob := c.t.obs; ob != nil && ob.TieCancelled != nil {
			ob.TieCancelled(policy.HedgeInfo{Context: c.ctx, Key: c.s.key, Priority: c.prio, Attempt: o.n, Tied: true})
		}
	}
}

// unheard reports whether leg o, cancelled at now without having said it
// started, had been on its way long enough that its signal would have
// come had it started at once: the ties' delay, twice the quickest signal
// lately. A leg sent less than that before now, or any leg once the
// delay is no longer known, may have started unheard.
func (r *round) unheard(o *leg, now time.Time) bool {
	d, ok := r.h.Ties().Delay(now)
	return ok && !o.dispatch.IsZero() && now.Sub(o.dispatch) >= d
}
