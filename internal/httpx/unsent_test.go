package httpx

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"
)

// Errors built as net/http and crypto/tls build them, for the cases a
// loopback test cannot produce on demand. The HTTP/2 ones are produced for
// real by the transport's HTTP/2 loopback tests.
var (
	refused   = &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	noRoute   = &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.EHOSTUNREACH}}
	noHost    = &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "nowhere.test", IsNotFound: true}}
	viaProxy  = &net.OpError{Op: "proxyconnect", Net: "tcp", Err: refused}
	readReset = &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}
	writeRST  = &net.OpError{Op: "write", Net: "tcp", Err: &os.SyscallError{Syscall: "write", Err: syscall.EPIPE}}
	alertOf   = func(a tls.AlertError) error { return &net.OpError{Op: "remote error", Err: a} }
)

// streamError has the shape of net/http's HTTP/2 StreamError (and
// x/net/http2's), whose message the transports produce.
type streamError struct {
	id    uint32
	code  string
	cause string
}

func (e streamError) Error() string {
	if e.cause != "" {
		return fmt.Sprintf("stream error: stream ID %d; %s; %s", e.id, e.code, e.cause)
	}
	return fmt.Sprintf("stream error: stream ID %d; %s", e.id, e.code)
}

// cannotRetry is net/http's error for an HTTP/2 stream it would have
// retried itself had the request's body had a GetBody.
func cannotRetry(err error) error {
	return fmt.Errorf("http2: Transport: cannot retry err [%v] after Request.Body was written; define Request.GetBody to avoid this error", err)
}

func TestUnsent(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"no route to host", noRoute, true},
		{"no such host", noHost, true},
		{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, true},
		{"proxy unreachable", viaProxy, true},
		{"wrapped dial error", fmt.Errorf("my base: %w", refused), true},
		{"handshake failure alert", alertOf(40), true},
		{"protocol version alert", alertOf(70), true},
		{"certificate required alert", alertOf(116), true},
		{"unknown CA alert", alertOf(48), true},
		{"server is not TLS", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake", Conn: &net.TCPConn{}}, true},
		{"untrusted certificate", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, true},
		{"ECH rejected", &tls.ECHRejectionError{}, true},
		{"TLS handshake timeout", handshakeTimeout{}, true},
		{"refused stream", streamError{1, "REFUSED_STREAM", "received from peer"}, true},
		{"refused stream, no cause", streamError{7, "REFUSED_STREAM", ""}, true},
		{"refused stream, body without GetBody", cannotRetry(streamError{3, "REFUSED_STREAM", "received from peer"}), true},
		{"graceful GOAWAY above the stream", errors.New("http2: Transport received Server's graceful shutdown GOAWAY"), true},
		{"GOAWAY above the stream, body without GetBody", cannotRetry(errors.New("http2: Transport received Server's graceful shutdown GOAWAY")), true},
		{"GOAWAY above the first stream", errors.New("http2: Transport received GOAWAY from server ErrCode:ENHANCE_YOUR_CALM"), true},
		{"conn not usable", errors.New("http2: client conn not usable"), true},
		{"conn not established", errors.New("http2: client conn could not be established"), true},

		{"nil", nil, false},
		{"reset after writing", readReset, false},
		{"broken pipe while writing", writeRST, false},
		{"EOF on a reused connection", io.EOF, false},
		{"unexpected EOF", io.ErrUnexpectedEOF, false},
		{"server closed idle connection", errors.New("http: server closed idle connection"), false},
		{"timeout after writing", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, false},
		{"response header timeout", errors.New("net/http: timeout awaiting response headers"), false},
		{"caller's deadline", context.DeadlineExceeded, false},
		{"caller's cancellation", context.Canceled, false},
		{"bad record MAC alert", alertOf(20), false},
		{"decode error alert", alertOf(50), false},
		{"close notify alert", alertOf(0), false},
		{"record header error after the handshake", tls.RecordHeaderError{Msg: "oversized record received with length 20000"}, false},
		{"cannot rewind after connection loss", errors.New("net/http: cannot rewind body after connection loss"), false},
		{"stream reset by the server", streamError{1, "INTERNAL_ERROR", "received from peer"}, false},
		{"stream cancelled", streamError{1, "CANCEL", ""}, false},
		{"protocol error from peer", cannotRetry(streamError{1, "PROTOCOL_ERROR", "received from peer"}), false},
		{"GOAWAY, stream maybe processed", errors.New(`http2: server sent GOAWAY and closed the connection; LastStreamID=5, ErrCode=NO_ERROR, debug=""`), false},
		{"a message merely containing the words", errors.New("upstream said: stream error: stream ID 1; REFUSED_STREAM"), false},
		{"a slow timeout not from the handshake", timeoutErr("net/http: TLS handshake timeout, or so"), false},
	} {
		if got := Unsent(tc.err); got != tc.want {
			t.Errorf("%s: Unsent(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// handshakeTimeout is net/http's error for a TLS handshake that ran out of
// time.
type handshakeTimeout struct{}

func (handshakeTimeout) Error() string   { return "net/http: TLS handshake timeout" }
func (handshakeTimeout) Timeout() bool   { return true }
func (handshakeTimeout) Temporary() bool { return true }

type timeoutErr string

func (e timeoutErr) Error() string { return string(e) }
func (timeoutErr) Timeout() bool   { return true }

// realError returns the error net/http's transport gives for a GET of
// url, or fails the test when there is none. Every such error is one of
// the network's (a refused dial, a handshake, a reset, a timeout), never
// the request's own, so it also fails the test when Invalid says it is.
func realError(t *testing.T, rt *http.Transport, url string) error {
	t.Helper()
	defer rt.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	resp, err := rt.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("GET %s succeeded", url)
	}
	if Invalid(err) {
		t.Fatalf("Invalid(%v) = true for a network error", err)
	}
	return err
}

// closedPort returns the URL of a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr + "/"
}

// TestUnsentOnLoopback: the errors net/http itself returns, over real
// sockets, for what never reached the server and for what did.
func TestUnsentOnLoopback(t *testing.T) {
	quiet := log.New(io.Discard, "", 0)
	t.Run("connection refused", func(t *testing.T) {
		err := realError(t, &http.Transport{}, closedPort(t))
		if !Unsent(err) {
			t.Fatalf("Unsent(%v) = false", err)
		}
	})
	t.Run("server refuses the TLS version", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(http.NotFoundHandler())
		srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13}
		srv.Config.ErrorLog = quiet
		srv.StartTLS()
		defer srv.Close()
		rt := srv.Client().Transport.(*http.Transport).Clone()
		rt.TLSClientConfig.MaxVersion = tls.VersionTLS12
		err := realError(t, rt, srv.URL)
		if !Unsent(err) || Permanent(err) {
			t.Fatalf("Unsent(%v) = %v, Permanent = %v; want an unsent error that is not permanent", err, Unsent(err), Permanent(err))
		}
	})
	t.Run("server does not speak TLS", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Config.ErrorLog = quiet
		defer srv.Close()
		err := realError(t, &http.Transport{}, "https://"+srv.Listener.Addr().String()+"/")
		if !Unsent(err) {
			t.Fatalf("Unsent(%v) = false", err)
		}
	})
	t.Run("untrusted certificate", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(http.NotFoundHandler())
		srv.Config.ErrorLog = quiet
		srv.StartTLS()
		defer srv.Close()
		err := realError(t, &http.Transport{}, srv.URL)
		if !Unsent(err) || !Permanent(err) {
			t.Fatalf("Unsent(%v) = %v, Permanent = %v; want both", err, Unsent(err), Permanent(err))
		}
	})
	t.Run("reset after the request was read", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			conn.(*net.TCPConn).SetLinger(0) // a reset, not a clean close
			conn.Close()
		}))
		srv.Config.ErrorLog = quiet
		defer srv.Close()
		err := realError(t, &http.Transport{}, srv.URL)
		if Unsent(err) {
			t.Fatalf("Unsent(%v) = true for a request the server read", err)
		}
	})
	t.Run("no answer after the request was read", func(t *testing.T) {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		defer srv.Close()
		defer close(release)
		err := realError(t, &http.Transport{ResponseHeaderTimeout: 50 * time.Millisecond}, srv.URL)
		if Unsent(err) {
			t.Fatalf("Unsent(%v) = true for a request the server read", err)
		}
	})
	t.Run("parsed URL error wrapping a dial error", func(t *testing.T) {
		// http.Client wraps the transport's error in a *url.Error.
		err := &url.Error{Op: "Get", URL: "http://x.test/", Err: refused}
		if !Unsent(err) {
			t.Fatalf("Unsent(%v) = false", err)
		}
	})
}
