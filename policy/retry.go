package policy

import (
	"net/http"
	"time"
)

// Retry re-sends a call whose attempt failed (see Classify, and If to
// decide apart from it), up to Set.Attempts wire calls in all.
//
// It re-sends only what is safe to send twice: a request whose method is
// GET, HEAD, OPTIONS, TRACE, PUT or DELETE, or that carries an
// Idempotency-Key or X-Idempotency-Key header (net/http's own convention),
// or whose context was marked with transport.MarkRepeatable; and only when
// its body can be replayed: there is none, Request.GetBody re-creates it,
// or it has no GetBody and fits in Set.ReplayBuffer, in which case a copy
// is kept as the first attempt reads it (the body is read only by the
// attempts that send it). It does not retry an error that sending again
// cannot fix: a server certificate that was not trusted
// (Observer.RetrySkipped says SkipPermanent), nor a request net/http
// refused to send as it is (an unsupported scheme, an invalid header,
// method or Host): that attempt is Invalid, no failure, so If is not
// asked, no retry is skipped, and the caller gets net/http's error as it
// is.
// One exception to the method rule: an attempt whose error proves that the
// request never reached the server (a refused connection, a failed TLS
// handshake, an HTTP/2 stream the server refused or never processed) may
// be retried whatever the method; package transport documents the exact
// rule, under "What never left".
//
// Between attempts it sleeps an exponential backoff with full jitter (a
// uniform draw in [0, min(MaxDelay, BaseDelay·2ⁿ)), where n is the number
// of retries already made, 0 before the first; see Backoff), or what Delay
// returns when it is set, or longer if the response asked for it with
// Retry-After. Only a 429 Too Many Requests or a 503 Service Unavailable
// asks: these are the statuses that carry Retry-After as the server's
// pushback, as the Throttler reads them, and any other status's
// Retry-After is not read. With Replicas, a Retry-After is the replica's
// that sent it: it holds that replica's lane back, and while a lane the
// call has not used is open the retry goes there after the backoff
// alone; only when none is does Retry-After stretch the wait (or, beyond
// MaxRetryAfter, end the call), and then only until the first such lane
// opens, which the retry takes. It never sleeps past the caller's deadline:
// when the next attempt could not start before it, the last response or
// error is returned at once. Each retry withdraws one token from the scope's
// Budget, which it gives back if its answer is the call's success, and
// passes the admission gates like any attempt; when no token is left, or a
// gate refuses, the last response or error is returned, and
// Observer.RetrySkipped says why. With Replicas, the retry of an attempt
// that never reached a server, sent to a lane the call has not used while
// one is open, draws no token and waits no backoff (see "What never left"
// in package transport). A response is
// thrown away only once the retry that supersedes it is admitted: it is
// then drained in the background (at most 4 KiB, at most 100 ms, so its
// connection can be reused without the caller waiting) and closed.
//
// When attempts run out on a response, that response is returned with a nil
// error, so the caller sees the 503 and its body; when they run out on an
// error, the last error is returned, saying how many wire attempts were
// made when there was more than one ("resilix: 3 attempts: attempt timed
// out: ..."), with errors.Is and errors.As reaching the error itself.
type Retry struct {
	// BaseDelay is the backoff before the first retry, before jitter. If
	// zero, 50ms is used.
	BaseDelay time.Duration

	// MaxDelay caps the backoff before jitter. If zero, 5s is used, or
	// BaseDelay if larger. It must not be below BaseDelay.
	MaxDelay time.Duration

	// MaxRetryAfter is the longest Retry-After (delta-seconds or HTTP-date)
	// of a 429 or 503 that is honoured. A response asking for a longer
	// wait is returned to the caller at once rather than retried early
	// against the server's wish or held for longer than the caller is
	// likely to wait (Envoy's rate-limited retry back-off makes the same
	// choice). If zero, 10s is used. If negative, Retry-After is ignored
	// and only the backoff applies.
	MaxRetryAfter time.Duration

	// Delay, when set, replaces the exponential backoff with full jitter:
	// the wait before a retry is Delay(retry), retry counting from 1 for
	// the first retry, and no jitter is added (a negative result is no
	// wait). Retry-After, MaxRetryAfter and the deadline still apply on top,
	// as they do to the backoff: a longer Retry-After wins, one beyond
	// MaxRetryAfter ends the call with that response, and a wait that would
	// pass the caller's deadline is not slept. If nil, the backoff is
	// used, and BaseDelay and MaxDelay shape it; they must be zero when
	// Delay is set. Delay is called with no lock held, concurrently for
	// different calls, so it must be safe for concurrent use.
	Delay func(retry int) time.Duration

	// If decides which attempts are retried, apart from Set.Classify,
	// which decides what counts against the dependency's health: an
	// attempt is retried when If returns true, whatever Classify said of
	// it, and not when it returns false. The breaker, the throttler, the
	// limiter and the hedging gates learn from Classify alone, so If can
	// retry a 409 Conflict without teaching the breaker that the upstream
	// is failing, or hand a 503 to the caller at once while the breaker
	// still counts it. If nil, an attempt is retried when Classify calls
	// it a Failure; to add a case to that, wrap the classification:
	//
	//	If: func(resp *http.Response, err error) bool {
	//		return resp != nil && resp.StatusCode == http.StatusConflict ||
	//			policy.DefaultClassify(resp, err) == policy.Failure
	//	},
	//
	// If is asked about every attempt that came back from the base
	// RoundTripper, with its response or its error, exactly one of them
	// non-nil, as Classify is (an attempt cut short by Timeout.PerAttempt
	// comes with its timeout error), and it must not read or close the
	// body. It is never asked about an attempt the caller gave up on, a
	// hedge leg that lost its race, or a request net/http refused to send
	// as it is (Invalid): those are never retried.
	// Everything above still applies on top: If cannot make a plain POST
	// repeatable, retry an untrusted certificate, or spend attempts, budget
	// or gates' permits the call does not have. In a hedged round, an answer
	// wins the race only when Classify calls it a Success and If would not
	// retry it; otherwise the round waits for its other legs, and retries
	// after the last of them as If says. It is called with no lock held,
	// and concurrently for the legs of a hedged call, so it must be safe
	// for concurrent use.
	If func(resp *http.Response, err error) bool
}

// Retry's defaults, which validate and WithDefaults share; the field docs
// say why each.
const (
	retryBaseDelay     = 50 * time.Millisecond
	retryMaxDelay      = 5 * time.Second // at least BaseDelay
	retryMaxRetryAfter = 10 * time.Second
)

func (r *Retry) validate() error {
	base := or(r.BaseDelay, retryBaseDelay)
	return joinErrs(
		fieldErrIf(r.BaseDelay < 0, "Retry.BaseDelay", "must be >= 0, got %v", r.BaseDelay),
		fieldErrIf(r.MaxDelay < 0, "Retry.MaxDelay", "must be >= 0, got %v", r.MaxDelay),
		fieldErrIf(r.MaxDelay > 0 && r.MaxDelay < base,
			"Retry.MaxDelay", "(%v) must be >= Retry.BaseDelay (%v)", r.MaxDelay, base),
		fieldErrIf(r.Delay != nil && r.BaseDelay != 0,
			"Retry.BaseDelay", "is set, but Retry.Delay replaces the backoff it shapes"),
		fieldErrIf(r.Delay != nil && r.MaxDelay != 0,
			"Retry.MaxDelay", "is set, but Retry.Delay replaces the backoff it shapes"),
	)
}

// WithDefaults returns r with every zero field set to its default.
func (r Retry) WithDefaults() Retry {
	r.BaseDelay = or(r.BaseDelay, retryBaseDelay)
	r.MaxDelay = or(r.MaxDelay, max(retryMaxDelay, r.BaseDelay))
	r.MaxRetryAfter = or(r.MaxRetryAfter, retryMaxRetryAfter)
	return r
}

// Backoff returns the sleep before the next retry, given the number of
// retries already made (0 before the first; a negative count is taken as
// 0) and a uniform draw u in [0, 1):
//
//	u · min(MaxDelay, BaseDelay·2ⁿ), n = retries
//
// which is full jitter over an exponential ceiling: BaseDelay before the
// first retry, twice that before the second, and so on up to MaxDelay. The
// ceiling stops doubling once it reaches MaxDelay, so a large count neither
// overflows nor loops for long. The caller supplies u so the function is
// pure; r must have its defaults applied.
func (r *Retry) Backoff(retries int, u float64) time.Duration {
	ceil := r.BaseDelay
	for ; retries > 0 && ceil > 0 && ceil < r.MaxDelay; retries-- {
		if ceil > r.MaxDelay/2 { // doubling would pass MaxDelay, or overflow
			ceil = r.MaxDelay
			break
		}
		ceil *= 2
	}
	ceil = min(ceil, r.MaxDelay)
	return time.Duration(u * float64(ceil))
}
