package httpx

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
)

// Invalid reports whether err, the error of one wire attempt, is net/http
// refusing the request itself: it could not be sent as it is, and sending
// it again gets the same refusal. It says nothing about the server, which
// never saw the request (or, for a body that does not match its
// ContentLength, never saw all of it); it is the caller's bug.
// Invalid is true when some error in err's chain (followed through
// Unwrap) is, whole, one of net/http's messages for:
//
//   - a request its Transport refuses before it dials: a nil URL or
//     Header, a scheme other than http and https (unsupported protocol
//     scheme "ftp"), an invalid header or trailer field name or value, an
//     invalid method, a URL with no Host;
//   - an HTTP/1 request it refuses once connected but before writing a
//     byte of it: a control character in the request URI, an invalid Host
//     sent to a proxy, a trailer key that may not be one;
//   - an HTTP/2 request whose headers it refuses to encode: an invalid
//     Host, an invalid :path, a :protocol outside CONNECT, a connection
//     header HTTP/2 forbids (Upgrade, Transfer-Encoding, Connection), an
//     invalid header or trailer (net/http wraps these in "http2: ");
//   - a request http.Client refuses to send: one with RequestURI set;
//   - a request whose body does not match its ContentLength: shorter or
//     longer over HTTP/1 (http: ContentLength=7 with Body length 0, what
//     a reused request whose body was read already gives), longer over
//     HTTP/2, or a ContentLength with a nil Body. net/http may have
//     written the headers and part of the body first, but never the
//     request the headers announce.
//
// net/http exports no type for these errors: it makes each with
// errors.New, or fmt.Errorf without %w, so only errors of that type are
// read, and their messages are matched whole, with the quoted values
// net/http puts in them parsed as Go strings, not as substrings of
// something else. Reading no other error's message, Invalid allocates
// nothing. Anything else is not Invalid, a refused dial, a reset or a
// timeout above all. When in doubt, the answer is no.
func Invalid(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if reflect.TypeOf(err) == plainError && invalidMessage(err.Error()) {
			return true
		}
	}
	return false
}

// plainError is the type of errors.New's errors, which fmt.Errorf returns
// too when it wraps nothing.
var plainError = reflect.TypeOf(errors.New(""))

// The messages of net/http's errors for a request it will not send, whole.
var invalidWhole = map[string]bool{
	// Transport.roundTrip, and http.Client for the URL
	"http: nil Request.URL":        true,
	"http: nil Request.Header":     true,
	"http: no Host in request URL": true,
	// Request.write, HTTP/1
	"net/http: can't write control character in Request.URL": true,
	"http: invalid Host header":                              true,
	// httpcommon.EncodeHeaders, HTTP/2
	"invalid Host header":                             true,
	"invalid :protocol header in non-CONNECT request": true,
	// Client.send
	"http: Request.RequestURI can't be set in client requests": true,
	// http2clientStream.writeRequestBody
	"http2: request body larger than specified content length": true,
}

// The parts of net/http's messages for a body that does not match its
// ContentLength, around the numbers in them.
const (
	msgLengthPrefix = "http: ContentLength="
	msgLengthMiddle = " with Body length "
	msgNilBody      = "http: Request.ContentLength="
	msgNilBodyEnd   = " with nil Body"
)

// The prefixes of net/http's messages for a request it will not send,
// each followed by one Go-quoted value (%q of a string) and nothing else.
var invalidQuoted = []string{
	"unsupported protocol scheme ",
	"net/http: invalid method ",
	"net/http: invalid header field name ",
	"net/http: invalid header field value for ",
	"net/http: invalid trailer field name ",
	"net/http: invalid trailer field value for ",
	"invalid Trailer key ",
	"invalid HTTP header field name ",
	"invalid HTTP header field value for ",
	"invalid HTTP trailer field name ",
	"invalid HTTP trailer field value for ",
	"invalid request :path ",
}

// The prefixes of HTTP/2's messages for a connection header it will not
// send, each followed by %q of the header's values, a []string.
var invalidConnHeader = []string{
	"invalid Upgrade request header: ",
	"invalid Transfer-Encoding request header: ",
	"invalid Connection request header: ",
}

// invalidMessage reports whether msg is, whole, one of net/http's messages
// for a request it will not send.
func invalidMessage(msg string) bool {
	if invalidWhole[msg] {
		return true
	}
	if rest, ok := strings.CutPrefix(msg, msgLengthPrefix); ok {
		// "http: ContentLength=%d with Body length %d"
		want, got, ok := strings.Cut(rest, msgLengthMiddle)
		return ok && isInt(want) && isInt(got)
	}
	if rest, ok := strings.CutPrefix(msg, msgNilBody); ok {
		// "http: Request.ContentLength=%d with nil Body"
		n, ok := strings.CutSuffix(rest, msgNilBodyEnd)
		return ok && isInt(n)
	}
	for _, p := range invalidQuoted {
		if rest, ok := strings.CutPrefix(msg, p); ok {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return false
			}
			rest = rest[len(q):]
			if p == "invalid request :path " {
				// "invalid request :path %q from URL.Opaque = %q"
				if o, ok := strings.CutPrefix(rest, " from URL.Opaque = "); ok {
					q, err := strconv.QuotedPrefix(o)
					return err == nil && len(q) == len(o)
				}
			}
			return rest == ""
		}
	}
	for _, p := range invalidConnHeader {
		if rest, ok := strings.CutPrefix(msg, p); ok {
			return quotedList(rest)
		}
	}
	return false
}

// isInt reports whether s is, whole, %d of an integer: an optional minus
// sign and at least one digit. (strconv would allocate its error.)
func isInt(s string) bool {
	s = strings.TrimPrefix(s, "-")
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// quotedList reports whether s is, whole, %q of a []string: `["a" "b"]`.
func quotedList(s string) bool {
	s, ok := strings.CutPrefix(s, "[")
	if !ok {
		return false
	}
	for first := true; ; first = false {
		if rest, ok := strings.CutPrefix(s, "]"); ok {
			return rest == ""
		}
		if !first {
			if s, ok = strings.CutPrefix(s, " "); !ok {
				return false
			}
		}
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			return false
		}
		s = s[len(q):]
	}
}
