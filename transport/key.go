package transport

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// hostKey is the default Key: the request's canonical authority.
func hostKey(r *http.Request) string { return canonicalKey(r.URL.Scheme, r.URL.Host) }

// canonicalKey returns the key of a request to authority (a URL.Host,
// host[:port]) under scheme: the authority with its host in lower case
// (ASCII letters, up to an IPv6 zone, which is kept as is) and without a
// trailing dot, and its port without leading zeros, dropped when empty or
// the scheme's default (80 for http and ws, 443 for https and wss). An IPv6
// literal keeps its brackets, and gains them if it has none.
//
// It is on every call's path, so it cuts the key from authority when it
// can, and allocates only to change case, to keep a port after a trailing
// dot, or for a port with leading zeros.
func canonicalKey(scheme, authority string) string {
	host, port, hasPort := splitAuthority(authority)
	if hasPort {
		if port = trimZeros(port); port == "" || port == defaultPort(scheme) {
			hasPort = false
		}
	}
	bracket := false
	switch {
	case strings.HasPrefix(host, "["):
	case strings.IndexByte(host, ':') >= 0:
		bracket = true // an IPv6 literal without its brackets
	default:
		host = strings.TrimRight(host, ".")
	}
	host = lowerASCII(host)
	switch {
	case bracket:
	case !hasPort:
		return host // authority's prefix, or its lowered copy
	case len(authority) == len(host)+1+len(port) && strings.HasPrefix(authority, host):
		return authority // nothing to change
	}
	var b strings.Builder
	b.Grow(len(host) + len(port) + 3)
	if bracket {
		b.WriteByte('[')
	}
	b.WriteString(host)
	if bracket {
		b.WriteByte(']')
	}
	if hasPort {
		b.WriteByte(':')
		b.WriteString(port)
	}
	return b.String()
}

// errNotHost is the error of a PerKey entry that names no host.
var errNotHost = errors.New("not a host[:port]")

// perKeyName returns the key a PerKey entry names under the default Key.
// An entry is a host, an IPv4 address or an IPv6 one (with or without
// brackets), with an optional port, written as a URL's authority is; it
// is canonicalized as a request's authority is, except that having no
// scheme, both 80 and 443 are dropped. So "API.example.com.:443" names
// "api.example.com", and so does "api.example.com:80". An IPv6 zone is
// written as keys show it, "[fe80::1%en0]", not escaped.
func perKeyName(k string) (string, error) {
	a := k
	switch {
	case strings.HasPrefix(a, "["):
		host, port, _ := splitAuthority(a)
		if !strings.HasSuffix(host, "]") || !isIPv6(host[1:len(host)-1]) || !isPort(port) {
			return "", errNotHost
		}
	case strings.Count(a, ":") > 1:
		if !isIPv6(a) {
			return "", errNotHost
		}
		a = "[" + a + "]"
	default:
		// url.Parse knows which bytes a host may hold; the authority is
		// all it may find.
		u, err := url.Parse("//" + a)
		if err != nil || strings.ContainsAny(a, "/?#@") || u.Host != a {
			return "", errNotHost
		}
	}
	host, port, hasPort := splitAuthority(a)
	if hasPort && port != "" {
		n, err := strconv.ParseUint(port, 10, 64)
		switch {
		case err != nil:
			return "", errNotHost
		case n == 0 || n > 65535:
			return "", fmt.Errorf("%w: port out of range", errNotHost)
		case n == 80 || n == 443:
			a = host
		}
	}
	key := canonicalKey("", a)
	if h, _, _ := splitAuthority(key); h == "" || h == "[]" {
		return "", errNotHost
	}
	return key, nil
}

// isIPv6 reports whether s is an IPv6 address, with an optional zone.
func isIPv6(s string) bool {
	ip, err := netip.ParseAddr(s)
	return err == nil && ip.Is6()
}

// isPort reports whether s is empty or digits, as a URL's port is.
func isPort(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// splitAuthority splits host[:port]. A bracketed IPv6 host keeps its
// brackets; an unbracketed one (more than one colon) has no port.
func splitAuthority(a string) (host, port string, hasPort bool) {
	if strings.HasPrefix(a, "[") {
		i := strings.LastIndexByte(a, ']')
		if i >= 0 && strings.HasPrefix(a[i+1:], ":") {
			return a[:i+1], a[i+2:], true
		}
		return a, "", false
	}
	i := strings.IndexByte(a, ':')
	if i < 0 || strings.IndexByte(a[i+1:], ':') >= 0 {
		return a, "", false
	}
	return a[:i], a[i+1:], true
}

// trimZeros returns a port's digits without leading zeros.
func trimZeros(port string) string {
	if t := strings.TrimLeft(port, "0"); t != "" || port == "" {
		return t
	}
	return "0"
}

// defaultPort returns the port a scheme implies, or "".
func defaultPort(scheme string) string {
	switch {
	case strings.EqualFold(scheme, "http"), strings.EqualFold(scheme, "ws"):
		return "80"
	case strings.EqualFold(scheme, "https"), strings.EqualFold(scheme, "wss"):
		return "443"
	}
	return ""
}

// lowerASCII returns s with its ASCII upper case letters lowered, up to a
// '%' (an IPv6 zone, whose case is the interface's), or s itself when
// there are none.
func lowerASCII(s string) string {
	end := strings.IndexByte(s, '%')
	if end < 0 {
		end = len(s)
	}
	for i := 0; i < end; i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < end; j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
