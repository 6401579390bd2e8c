package transport

import (
	"errors"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"time"

	"github.com/resilix/resilix/internal/httpx"
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

// markTie marks leg l of a hedged round, prepared, as tied when the
// round marks it (see marksTie): the tie header, on a header of the
// leg's own, and a hook on its 1xx answers (see tieWatch). Only a round's
// legs are marked, which live on the heap: a leg of a round that does
// not hedge stays on its caller's stack.
func (c *call) markTie(l *leg) {
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
	l.tie = &tieWatch{l: l}
	l.req = l.req.WithContext(httptrace.WithClientTrace(l.req.Context(), &httptrace.ClientTrace{Got1xxResponse: l.tie.got1xx}))
}

// tieMark is the tie header's value on a tied leg, shared by every leg:
// net/http reads a request's header and never writes it.
var tieMark = []string{"1"}

// tieWatch reads a tied leg's 1xx answers. Its hook runs on the base's
// goroutine that reads the answer (for HTTP/2, the connection's), so it
// only counts, and tells the round, which cancels and does nothing that
// could block.
type tieWatch struct {
	l         *leg
	n         int  // 1xx answers so far
	signalled bool // a start signal came (guarded by the round's lock once the leg is in one)
}

func (w *tieWatch) got1xx(code int, h textproto.MIMEHeader) error {
	w.n++
	if w.n > maxInformational {
		return errTooManyInformational
	}
	if code != http.StatusEarlyHints || len(h[httpx.TieHeader]) != 1 || h[httpx.TieHeader][0] != httpx.TieStarted {
		return nil // another 1xx, or a signal not ours: not a start
	}
	if r := w.l.round; r != nil {
		r.started(w.l, time.Now())
	}
	return nil
}

// tellRanTwice tells the observer that leg l of a tied round said it
// started after another leg had (see started).
func (c *call) tellRanTwice(l *leg, threshold time.Duration) {
	if o := c.t.obs; o != nil && o.TieRanTwice != nil {
		o.TieRanTwice(policy.HedgeInfo{Context: c.ctx, Key: c.s.key, Priority: c.prio, Attempt: l.n, Threshold: threshold, Tied: true})
	}
}

// started learns that leg l's request has started at its server, at
// now. The first leg of a tied round to say so has every other leg still
// on the wire that has not said so cancelled (they are then, as far as
// the client knows, in their servers' queues), and the round sends no
// more legs: the legs it rescues are those that queue, and a leg that
// started is left to finish. A second leg that says so means both ran.
// The legs cancelled are ended as they come back (see end, endLostBack).
func (r *round) started(l *leg, now time.Time) {
	c := &r.c
	r.mu.Lock()
	if l.tie.signalled || r.state == roundDecided {
		r.mu.Unlock()
		return
	}
	l.tie.signalled = true
	if !l.dispatch.IsZero() {
		r.h.Ties().Signalled(now, now.Sub(l.dispatch))
	}
	if c.tie != tieRound {
		r.mu.Unlock()
		return
	}
	if r.starter != nil {
		// Both started before either signal reached the client: told
		// as the round ends (see collect), on the caller's goroutine.
		r.twice = l
		r.mu.Unlock()
		return
	}
	r.starter = l
	r.due = time.Time{} // no more legs
	var unstarted []*leg
	for _, o := range r.legs {
		if o != l && o.state == legOnWire {
			o.state, o.unstarted = legLost, true
			unstarted = append(unstarted, o)
		}
	}
	r.mu.Unlock()
	for _, o := range unstarted {
		o.cancel(errTwinStarted)
	}
}
