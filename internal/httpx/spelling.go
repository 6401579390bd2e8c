package httpx

import (
	"net/http"
	"strings"
)

// A Header built in-process may hold a name under any spelling: Set and
// Get canonicalize, an index expression (h["resilix-tenant"]) does not.
// net/http's transport writes each spelling as it is, and a server reads
// them all as one header, canonical. So whoever reads or removes one of
// resilix's headers treats every spelling of its name as the header.

// First returns the first value of the header name, in canonical form,
// under any spelling in h, and whether one has a value: the canonical
// spelling's first, else that of the other spelling first in byte order
// (the order net/http's HTTP/1 transport writes them in). It allocates
// nothing; h is looked at whole only when name is absent.
func First(h http.Header, name string) (string, bool) {
	if vs := h[name]; len(vs) > 0 {
		return vs[0], true
	}
	var best string
	found := false
	for k, vs := range h {
		if len(vs) > 0 && Spells(k, name) && (!found || k < best) {
			best, found = k, true
		}
	}
	if !found {
		return "", false
	}
	return h[best][0], true
}

// Has reports whether h holds the header name, in canonical form, with a
// value under any spelling.
func Has(h http.Header, name string) bool {
	_, ok := First(h, name)
	return ok
}

// Spells reports whether the key k is the header name, in canonical form,
// spelled otherwise.
func Spells(k, name string) bool {
	return len(k) == len(name) && k != name && strings.EqualFold(k, name)
}
