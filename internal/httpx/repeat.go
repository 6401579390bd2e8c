package httpx

import "net/http"

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
