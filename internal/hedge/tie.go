package hedge

import (
	"sync"
	"time"
)

// Ties is what one scope knows of its upstream's tied requests: whether
// it sends their start signal, and how soon after a leg goes out the
// signal comes back when the leg did not wait (the least time seen
// lately, which is the network's round trip and the server's admission).
// It is safe for concurrent use; only tied legs touch it.
//
// An upstream is taken to speak ties from its first signal, and no
// longer once forgetAfter tied legs in a row were served without one (a
// replica of an older version, or a proxy that drops 1xx, took the
// upstream's place): the transport then marks first legs only, which
// costs no extra calls, until a signal comes again.
type Ties struct {
	mu       sync.Mutex
	speaks   bool
	silent   int // tied legs served in a row without a signal, while speaks
	quickest [2]quick
}

// quick is the least time to a signal over one half of the window.
type quick struct {
	start time.Time
	least time.Duration
	seen  bool // a signal came in this half: least is its least
}

const (
	// forgetAfter is how many tied legs served in a row without a signal
	// make the upstream one that does not speak ties: one silence may be
	// a leg whose 103 a proxy dropped, three in a row are the upstream.
	forgetAfter = 3
	// tieHalfWindow is half the span the least time to a signal is
	// taken over: long enough to hold a quiet moment's signal, short
	// enough that a path that became slower (a new route, a busier
	// server's admission) is the one measured within 20s. BBR keeps its
	// least round trip over 10s for the same reason.
	tieHalfWindow = 10 * time.Second
	// tieDelayFactor is how many of the quickest signal's times a tied
	// round waits before it sends a twin: at one, a first leg that found
	// a worker at once would often not yet have been heard of, and both
	// legs would run; at two, its signal has had as long again to come.
	// The Tail at Scale (Dean and Barroso, 2013) delays its tied
	// requests by about two network message delays, the same margin.
	tieDelayFactor = 2
	// minTieDelay is the least delay before a twin: below it, the time
	// a signal takes is the client's own scheduling (a timer's and a
	// goroutine's wake-up on a busy host), not the network's. The Tail
	// at Scale's tied requests, within a data centre, used 1ms.
	minTieDelay = time.Millisecond
)

// Speaks reports whether the upstream sends the start signal of tied
// requests, as far as the scope has heard.
func (t *Ties) Speaks() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.speaks
}

// Signalled learns a start signal that came after a tied leg had been
// on its way for d.
func (t *Ties) Signalled(now time.Time, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.speaks, t.silent = true, 0
	q := t.roll(now)
	if !q.seen || d < q.least {
		q.least, q.seen = max(d, 0), true
	}
}

// Served learns a tied leg whose answer was served (a success) with or
// without its start signal.
func (t *Ties) Served(signalled bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if signalled || !t.speaks {
		t.silent = 0
		return
	}
	t.silent++
	if t.silent >= forgetAfter {
		t.speaks, t.silent = false, 0
		t.quickest = [2]quick{}
	}
}

// Delay returns how long a tied round waits for its first leg's signal
// before it sends a twin, at least minTieDelay, and false when it cannot tell: the upstream
// does not speak ties, or no signal came within the window.
func (t *Ties) Delay(now time.Time) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.speaks {
		return 0, false
	}
	t.roll(now)
	cur, prev := t.quickest[0], t.quickest[1]
	switch {
	case prev.seen && (!cur.seen || prev.least < cur.least):
		cur = prev
	case !cur.seen:
		return 0, false
	}
	return max(tieDelayFactor*cur.least, minTieDelay), true
}

// roll returns the current half-window as of now, starting a new one
// (and forgetting the one before the last) when its time is up. t.mu is
// held.
func (t *Ties) roll(now time.Time) *quick {
	cur := &t.quickest[0]
	switch age := now.Sub(cur.start); {
	case cur.start.IsZero() || age >= 2*tieHalfWindow:
		t.quickest = [2]quick{{start: now}}
	case age >= tieHalfWindow:
		t.quickest[1] = *cur
		*cur = quick{start: cur.start.Add(tieHalfWindow)}
	}
	return cur
}
