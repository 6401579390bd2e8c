package admission

import (
	"net/http"
	"sync"
	"time"

	"github.com/resilix/resilix/internal/orca"
)

// writeLoad puts the server's load report in h, the header of an answer
// about to be sent, unless next put one there itself (a handler that knows
// more of its load, or a proxy's): in-flight over the limit as
// application_utilization, the requests next finished over the last
// second as rps_fractional, and the in-flight count, the limit and the
// queue as named metrics (see orca.AppendText). It costs two allocations:
// the value and its slice.
func (s *server) writeLoad(h http.Header) {
	if _, set := h[orca.Header]; set {
		return
	}
	inFlight, limit, queued := s.limiter.Load()
	var buf [reportLen]byte
	b := orca.AppendText(buf[:0], s.served.rate(time.Now()), inFlight, max(limit, 1), queued)
	h[orca.Header] = []string{string(b)}
}

// reportLen is the room a report is formatted in on the stack: admission's
// is about 130 bytes, longer only with counts of seven digits.
const reportLen = 192

// rateWindow is the span a rate is measured over: short enough that
// rps_fractional follows a step of load within a second, long enough to
// hold a few requests of a server that serves tens a second.
const rateWindow = time.Second

// rateMeter measures a rate of events over a sliding window of
// rateWindow, from two counts: the current window's and the last one's,
// which is weighed by how much of it the sliding window still covers
// (the sliding-window counter of rate limiters). It is safe for
// concurrent use and allocates nothing.
type rateMeter struct {
	mu        sync.Mutex
	epoch     time.Time // the start of the current window; zero before the first event
	cur, prev float64
}

// add counts one event at now.
func (m *rateMeter) add(now time.Time) {
	m.mu.Lock()
	m.roll(now)
	m.cur++
	m.mu.Unlock()
}

// rate returns the events a second over the window ending at now.
func (m *rateMeter) rate(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.epoch.IsZero() {
		return 0
	}
	m.roll(now)
	left := 1 - float64(now.Sub(m.epoch))/float64(rateWindow) // share of the last window still covered
	return (m.cur + m.prev*min(max(left, 0), 1)) / rateWindow.Seconds()
}

// roll moves the windows on to the one now is in. m.mu is held.
func (m *rateMeter) roll(now time.Time) {
	if m.epoch.IsZero() {
		m.epoch = now
		return
	}
	d := now.Sub(m.epoch)
	switch {
	case d < rateWindow:
	case d < 2*rateWindow:
		m.prev, m.cur = m.cur, 0
		m.epoch = m.epoch.Add(rateWindow)
	default:
		m.prev, m.cur = 0, 0
		m.epoch = now
	}
}
