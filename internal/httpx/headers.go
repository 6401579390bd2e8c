package httpx

import (
	"fmt"
	"net/textproto"
	"strings"
	"unicode/utf8"
)

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

// TieHeader marks a tied request, with the value "1", and the
// informational answer (103) that says it started, with TieStarted: see
// package admission's "Tied requests".
const (
	TieHeader  = "Resilix-Tie"
	TieStarted = "started"
)
