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
// request the leg sends and its per-attempt timer runs, before the leg is
// timed.
//
// The headers go on a Header of the leg's own: a hedge leg has one
// already (prepare gives it a deep copy, Request.Clone); any other leg
// shares the caller's Header, or is the caller's request itself, and gets
// a shallow copy of the request with a copy of the Header. The copy is
// sized for the values written, so that writing them allocates nothing
// more.
func (c *call) stamp(l *leg) {
	t := c.t
	var prio, id, left string
	n := 1 // values to write: the attempt number always has one
	if c.named {
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
	d, bounded := c.timeout, c.timeout > 0
	if dl, ok := c.ctx.Deadline(); ok {
		if rest := time.Until(dl); !bounded || rest < d {
			d = rest
		}
		bounded = true
	}
	if bounded {
		left = strconv.FormatInt(int64(max(d, 0)/time.Millisecond), 10)
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
	w.put(t.timeoutHeader, left)
	w.set(t.attemptHeader, strconv.Itoa(l.n))
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
