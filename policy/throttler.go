package policy

import (
	"net/http"
	"time"
)

// Throttler is client-side adaptive throttling, from Google's SRE book,
// chapter 21 ("Handling Overload"): the client refuses a call locally with
// probability max(0, (requests − K·accepts) / (requests + 1)) over a recent
// window, so a dependency that is refusing work stops receiving it. Two
// bounds are added to the book's rule: the probability is 0 while the
// window holds fewer than MinRequests requests, so a host the client has
// only just met is not throttled on the strength of a few refusals, and it
// never exceeds MaxRejection, so some attempts always reach the backend to
// show it has recovered.
//
// Requests are every attempt the throttler is asked about, the ones it
// refuses itself included; accepts are those the backend took on, as
// Accepted says (DefaultAccepted: not transport errors, 429, 502, 503 or
// 504). Canceled and Discarded attempts count neither way. The probability
// is shed bottom-up: Bulk first, then BestEffort, then Degraded, and
// Critical only when every lower priority is fully shed; within a priority,
// tenants above their fair share are refused more. A refusal is a
// *RejectedError matching ErrThrottled; it never reaches the wire.
type Throttler struct {
	// K is how many requests per accept the client lets through before it
	// starts throttling, in [1, 1e9). If zero, 2 is used (the book's
	// choice).
	K float64

	// Window is how much history requests and accepts are counted over.
	// If zero, 2m is used, the book's choice.
	Window time.Duration

	// MinRequests is the number of requests the window must hold before
	// the client throttles at all: below it the rejection probability is
	// 0, whatever the backend answered. If zero, 20 is used. If negative,
	// there is no floor, and a single refusal from a fresh host makes the
	// next attempt be refused with probability 1/2, as the book's formula
	// alone does.
	MinRequests int

	// MaxRejection caps the rejection probability, in (0, 1]: however
	// badly the backend is doing, a share 1 − MaxRejection of the attempts
	// still reaches it. If zero, 0.95 is used: one attempt in 20. 1 leaves
	// the book's formula uncapped, under which a backend refusing
	// everything sees about one attempt per Window. (Envoy's admission
	// control, built on the same formula, has the same cap,
	// max_rejection_probability, with a default of 0.8.)
	MaxRejection float64

	// Accepted decides whether the backend accepted an attempt, from its
	// response or error (exactly one of them non-nil); it must not read or
	// close the body. If nil, DefaultAccepted is used.
	Accepted func(resp *http.Response, err error) bool
}

func (t *Throttler) validate() error {
	return joinErrs(
		fieldErrIf(t.K != 0 && !(t.K >= 1 && t.K < 1e9), "Throttler.K", "must be in [1, 1e9), got %v", t.K),
		fieldErrIf(t.Window < 0, "Throttler.Window", "must be >= 0, got %v", t.Window),
		fieldErrIf(t.MaxRejection != 0 && !(t.MaxRejection > 0 && t.MaxRejection <= 1),
			"Throttler.MaxRejection", "must be in (0, 1], got %v", t.MaxRejection),
	)
}

// WithDefaults returns t with every zero field set to its default.
func (t Throttler) WithDefaults() Throttler {
	t.K = or(t.K, 2)
	t.Window = or(t.Window, 2*time.Minute)
	t.MinRequests = or(t.MinRequests, thrMinRequests)
	t.MaxRejection = or(t.MaxRejection, thrMaxRejection)
	if t.Accepted == nil {
		t.Accepted = DefaultAccepted
	}
	return t
}

// DefaultAccepted is the Accepted used when Throttler.Accepted is nil. It
// reports whether a backend took on the work of an attempt, which is what
// the SRE book counts as an accept. An attempt is not accepted when:
//
//   - it got no response (any transport error: refused or reset connection,
//     per-attempt timeout): the backend could not take the work;
//   - the status is 429 Too Many Requests or 503 Service Unavailable: the
//     backend refused it, the signature of overload;
//   - the status is 502 Bad Gateway or 504 Gateway Timeout: a proxy in front
//     of the backend could not get it served, which is what an overloaded
//     backend behind a load balancer looks like from the client.
//
// Every other status is accepted, 500 and the other 5xx included: the
// backend took the work and failed at it, which is the breaker's business,
// not a refusal to throttle for. 4xx other than 429 are the caller's
// problem, and accepted.
func DefaultAccepted(resp *http.Response, err error) bool {
	if err != nil || resp == nil {
		return false
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable,
		http.StatusBadGateway, http.StatusGatewayTimeout:
		return false
	}
	return true
}

// Throttler's defaults.
const (
	thrMinRequests  = 20
	thrMaxRejection = 0.95
)
