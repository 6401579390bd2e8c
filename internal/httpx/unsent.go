package httpx

import (
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"strings"
)

// Unsent reports whether err, the error of one wire attempt, proves that
// the request never reached the server: sending it again cannot repeat
// anything the server did, whatever the method. It is true when some
// error in err's chain (followed through Unwrap) is one of:
//
//   - a failure to connect: a *net.OpError whose Op is "dial" (connection
//     refused, no route to host, a failed DNS lookup, a dial timeout), or
//     "proxyconnect", net/http's error for a proxy it could not reach;
//   - a failed TLS handshake: an alert that a server sends only to refuse
//     a handshake (handshake failure, protocol version, insufficient
//     security, no application protocol, unrecognized name, the
//     certificate alerts, ...), which in TLS 1.3 may arrive after the
//     request was written but before the server could decrypt a byte of
//     it; a server that answered the handshake with something that is not
//     TLS (a tls.RecordHeaderError with its Conn, which crypto/tls sets
//     for the first record only); an ECH rejection; a server certificate
//     the client did not trust (which Permanent reports too); net/http's
//     "TLS handshake timeout";
//   - over HTTP/2, a stream the server refused (RST_STREAM with
//     REFUSED_STREAM) or never processed (a GOAWAY whose last stream id is
//     below the stream's), and a connection that could take no stream at
//     all, in the words net/http's transport (and x/net/http2's) uses for
//     them, alone or inside its "cannot retry err [...] after
//     Request.Body was written" for a body without GetBody.
//
// Anything else is not proof, and Unsent is false: a reset or a timeout
// after the request was written, an EOF on a reused connection, a GOAWAY
// whose last stream id may cover the request, a TLS alert that a live
// connection may send. When in doubt, the answer is no.
//
// HTTP/2's errors carry no exported type in net/http, so they are told by
// their messages, matched whole (not as substrings of something else).
func Unsent(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if unsentOne(err) {
			return true
		}
	}
	return false
}

// Undialed reports whether err, the error of one wire attempt, is a
// failure to connect: some error in its chain is a *net.OpError whose Op
// is "dial" (connection refused, no route to host, a dial timeout).
// Nothing answered at the address: Unsent is true of it too.
func Undialed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// unsentOne reports whether err itself, not what it wraps, proves the
// request unsent.
func unsentOne(err error) bool {
	switch e := err.(type) {
	case *net.OpError:
		switch e.Op {
		case "dial", "proxyconnect":
			return true
		case "remote error":
			return e.Err != nil && handshakeAlert[e.Err.Error()]
		}
		return false
	case tls.RecordHeaderError:
		return e.Conn != nil
	case *tls.ECHRejectionError, *tls.CertificateVerificationError:
		return true
	}
	if Permanent(err) {
		return true // a certificate the client refused, in any form
	}
	return unsentMessage(err.Error())
}

// handshakeAlert holds the texts of the TLS alerts that only answer
// handshake messages (RFC 8446 §6.2, RFC 5246 §7.2.2): a server sends
// them to refuse a connection before it reads any application data.
// Alerts a live connection may send (bad record MAC, decode error,
// internal error, close notify, ...) are not among them. The texts are
// crypto/tls's own, read from tls.AlertError.
var handshakeAlert = func() map[string]bool {
	m := map[string]bool{}
	for _, a := range []tls.AlertError{
		40,  // handshake_failure
		42,  // bad_certificate
		43,  // unsupported_certificate
		44,  // certificate_revoked
		45,  // certificate_expired
		46,  // certificate_unknown
		48,  // unknown_ca
		49,  // access_denied
		70,  // protocol_version
		71,  // insufficient_security
		86,  // inappropriate_fallback
		109, // missing_extension
		110, // unsupported_extension
		112, // unrecognized_name
		116, // certificate_required
		120, // no_application_protocol
		121, // ech_required
	} {
		m[a.Error()] = true
	}
	return m
}()

// The messages of net/http's (and x/net/http2's) errors that prove a
// request unsent.
const (
	msgHandshakeTimeout = "net/http: TLS handshake timeout"
	msgGracefulGoAway   = "http2: Transport received Server's graceful shutdown GOAWAY"
	msgFirstGoAway      = "http2: Transport received GOAWAY from server ErrCode:"
	msgConnUnusable     = "http2: client conn not usable"
	msgConnNotReady     = "http2: client conn could not be established"
	msgStreamError      = "stream error: stream ID "
	msgRefused          = "REFUSED_STREAM"
	msgCannotRetry      = "http2: Transport: cannot retry err ["
	msgCannotRetryEnd   = "] after Request.Body was written; define Request.GetBody to avoid this error"
)

// unsentMessage reports whether msg is, whole, one of net/http's messages
// for a request that was never sent or never processed.
func unsentMessage(msg string) bool {
	switch {
	case msg == msgHandshakeTimeout, msg == msgGracefulGoAway,
		msg == msgConnUnusable, msg == msgConnNotReady:
		return true
	case strings.HasPrefix(msg, msgFirstGoAway):
		// GOAWAY with an error, above the connection's first stream,
		// which net/http does not retry itself.
		return true
	case strings.HasPrefix(msg, msgCannotRetry) && strings.HasSuffix(msg, msgCannotRetryEnd):
		inner := msg[len(msgCannotRetry) : len(msg)-len(msgCannotRetryEnd)]
		return inner != msg && unsentMessage(inner)
	}
	return refusedStream(msg)
}

// refusedStream reports whether msg is an HTTP/2 stream error with the
// code REFUSED_STREAM: "stream error: stream ID 3; REFUSED_STREAM", with
// an optional "; cause" after it.
func refusedStream(msg string) bool {
	rest, ok := strings.CutPrefix(msg, msgStreamError)
	if !ok {
		return false
	}
	id, rest, ok := strings.Cut(rest, "; ")
	if _, err := strconv.ParseUint(id, 10, 32); !ok || err != nil {
		return false
	}
	code, _, _ := strings.Cut(rest, "; ")
	return code == msgRefused
}
