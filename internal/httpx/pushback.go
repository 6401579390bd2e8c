package httpx

import (
	"net/http"
	"strconv"
	"strings"
	"time"
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
