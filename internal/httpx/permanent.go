package httpx

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
)

// Permanent reports whether a transport error will not go away by sending
// the request again: the server's certificate was not trusted (unknown
// authority, wrong host name, invalid). Such an error is still a Failure
// of the dependency, but retrying it only repeats the handshake.
func Permanent(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) ||
		errors.As(err, &hostname) || errors.As(err, &invalid)
}
