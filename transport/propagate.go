package transport

import (
	"net/http"
	"net/http/httptrace"
	"strconv"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/orca"
	"github.com/resilix/resilix/policy"
)

// stamp writes on leg l's request the headers that a key whose set has
// Propagate on sends with each wire attempt (see "Across services" in the
// package doc): the call's priority and tenant, the time the attempt may
// still take, and the attempt's number. Each is exactly what the call
// derives: a value the request carried for one of them is replaced, or
// removed where the call has none. On a key that picks its lanes by load
// reports, it asks for one, unless the request asks already (see
// asksLoad). prepare calls it once l.req is the
// request the leg sends; the time left is written later, in send, as
// late as the request allows (see leftHeader).
//
// The headers go on a Header of the leg's own: a hedge leg has one
// already (prepare gives it a deep copy, Request.Clone); any other leg
// shares the caller's Header, or is the caller's request itself, and gets
// a shallow copy of the request with a copy of the Header. The copy is
// sized for the values written, so that writing them allocates nothing
// more.
func (c *call) stamp(l *leg) {
	t := c.t
	var prio, id string
	n := 1 // values to write: the attempt number always has one
	if c.prioNamed {
		prio = c.prio.String()
		n++
	}
	if v := c.tenant; v != "" {
		if len(v) <= MaxTenantLen && validHeaderValue(v) {
			id = v
			n++
		} else if l.n == 1 {
			// Reported once a call, with its first attempt.
			t.malformed(c.ctx, c.s, t.tenantHeader, v)
		}
	}
	// The time left is written in send, as the request is handed to the
	// base: the caller's deadline, or the per-attempt timeout when that is
	// shorter.
	l.until, l.left, l.conn = time.Time{}, nil, nil
	dl, bounded := c.ctx.Deadline()
	if bounded {
		l.until = dl
	}
	if bounded = bounded || c.timeout > 0; bounded {
		n++
	}
	ask := c.asksLoad()
	if ask {
		n++
	}

	var w headerWriter
	if l.kind == policy.AttemptHedge {
		w = headerWriter{h: l.req.Header, free: make([]string, n)}
		for k := range w.h {
			if t.spells(k) {
				delete(w.h, k)
			}
		}
	} else {
		if l.req == c.req {
			l.req = c.req.WithContext(l.ctx)
		}
		w = cloneHeader(c.req.Header, n, t.spells)
		l.req.Header = w.h
	}
	w.put(t.priorityHeader, prio)
	w.put(t.tenantHeader, id)
	if bounded {
		l.left = w.free[:1:1]
		w.set(t.timeoutHeader, "0")
		if t.connTrace {
			// The time left is written again once the base has a
			// connection for the request, and, where the base's
			// HTTP/2 may then hold it for a stream, as it writes it
			// (see connStamp): a connection dialled for the request
			// (a TLS handshake over a network: tens of milliseconds),
			// or one waited for, is not time the next tier has. The
			// hooks get a value of their own, so that neither the call
			// nor the leg escapes.
			l.conn = &connStamp{until: l.until, timeout: c.timeout, left: l.left}
			trace := &httptrace.ClientTrace{GotConn: l.conn.gotConn}
			if t.streamTrace {
				trace.WroteHeaderField = l.conn.wroteField
			}
			l.req = l.req.WithContext(httptrace.WithClientTrace(l.req.Context(), trace))
		}
	} else {
		delete(w.h, t.timeoutHeader)
	}
	w.set(t.attemptHeader, strconv.Itoa(l.n))
	if ask {
		w.set(orca.FormatHeader, "text")
	}
}

// asksLoad reports whether the call's attempts ask for a load report
// (endpoint-load-metrics-format: text, which vLLM and Triton need before
// they report): its key picks lanes by their servers' reports, and the
// caller's request does not ask in a form of its own. Only attempts that
// carry headers of their own (see stamp) ask: elsewhere asking would cost
// a copy of each request's Header.
func (c *call) asksLoad() bool {
	r := c.s.set.replicas
	return r != nil && r.LoadReportAge >= 0 && len(c.req.Header[orca.FormatHeader]) == 0
}

// transitMargin is taken off the time left that a propagated attempt
// announces, besides rounding it down to the millisecond: it covers what
// cannot be measured, the time from the request's hand-off to the base
// (or, over an *http.Transport, from when it had a connection, or a
// stream, for the request: see connStamp) to the next tier's handler
// reading it: writing it, the network, the next tier's accepting and
// reading it and scheduling its handler. Over a quiet loopback that is
// about half a millisecond, but a Go server's scheduling adds
// milliseconds at its tail, which 1ms does not cover and 5ms does but for
// a loaded machine's rare calls (docs/propagation.md has the figures, and
// TestPropagatedDeadlineLoopback measures them). The margin costs the
// next tier 5ms of its time, 5% of a 100ms deadline; a request that waits
// longer than that before the next tier reads it gets a deadline later by
// the excess.
const transitMargin = 5 * time.Millisecond

// leftHeader writes, on a propagated attempt, the time it may still take
// as of now, the moment its request is handed to the base (see timeLeft;
// over an *http.Transport, connStamp writes it again once the base has a
// connection for it).
// l.left is the timeout header's value, which stamp made room for.
func (c *call) leftHeader(l *leg, now time.Time) {
	l.left[0] = timeLeft(l.until, c.timeout, now)
}

// timeLeft returns the time an attempt may still take as of now: the time
// left before until (the caller's deadline or the attempt's own end,
// whichever comes first), or the per-attempt timeout when there is no
// until (whole: its timer started a moment ago), less transitMargin, in
// whole milliseconds rounded down, "0" when no more is left.
func timeLeft(until time.Time, timeout time.Duration, now time.Time) string {
	d := timeout
	if !until.IsZero() {
		if rest := until.Sub(now); d <= 0 || rest < d {
			d = rest
		}
	}
	return strconv.FormatInt(int64(max(d-transitMargin, 0)/time.Millisecond), 10)
}

// connStamp writes a propagated attempt's time left again as the base,
// an *http.Transport, sends the request, at the latest moment its
// ClientTrace hooks give that precedes the reading of the request's
// headers to write them:
//
//   - GotConn, once it has a connection for the request: dialled for it,
//     idle at once, or handed over after a wait (MaxConnsPerHost). It
//     calls GotConn on the goroutine that called RoundTrip, before it
//     hands the request to the goroutine that writes it (HTTP/1: the
//     connection's write loop, which takes it at once; HTTP/2: the
//     stream's).
//   - WroteHeaderField for ":authority", installed only when the base's
//     HTTP/2 has StrictMaxConcurrentRequests: such a base hands a
//     connection at its stream limit over at once, and holds the request
//     after GotConn until a stream ends. The hook is called on the
//     goroutine that writes the request, once it has its stream, for the
//     pseudo-header fields, which HTTP/2 sends before every other field;
//     the value is read again from the Header after it. Over HTTP/1, the
//     first field written is "Host", which the hook leaves alone.
//
// A wait that neither hook sees is not taken off the time left: an
// HTTP/2 request held after GotConn by a base without
// StrictMaxConcurrentRequests (which hands over only a connection with a
// stream free, unless the server lowers its limit meanwhile), or by an
// HTTP/2 transport configured outside the base
// (golang.org/x/net/http2's ConfigureTransports).
//
// The hooks write the value in place, in the slot stamp made for it,
// while the base holds the request: each runs before the goroutine it
// runs on, or one it then hands the request to, reads the Header to
// write it, and net/http waits for a write to end before it sends the
// request again on another connection.
type connStamp struct {
	until   time.Time     // the caller's deadline; zero: none
	end     time.Time     // the end of the attempt's own timeout; zero: none (prepare sets it)
	timeout time.Duration // the per-attempt timeout
	left    []string      // the timeout header's value
}

func (s *connStamp) gotConn(httptrace.GotConnInfo) { s.stamp(time.Now()) }

func (s *connStamp) wroteField(name string, _ []string) {
	if name == ":authority" {
		s.stamp(time.Now())
	}
}

// stamp writes the time left as of now.
func (s *connStamp) stamp(now time.Time) {
	until, timeout := s.until, s.timeout
	if !s.end.IsZero() {
		timeout = 0
		if until.IsZero() || s.end.Before(until) {
			until = s.end
		}
	}
	s.left[0] = timeLeft(until, timeout, now)
}

// headerWriter sets header values from one preallocated array.
type headerWriter struct {
	h    http.Header
	free []string // slots for the values still to set
}

// set sets key, in canonical form, to the single value v, replacing any
// values it had.
func (w *headerWriter) set(key, v string) {
	w.free[0] = v
	w.h[key] = w.free[:1:1]
	w.free = w.free[1:]
}

// put sets key as set does, or removes it when v is empty.
func (w *headerWriter) put(key, v string) {
	if v == "" {
		delete(w.h, key)
		return
	}
	w.set(key, v)
}

// spells reports whether the key k is one of the four headers spelled
// otherwise than in canonical form, which stamp removes: a Header built
// in-process may hold one (h["resilix-tenant"]), net/http writes it as it
// is, and the next tier reads it as the header (see httpx.First).
func (t *Transport) spells(k string) bool {
	return httpx.Spells(k, t.priorityHeader) || httpx.Spells(k, t.tenantHeader) ||
		httpx.Spells(k, t.timeoutHeader) || httpx.Spells(k, t.attemptHeader)
}

// cloneHeader returns a writer over a deep copy of h, as Header.Clone
// makes it (nil values stay nil, so that a header the caller suppressed
// stays suppressed), without the keys that skip reports, and with room
// for extra more keys and values.
func cloneHeader(h http.Header, extra int, skip func(string) bool) headerWriter {
	nv := extra
	for _, vs := range h {
		nv += len(vs)
	}
	sv := make([]string, nv)
	h2 := make(http.Header, len(h)+extra)
	for k, vs := range h {
		switch {
		case skip(k):
			continue
		case vs == nil:
			h2[k] = nil
			continue
		}
		n := copy(sv, vs)
		h2[k] = sv[:n:n]
		sv = sv[n:]
	}
	return headerWriter{h: h2, free: sv}
}

// validHeaderValue reports whether v may be sent as a header field value,
// as net/http's transport checks it (RFC 7230, section 3.2): no control
// byte other than a horizontal tab. A value that is not is refused by the
// transport, failing the attempt.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}
