package httpx

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestParseRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{" 120 ", 120 * time.Second, true},
		{"99999999999999999999999", maxWait, true},
		{"1e3", 0, false},
		{"-5", 0, false},
		{"", 0, false},
		{"soon", 0, false},
		{"3.5", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Sunday, 29-Nov-26 12:00:30 GMT", 30 * time.Second, true}, // RFC 850
		{"Sun Nov 29 12:01:00 2026", time.Minute, true},            // asctime
		{"Sun, 29 Nov 2026 25:00:00 GMT", 0, false},
	} {
		got, ok := ParseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.wantOK)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "120", "Sun, 29 Nov 2026 12:01:00 GMT", "", " 5", "99999999999999999999", "-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := ParseRetryAfter(s, now)
		if d < 0 || d > maxWait {
			t.Fatalf("ParseRetryAfter(%q) = %v out of [0, %v]", s, d, maxWait)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v with ok=false", s, d)
		}
	})
}

// TestReplayable: a request may be sent again when it is Repeatable and
// its body Rewindable.
func TestReplayable(t *testing.T) {
	body := func() io.ReadCloser { return io.NopCloser(strings.NewReader("x")) }
	for _, tc := range []struct {
		name   string
		method string
		header string
		body   bool
		get    bool
		marked bool
		want   bool
	}{
		{"GET", "GET", "", false, false, false, true},
		{"empty method is GET", "", "", false, false, false, true},
		{"HEAD", "HEAD", "", false, false, false, true},
		{"PUT with GetBody", "PUT", "", true, true, false, true},
		{"PUT body without GetBody", "PUT", "", true, false, false, false},
		{"DELETE", "DELETE", "", false, false, false, true},
		{"plain POST", "POST", "", true, true, false, false},
		{"PATCH", "PATCH", "", false, false, false, false},
		{"POST with Idempotency-Key", "POST", "Idempotency-Key", true, true, false, true},
		{"POST with X-Idempotency-Key", "POST", "X-Idempotency-Key", true, true, false, true},
		{"marked POST", "POST", "", true, true, true, true},
		{"marked POST, body not replayable", "POST", "", true, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{Method: tc.method, Header: http.Header{}}
			if tc.header != "" {
				r.Header[tc.header] = nil // presence is what counts, as in net/http
			}
			if tc.body {
				r.Body = body()
			}
			if tc.get {
				r.GetBody = func() (io.ReadCloser, error) { return body(), nil }
			}
			if got := Repeatable(r, tc.marked) && Rewindable(r); got != tc.want {
				t.Errorf("Repeatable && Rewindable = %v, want %v", got, tc.want)
			}
		})
	}
}

type countingBody struct {
	r      io.Reader
	mu     sync.Mutex
	read   int64
	closed bool
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.mu.Lock()
	b.read += int64(n)
	b.mu.Unlock()
	return n, err
}

func (b *countingBody) Close() error { b.mu.Lock(); b.closed = true; b.mu.Unlock(); return nil }

func TestDiscardIsBoundedInBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &countingBody{r: strings.NewReader(strings.Repeat("x", 1<<20))}
		Discard(&http.Response{Body: b})
		synctest.Wait()
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.read > DrainLimit || !b.closed {
			t.Fatalf("read %d bytes (limit %d), closed=%v", b.read, DrainLimit, b.closed)
		}
		Discard(nil) // no panic
	})
}

// TestDrainIsBoundedAndReturnsClosed: Drain is Discard on its caller's
// goroutine: it returns with the body closed, having read at most
// DrainLimit bytes of a large one, and at most DrainTime of a stalled one.
func TestDrainIsBoundedAndReturnsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &countingBody{r: strings.NewReader(strings.Repeat("x", 1<<20))}
		Drain(&http.Response{Body: b})
		if b.read > DrainLimit || !b.closed {
			t.Fatalf("read %d bytes (limit %d), closed=%v", b.read, DrainLimit, b.closed)
		}
		s := stalled{closed: make(chan struct{})}
		start := time.Now()
		Drain(&http.Response{Body: s})
		if d := time.Since(start); d != DrainTime {
			t.Fatalf("Drain returned after %v on a stalled body, want DrainTime", d)
		}
		select {
		case <-s.closed:
		default:
			t.Fatal("the stalled body was not closed")
		}
		Drain(nil) // no panic
		Drain(&http.Response{Body: http.NoBody})
	})
}

// stalled is a body whose reads block until it is closed.
type stalled struct{ closed chan struct{} }

func (s stalled) Read([]byte) (int, error) { <-s.closed; return 0, io.ErrClosedPipe }
func (s stalled) Close() error             { close(s.closed); return nil }

func TestDiscardNeverWaitsOnAStalledBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := stalled{closed: make(chan struct{})}
		start := time.Now()
		Discard(&http.Response{Body: b})
		if d := time.Since(start); d != 0 {
			t.Fatalf("Discard held its caller %v", d)
		}
		synctest.Wait()
		select {
		case <-b.closed:
			t.Fatal("closed before DrainTime")
		default:
		}
		time.Sleep(DrainTime)
		synctest.Wait()
		select {
		case <-b.closed:
		default:
			t.Fatal("the stalled body was not closed at DrainTime")
		}
	})
}

func TestPermanent(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{x509.UnknownAuthorityError{}, true},
		{fmt.Errorf("dial: %w", x509.HostnameError{Host: "a"}), true},
		{&tls.CertificateVerificationError{Err: errors.New("bad")}, true},
		{x509.CertificateInvalidError{}, true},
		{errors.New("connection refused"), false},
		{context.DeadlineExceeded, false},
	} {
		if got := Permanent(tc.err); got != tc.want {
			t.Errorf("Permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestReported(t *testing.T) {
	long := strings.Repeat("a", 1<<20)
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"urgent", "urgent"},
		{long[:MaxReported], long[:MaxReported]},
		{long, long[:MaxReported]},
		{strings.Repeat("é", 40), strings.Repeat("é", 32)},             // 80 bytes, cut at a rune
		{"x" + strings.Repeat("é", 40), "x" + strings.Repeat("é", 31)}, // byte 64 continues a rune
		{strings.Repeat("\xbf", 100), strings.Repeat("\xbf", 61)},      // no UTF-8: a rune is at most 4 bytes
		{strings.Repeat("a", 62) + "😀", strings.Repeat("a", 62)},
	} {
		got := Reported(tc.in)
		if got != tc.want {
			t.Errorf("Reported(%.20q... %d bytes) = %q, want %q", tc.in, len(tc.in), got, tc.want)
		}
		if len(got) > 0 && unsafe.StringData(got) == unsafe.StringData(tc.in) {
			t.Errorf("Reported(%.20q...) shares the value's bytes, want a copy", tc.in)
		}
	}
}

func TestPushbackValue(t *testing.T) {
	with := func(code int, vs ...string) *http.Response {
		h := http.Header{}
		for _, v := range vs {
			h.Add("Retry-After", v)
		}
		return &http.Response{StatusCode: code, Header: h}
	}
	for _, c := range []struct {
		name string
		resp *http.Response
		want string
	}{
		{"none", nil, ""},
		{"429", with(429, "3"), "3"},
		{"503, the first value", with(503, "7", "9"), "7"},
		{"503 without", with(503), ""},
		{"500", with(500, "3"), ""},
		{"301", with(301, "3"), ""},
	} {
		if got := PushbackValue(c.resp); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
