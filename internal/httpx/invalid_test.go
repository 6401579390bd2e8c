package httpx

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/go-cleanhttp"
)

// invalidRequests are the requests net/http refuses to send as they are,
// each made from a valid GET of target by one change.
var invalidRequests = []struct {
	name   string
	change func(*http.Request)
}{
	{"unsupported scheme", func(r *http.Request) { r.URL.Scheme = "ftp" }},
	{"no scheme", func(r *http.Request) { r.URL.Scheme = "" }},
	{"invalid header field name", func(r *http.Request) { r.Header["Bad Name"] = []string{"v"} }},
	{"invalid header field value", func(r *http.Request) { r.Header.Set("X-Value", "a\r\nInjected: 1") }},
	{"invalid trailer field name", func(r *http.Request) { r.Trailer = http.Header{"Bad:Name": {"v"}} }},
	{"invalid trailer field value", func(r *http.Request) { r.Trailer = http.Header{"X-T": {"a\x00b"}} }},
	{"invalid method", func(r *http.Request) { r.Method = "GET /x" }},
	{"no Host in the URL", func(r *http.Request) { r.URL.Host = "" }},
	{"nil URL", func(r *http.Request) { r.URL = nil }},
	{"nil Header", func(r *http.Request) { r.Header = nil }},
}

// newGet returns a GET of target with change made to it.
func newGet(t *testing.T, target string, change func(*http.Request)) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	change(req)
	return req
}

// refusal returns the error rt gives req, which it must refuse.
func refusal(t *testing.T, rt http.RoundTripper, req *http.Request) error {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("%s %v succeeded", req.Method, req.URL)
	}
	return err
}

// TestInvalidBeforeDialing: the errors net/http's transport, bare and as
// cleanhttp sets it up, and http.Client return for a request they refuse
// before dialing are Invalid; the target is a port nothing listens on, so
// an attempt that dialed would fail otherwise, and not be Invalid.
func TestInvalidBeforeDialing(t *testing.T) {
	target := closedPort(t) + "x"
	for _, tc := range invalidRequests {
		for _, rt := range []struct {
			name string
			rt   *http.Transport
		}{
			{"http.Transport", &http.Transport{}},
			{"cleanhttp", cleanhttp.DefaultPooledTransport()},
		} {
			err := refusal(t, rt.rt, newGet(t, target, tc.change))
			if !Invalid(err) {
				t.Errorf("%s, %s: Invalid(%q) = false", tc.name, rt.name, err)
			}
			if Unsent(err) {
				// Not a claim Invalid makes, but a case Unsent must not
				// take for a dial it would retry.
				t.Errorf("%s, %s: Unsent(%q) = true", tc.name, rt.name, err)
			}
			rt.rt.CloseIdleConnections()
		}
		if tc.name == "nil URL" || tc.name == "nil Header" {
			continue // http.Client would panic on a nil Header, and says it for a nil URL
		}
		c := &http.Client{Transport: cleanhttp.DefaultPooledTransport()}
		resp, err := c.Do(newGet(t, target, tc.change))
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: http.Client sent it", tc.name)
		}
		var ue *url.Error
		if !errors.As(err, &ue) || !Invalid(err) {
			t.Errorf("%s, http.Client: Invalid(%q) = %v; want a *url.Error that is Invalid", tc.name, err, Invalid(err))
		}
	}
	t.Run("RequestURI set", func(t *testing.T) {
		req := newGet(t, target, func(r *http.Request) { r.RequestURI = "/x" })
		_, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if !Invalid(err) {
			t.Errorf("Invalid(%q) = false", err)
		}
	})
	t.Run("nil URL, http.Client", func(t *testing.T) {
		req := newGet(t, target, func(r *http.Request) { r.URL = nil })
		_, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if !Invalid(err) {
			t.Errorf("Invalid(%q) = false", err)
		}
	})
}

// writeRefusal returns the error rt gives the request req makes, which it
// must refuse once connected. Over HTTP/1 net/http races with itself
// there: the write's error closes the connection, and the read that
// waited for the answer may fail first, with the closed connection's
// error (a *net.OpError, not Invalid, as it should be), which it then
// returns instead. So it tries a few times, and returns the first error
// that is not the read's.
func writeRefusal(t *testing.T, rt http.RoundTripper, req func() *http.Request) error {
	t.Helper()
	var err error
	for range 20 {
		err = refusal(t, rt, req())
		var op *net.OpError
		if !errors.As(err, &op) {
			return err
		}
	}
	t.Fatalf("net/http's own read error came first 20 times: %v", err)
	return nil
}

// TestInvalidOnceConnected: over real sockets, what net/http refuses to
// write once it has a connection, over HTTP/1 (directly and to a proxy)
// and over HTTP/2, is Invalid; the server never sees a request.
func TestInvalidOnceConnected(t *testing.T) {
	quiet := log.New(io.Discard, "", 0)
	seen := make(chan string, 16)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Method + " " + r.RequestURI
	})
	h1 := httptest.NewServer(handler)
	defer h1.Close()
	h2 := httptest.NewUnstartedServer(handler)
	h2.EnableHTTP2 = true
	h2.Config.ErrorLog = quiet
	h2.StartTLS()
	defer h2.Close()
	proxy, _ := url.Parse(h1.URL)

	for _, tc := range []struct {
		name   string
		rt     *http.Transport
		target string
		change func(*http.Request)
	}{
		{"HTTP/1, control character in the query", &http.Transport{}, h1.URL,
			func(r *http.Request) { r.URL.RawQuery = "a=\x01" }},
		{"HTTP/1 to a proxy, invalid Host", &http.Transport{Proxy: http.ProxyURL(proxy)}, "http://a.test/",
			func(r *http.Request) { r.Host = "a b" }},
		{"HTTP/1, forbidden trailer key", &http.Transport{}, h1.URL,
			func(r *http.Request) {
				r.Method, r.Body, r.ContentLength = http.MethodPost, io.NopCloser(strings.NewReader("x")), -1
				r.Trailer = http.Header{"Content-Length": nil}
			}},
		{"HTTP/2, invalid Host", h2.Client().Transport.(*http.Transport), h2.URL,
			func(r *http.Request) { r.Host = "a b" }},
		{"HTTP/2, invalid :path", h2.Client().Transport.(*http.Transport), h2.URL,
			func(r *http.Request) { r.URL.Opaque = "x" }},
		{"HTTP/2, invalid Connection header", h2.Client().Transport.(*http.Transport), h2.URL,
			func(r *http.Request) { r.Header.Set("Connection", "x-other") }},
		{"HTTP/2, invalid Transfer-Encoding header", h2.Client().Transport.(*http.Transport), h2.URL,
			func(r *http.Request) { r.Header.Set("Transfer-Encoding", "gzip") }},
		{"HTTP/2, a pseudo-header in Header", h2.Client().Transport.(*http.Transport), h2.URL,
			func(r *http.Request) { r.Header.Set(":protocol", "websocket") }},
	} {
		err := writeRefusal(t, tc.rt, func() *http.Request { return newGet(t, tc.target, tc.change) })
		if !Invalid(err) {
			t.Errorf("%s: Invalid(%q) = false", tc.name, err)
		}
		tc.rt.CloseIdleConnections()
	}
	select {
	case r := <-seen:
		t.Errorf("the server saw %s", r)
	default:
	}
}

// TestInvalidBodyLength: over real sockets, a body that does not match
// its request's ContentLength is Invalid: shorter (a drained body, as a
// reused request has) or longer over HTTP/1, longer over HTTP/2, and a
// ContentLength with a nil body.
func TestInvalidBodyLength(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })
	h1 := httptest.NewServer(handler)
	defer h1.Close()
	h2 := httptest.NewUnstartedServer(handler)
	h2.EnableHTTP2 = true
	h2.Config.ErrorLog = log.New(io.Discard, "", 0)
	h2.StartTLS()
	defer h2.Close()
	put := func(body io.Reader, length int64) func(*http.Request) {
		return func(r *http.Request) {
			r.Method, r.ContentLength = http.MethodPut, length
			if body != nil {
				r.Body = io.NopCloser(body)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		rt     *http.Transport
		target string
		change func(*http.Request)
	}{
		{"HTTP/1, drained body", &http.Transport{}, h1.URL, put(strings.NewReader(""), 7)},
		{"HTTP/1, drained body of a reader net/http does not know", &http.Transport{}, h1.URL, put(io.MultiReader(), 7)},
		{"HTTP/1, body longer than its ContentLength", &http.Transport{}, h1.URL, put(strings.NewReader("payload"), 3)},
		{"HTTP/1, ContentLength with a nil Body", &http.Transport{}, h1.URL, put(nil, 7)},
		{"HTTP/2, body longer than its ContentLength", h2.Client().Transport.(*http.Transport), h2.URL, put(strings.NewReader("payload"), 3)},
	} {
		err := writeRefusal(t, tc.rt, func() *http.Request { return newGet(t, tc.target, tc.change) })
		if !Invalid(err) {
			t.Errorf("%s: Invalid(%q) = false", tc.name, err)
		}
		tc.rt.CloseIdleConnections()
	}
}

// TestNotInvalid: what fails for the dependency's sake, or for any reason
// other than the request itself, is not Invalid, and neither is a message
// that only resembles net/http's.
func TestNotInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"nil", nil},
		{"connection refused", refused},
		{"no such host", noHost},
		{"proxy unreachable", viaProxy},
		{"reset", readReset},
		{"broken pipe", writeRST},
		{"timeout", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}},
		{"EOF", io.EOF},
		{"deadline", os.ErrDeadlineExceeded},
		{"response header timeout", errors.New("net/http: timeout awaiting response headers")},
		{"HTTP/2 stream error", streamError{1, "PROTOCOL_ERROR", "received from peer"}},
		{"malformed response", errors.New(`net/http: HTTP/1.x transport connection broken: malformed HTTP response "x"`)},
		{"a message containing the words", errors.New("upstream said: http: no Host in request URL")},
		{"a message extending the words", errors.New("http: no Host in request URL, or so")},
		{"scheme without its quoted value", errors.New("unsupported protocol scheme")},
		{"scheme with more after it", errors.New(`unsupported protocol scheme "ftp" today`)},
		{"scheme badly quoted", errors.New(`unsupported protocol scheme "ftp`)},
		{"connection header not a list", errors.New(`invalid Connection request header: "x"`)},
		{"connection header list unclosed", errors.New(`invalid Connection request header: ["x"`)},
		{":path with more after it", errors.New(`invalid request :path "x" from URL.Opaque = "x" and more`)},
		{"net/http's words in an error of another type", messageError("http: no Host in request URL")},
		{"body length not a number", errors.New("http: ContentLength=7 with Body length x")},
		{"body length missing", errors.New("http: ContentLength=7 with Body length ")},
		{"ContentLength alone", errors.New("http: ContentLength=7")},
		{"nil Body with more after it", errors.New("http: Request.ContentLength=7 with nil Body, twice")},
	} {
		if Invalid(tc.err) {
			t.Errorf("%s: Invalid(%v) = true", tc.name, tc.err)
		}
	}
	for _, s := range []string{
		`invalid Connection request header: ["x-other"]`,
		`invalid Upgrade request header: ["a" "b"]`,
		`invalid Transfer-Encoding request header: []`,
		`invalid request :path "x" from URL.Opaque = "x"`,
		`net/http: invalid header field value for "X-Value"`,
		"http: ContentLength=7 with Body length 0",
		"http: ContentLength=-1 with Body length 12",
		"http: Request.ContentLength=7 with nil Body",
	} {
		if err := fmt.Errorf("wrapped: %w", errors.New(s)); !Invalid(err) {
			t.Errorf("Invalid(%q) = false", err)
		}
	}
}

// messageError is an error of a type of its own, whatever its message.
type messageError string

func (e messageError) Error() string { return string(e) }

// TestInvalidAllocs: Invalid reads the message of no error net/http did
// not make with errors.New, so an error path pays nothing for it.
func TestInvalidAllocs(t *testing.T) {
	wrapped := &url.Error{Op: "Get", URL: "http://x.test/", Err: readReset}
	refusal := &url.Error{Op: "Get", URL: "ftp://x.test/", Err: errors.New(`unsupported protocol scheme "ftp"`)}
	if n := testing.AllocsPerRun(100, func() { Invalid(wrapped); Invalid(refusal) }); n != 0 {
		t.Fatalf("Invalid allocates %v times", n)
	}
}
