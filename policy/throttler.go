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
// The defaults are not the book's two minutes and K of 2: they are set
// for a server whose queue outgrows its callers' deadlines, as a FIFO
// does in an overload, seen by a client that is one of many. The first
// evidence such a client has is an attempt its caller's deadline ended,
// one deadline after it was sent; the throttler refuses about half a
// window after the window's answers turn to refusals, and, once the
// backend accepts again, the share it lets through grows about K-fold a
// window from 1 − MaxRejection. A window of a second, K of 3 and a ceiling
// of 0.8 refuse within about a second of the first deadline that ends and
// let calls back within about two seconds of the last, for a client of a
// dozen calls a second (docs/performance.md, "Metastable failure", has a
// fleet of 200 such clients against servers that queue, and behind
// admission). A client whose callers wait longer than a second, or that
// must spare a backend that refuses cheaply more than K = 3 does, sets a
// longer Window or a lower K.
//
// Requests are every attempt the throttler is asked about, the ones it
// refuses itself included; accepts are those the backend took on, as
// Accepted says (DefaultAccepted: not transport errors, 429, 502, 503 or
// 504). An attempt it lets through is counted when its answer comes back,
// as a request and, if accepted, an accept: one still on its way is no
// evidence, so a backend slower than the window is not throttled for it. An attempt that the caller's deadline ended before any answer is
// a request not accepted: the backend had it for as long as the caller
// could wait, and what it does with it now is work for nobody. An attempt
// the caller cancelled, a hedge's losing leg (Discarded) and an Invalid
// attempt count neither way. The
// probability is shed bottom-up: Bulk first, then BestEffort, then
// Degraded, and Critical only when every lower priority is fully shed;
// within a priority, tenants above their fair share are refused more. A
// refusal is a *RejectedError matching ErrThrottled; it never reaches the
// wire.
//
// # Pushback
//
// The estimate above learns from what the backend does; pushback takes its
// word. When an attempt's answer is a 429 Too Many Requests or a 503
// Service Unavailable with a Retry-After (delta-seconds or an HTTP-date)
// of at most MaxPushback, the key's Bulk and BestEffort attempts are held
// back until that wait has passed; Degraded and Critical attempts still go,
// and each later such answer extends the hold. How they are held back
// depends on what the status says about the backend:
//
//   - 503 says it is overloaded: Bulk and BestEffort are stopped. Every one
//     of them is refused until the Retry-After has passed, with
//     RejectedError.RetryAfter set to what is left of it.
//   - 429 says the caller is over its rate: a rate limiter (a token bucket,
//     as nginx's limit_req and most public APIs have) keeps admitting its
//     rate while it refuses the excess with 429 and a short Retry-After,
//     typically 1s. Stopping for that second would waste the rate the
//     backend would have served, so Bulk and BestEffort are paced instead:
//     the key's attempts, all priorities together, are let through at 1.05
//     times the rate the backend has been accepting them, measured over
//     its last 16 accepts since the first 429, and Bulk and BestEffort are
//     refused what goes beyond that, with RejectedError.RetryAfter set to
//     when the pace would let the next one through (at least 1ms, at most
//     what is left of the Retry-After). The extra twentieth costs about one
//     429 for every twenty accepts, and finds out whether the backend would
//     take more: while it takes all that is sent, the pace doubles every 16
//     accepts up to the rate at its last 429, and grows by a twentieth
//     beyond. A backend that accepts nothing gets attempts ever further
//     apart. Degraded and Critical attempts count against the pace
//     but are never refused by it: what they take, Bulk and BestEffort do
//     without. This is the idea of the AWS SDKs' adaptive retry mode,
//     which adjusts a client-side token bucket on throttling answers, with
//     the rate the backend accepts in place of its CUBIC curve, so that the
//     backend's rate is used in full: against a token bucket at 200/s
//     that 16 callers flood (package transport's
//     TestPushbackPacesARateLimitedAPI), the client keeps its goodput,
//     0.98 of what it gets without pushback, for 1.08 wire calls per
//     success, where stopping would keep a tenth of it. The weak case is a
//     bucket of a single token (nginx's limit_req without burst), which
//     refuses a paced attempt that is a little early: there the pace keeps
//     about 0.86 of the rate, for 1.05 wire calls per success.
//
// Pushback reads the answer's status and Retry-After header, never its
// body, and holds no permit: a hold is state of the key, and ends by
// itself. A 429 or 503 without a Retry-After, or with one that does not
// parse, is zero, or is longer than MaxPushback, holds nothing back: the
// estimate alone answers it. (Retry, when it reads a Retry-After that does not
// parse, counts it in Snapshot.MalformedHeaders.) Attempts held back are
// not counted as requests in the estimate's window, so pushback and the
// estimate do not refuse the same attempts twice over; what pushback lets
// through is then subject to the estimate as usual. Snapshot.PushbackLeft
// and Snapshot.PushbackRate show the hold, and Observer.Pushback reports
// each answer that arms or extends it.
type Throttler struct {
	// K is how many requests per accept the client lets through before it
	// starts throttling, in [1, 1e9). If zero, 3 is used: a backend
	// that has recovered gets the client's calls back about threefold a
	// Window. The book's choice is 2, which spares a refusing backend
	// more and lets calls back about twofold a Window.
	K float64

	// Window is how much history requests and accepts are counted over.
	// If zero, 1s is used, about a caller's deadline: the throttler
	// starts refusing about half a Window after the answers turn to
	// refusals, and lets calls back within about two Windows of a
	// recovery. The book's choice is 2m.
	Window time.Duration

	// MinRequests is the number of requests the window must hold before
	// the client throttles at all: below it the rejection probability is
	// 0, whatever the backend answered. If zero, 5 is used: a client of
	// more than about 7 calls a second can throttle within the default
	// Window, and 5 refusals from a host it has just met are throttled
	// for at most a Window. If negative,
	// there is no floor, and a single refusal from a fresh host makes the
	// next attempt be refused with probability 1/2, as the book's formula
	// alone does.
	MinRequests int

	// MaxRejection caps the rejection probability, in (0, 1]: however
	// badly the backend is doing, a share 1 − MaxRejection of the attempts
	// still reaches it. If zero, 0.8 is used, as Envoy's admission
	// control (built on the same formula) does by default
	// (max_rejection_probability): one attempt in 5, so that a client of a
	// dozen calls a second finds a recovered backend within about half a
	// second, and the share it lets through starts its climb from a
	// fifth. 1 leaves the book's formula uncapped, under which a backend
	// refusing everything sees about one attempt per Window.
	MaxRejection float64

	// Accepted decides whether the backend accepted an attempt, from its
	// response or error (exactly one of them non-nil); it must not read or
	// close the body. If nil, DefaultAccepted is used.
	Accepted func(resp *http.Response, err error) bool

	// MaxPushback is the longest Retry-After that pushback obeys (see the
	// Pushback section above): an answer asking for a longer wait holds
	// nothing back, as Retry.MaxRetryAfter makes Retry hand such an answer
	// back at once rather than wait. If zero, the Set's Retry.MaxRetryAfter
	// is used, so that pushback and retries trust a Retry-After alike
	// (pushback is then off if that is negative), or, when the Set has no
	// Retry, 10s, the bound Retry has by default: a client that does not
	// retry should not hold back longer than one that does. If negative,
	// pushback is off, and 429s and 503s only feed the estimate.
	//
	// Pushback is on by default. A boolean could only say so as a negative
	// (NoPushback), against booleans that default to false and name what
	// they turn on; this one field is both the switch and the bound, in the
	// shape of Retry.MaxRetryAfter, whose negative value likewise turns
	// Retry-After off.
	MaxPushback time.Duration
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
	t.K = or(t.K, thrK)
	t.Window = or(t.Window, thrWindow)
	t.MinRequests = or(t.MinRequests, thrMinRequests)
	t.MaxRejection = or(t.MaxRejection, thrMaxRejection)
	if t.Accepted == nil {
		t.Accepted = DefaultAccepted
	}
	return t
}

// PushbackBound returns the longest Retry-After that pushback obeys in a
// Set whose Retry is r (nil for none), as MaxPushback says: MaxPushback,
// or, when it is zero, r's MaxRetryAfter with its default, or 10s without
// r. A negative result means pushback is off.
func (t *Throttler) PushbackBound(r *Retry) time.Duration {
	switch {
	case t.MaxPushback != 0:
		return t.MaxPushback
	case r != nil:
		return r.WithDefaults().MaxRetryAfter
	}
	return Retry{}.WithDefaults().MaxRetryAfter
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

// Throttler's defaults; the Throttler doc has the reasons.
const (
	thrK            = 3
	thrWindow       = time.Second
	thrMinRequests  = 5
	thrMaxRejection = 0.8
)
