package transport

import (
	"net/http"
	"strconv"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
)

// stamp writes on leg l's request the headers that a key whose set has
// Propagate on sends with each wire attempt (see "Across services" in the
// package doc): the call's priority and tenant, the time the attempt may
// still take, and the attempt's number. Each is exactly what the call
// derives: a value the request carried for one of them is replaced, or
// removed where the call has none. prepare calls it once l.req is the
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
		if validHeaderValue(v) {
			id = v
			n++
		} else if l.n == 1 {
			// Reported once a call, with its first attempt: a hedge leg
			// is prepared under its round's lock, where no observer may
			// be called.
			t.malformed(c.ctx, c.s, t.tenantHeader, v)
		}
	}
	// The time left is written in send, as the request is handed to the
	// base: the caller's deadline, or the per-attempt timeout when that is
	// shorter.
	l.until, l.left = time.Time{}, nil
	dl, bounded := c.ctx.Deadline()
	if bounded {
		l.until = dl
	}
	if bounded = bounded || c.timeout > 0; bounded {
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
	} else {
		delete(w.h, t.timeoutHeader)
	}
	w.set(t.attemptHeader, strconv.Itoa(l.n))
}

// transitMargin is taken off the time left that a propagated attempt
// announces, besides rounding it down to the millisecond: it covers what
// cannot be measured, the time from handing the request to the base to
// the next tier's reading it (writing it, the network, the server's
// reading it), which is about half a millisecond over a quiet loopback
// (TestPropagatedDeadlineLoopback). So the next tier's deadline, arrival
// plus the time announced, is earlier than the caller's by up to 2ms
// less that transit, and later only by what the transit takes beyond
// the margin and the rounding: a connection dialled for the request, a
// network hop of more than a millisecond, a busy server's scheduling.
const transitMargin = time.Millisecond

// leftHeader writes, on a propagated attempt, the time it may still take
// as of now, the moment its request is handed to the base: the time left
// before the caller's deadline, or the per-attempt timeout (whole: its
// timer started a moment ago) when that is shorter, less transitMargin,
// in whole milliseconds rounded down, 0 when no more is left. l.left is
// the timeout header's value, which stamp made room for.
func (c *call) leftHeader(l *leg, now time.Time) {
	d := c.timeout
	if !l.until.IsZero() {
		if rest := l.until.Sub(now); d <= 0 || rest < d {
			d = rest
		}
	}
	l.left[0] = strconv.FormatInt(int64(max(d-transitMargin, 0)/time.Millisecond), 10)
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
