// Package httpx holds the HTTP mechanics the transport shares: Retry-After
// parsing, draining superseded responses, the replayability rules, which
// errors prove that a request never reached the server, which are
// net/http refusing to send the request at all, and what an Observer is
// given of a malformed header (shared with admission).
package httpx

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// PushbackValue returns the Retry-After value of a response that asks to
// be called later, a 429 Too Many Requests or a 503 Service Unavailable,
// and "" for any other response or none. Every reader of pushback (the
// throttler, a retry's backoff, a lane's hold) asks it, so that another
// status's Retry-After is read by none.
func PushbackValue(resp *http.Response) string {
	if resp == nil || resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return ""
	}
	if vs := resp.Header["Retry-After"]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// ParseRetryAfter returns the wait a Retry-After header value asks for, as
// delta-seconds or an HTTP-date relative to now (RFC 9110 §10.2.3), and
// whether the value was valid. A date in the past is a wait of zero. An
// empty or malformed value is not valid; it never panics.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			// All digits but too large: an absurd wait, capped.
			if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
				return maxWait, true
			}
			return 0, false
		}
		if secs > uint64(maxWait/time.Second) {
			return maxWait, true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(t.Sub(now), 0), maxWait), true
}

// maxWait bounds parsed waits so that arithmetic on them cannot overflow.
const maxWait = 100 * 365 * 24 * time.Hour

// MaxReported is the most of a malformed header's value Reported keeps.
const MaxReported = 64

// Reported returns what an Observer is given of a malformed header's
// value v (policy.MalformedHeader.Value): a copy, so that an Observer that
// keeps it does not keep the request's or the response's headers, of at
// most MaxReported bytes, cut so as not to split a rune (bytes that are no
// UTF-8 are cut where they are).
func Reported(v string) string {
	if len(v) > MaxReported {
		n := MaxReported
		for i := 1; i < utf8.UTFMax && !utf8.RuneStart(v[n]); i++ {
			n--
		}
		v = v[:n]
	}
	return strings.Clone(v)
}

// DrainLimit is the most of a superseded response body Discard reads
// before closing it.
const DrainLimit = 4 << 10

// DrainTime is the longest Discard spends draining a body before it
// closes it.
const DrainTime = 100 * time.Millisecond

// Discard throws resp away without making the caller wait. In the
// background it reads at most DrainLimit bytes of the body, for at most
// DrainTime, so that a small body's connection can be reused, then closes
// it. A body that stalls is closed when DrainTime runs out, which ends a
// pending read on net/http's bodies, so the goroutine ends by then. A nil
// resp, or one without a body, is ignored.
func Discard(resp *http.Response) {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	go drain(resp.Body)
}

// Drain is Discard on the calling goroutine: it returns once resp's body
// has been drained (at most DrainLimit bytes, for at most DrainTime) and
// closed.
func Drain(resp *http.Response) {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	drain(resp.Body)
}

func drain(b io.ReadCloser) {
	stop := time.AfterFunc(DrainTime, func() { _ = b.Close() })
	_, _ = io.CopyN(io.Discard, b, DrainLimit)
	if stop.Stop() {
		_ = b.Close()
	}
}

// Repeatable reports whether sending req twice is safe: its method is
// idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) or it carries an
// Idempotency-Key or X-Idempotency-Key header, which is net/http's own
// rule, or marked is true.
func Repeatable(req *http.Request, marked bool) bool {
	if marked {
		return true
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	if _, ok := req.Header["Idempotency-Key"]; ok {
		return true
	}
	_, ok := req.Header["X-Idempotency-Key"]
	return ok
}

// Rewindable reports whether req's body can be sent again as it was:
// it has none, or GetBody re-creates it.
func Rewindable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// Permanent reports whether a transport error will not go away by sending
// the request again: the server's certificate was not trusted (unknown
// authority, wrong host name, invalid). Such an error is still a Failure
// of the dependency, but retrying it only repeats the handshake.
func Permanent(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) ||
		errors.As(err, &hostname) || errors.As(err, &invalid)
}

// The default names of the headers resilix reads and writes across
// services, as transport.Config and admission.Config document them.
const (
	PriorityHeader = "Resilix-Priority"
	TenantHeader   = "Resilix-Tenant"
	TimeoutHeader  = "Resilix-Timeout-Ms"
	AttemptHeader  = "Resilix-Attempt"
)

// Headers is the four configured header names of a transport or a
// server: priority, tenant, timeout and attempt, in that order, each
// empty for its default.
type Headers [4]string

// headerFields names Headers' entries as the Config fields that set them.
var headerFields = Headers{"PriorityHeader", "TenantHeader", "TimeoutHeader", "AttemptHeader"}

// Canonical returns h with defaults applied and every name in canonical
// form (headerName), and an error, prefixed with prefix, for each name
// that is not valid and for each two that name the same header, which
// would then carry two things at once.
func (h Headers) Canonical(prefix string) (Headers, []error) {
	var errs []error
	defaults := Headers{PriorityHeader, TenantHeader, TimeoutHeader, AttemptHeader}
	var names Headers
	for i, v := range h {
		name, ok := headerName(v, defaults[i])
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s %q is not a valid header name", prefix, headerFields[i], name))
			continue
		}
		names[i] = name
		for j := range i {
			if names[j] == name {
				errs = append(errs, fmt.Errorf("%s: %s and %s are both the header %q", prefix, headerFields[j], headerFields[i], name))
			}
		}
	}
	return names, errs
}

// headerName returns the configured header name v, or def when v is
// empty, in canonical form, so that a hot path can index a Header
// directly; ok is false when the name is not a token of RFC 9110 and no
// request could carry it.
func headerName(v, def string) (name string, ok bool) {
	if v == "" {
		v = def
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return v, false
		}
	}
	return textproto.CanonicalMIMEHeaderKey(v), true
}
