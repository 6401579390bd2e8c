package httpx

import (
	"net/http"
	"strings"
	"time"
)

// HoldHeader is the header in which admission says, beside a 429's or
// 503's Retry-After, how long it means, in whole milliseconds: its
// estimate of the wait for a free slot, which Retry-After's whole seconds
// round up to at least 1 s.
const HoldHeader = "Resilix-Retry-After-Ms"

// PushbackHint returns the HoldHeader's wait of a 429 or 503 that has a
// Retry-After, and whether it has a valid one. It is a hint that only
// shortens: without a Retry-After it is not read, and a reader takes it
// only when it is shorter than Retry-After.
func PushbackHint(resp *http.Response) (time.Duration, bool) {
	if PushbackValue(resp) == "" {
		return 0, false
	}
	if vs := resp.Header[HoldHeader]; len(vs) > 0 {
		return parseMillis(vs[0])
	}
	return 0, false
}

// parseMillis parses v, surrounding white space trimmed, as ASCII digits
// counting milliseconds, capped at maxWait.
func parseMillis(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	limit := maxWait.Milliseconds()
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = min(n*10+int64(c-'0'), limit+1)
	}
	return time.Duration(min(n, limit)) * time.Millisecond, true
}
