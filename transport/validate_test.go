package transport

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/resilix/resilix/policy"
)

// TestNewReportsEveryInvalidField: a Config with bad fields of its own, in
// its default set and in several PerKey entries, some of them with bad
// names too, gets one error with one line per problem, each saying where
// it is; none hides another.
func TestNewReportsEveryInvalidField(t *testing.T) {
	cfg := Config{
		MaxKeys:        -1,
		PriorityHeader: "Bad Header",
		TenantHeader:   "x:y",
		Policies: policy.Set{
			Attempts:  -2,
			Hedge:     &policy.Hedge{Quantile: 1.5},
			RateLimit: &policy.RateLimit{},
		},
		PerKey: map[string]policy.Set{
			"ok.test":   {},
			"b:80":      {Timeout: &policy.Timeout{PerAttempt: -1}, Bulkhead: &policy.Bulkhead{}},
			"":          {Retry: &policy.Retry{BaseDelay: -1}},
			"https://c": {},
			"H":         {},
			"h.":        {Breaker: &policy.Breaker{Probes: -1}},
		},
	}
	want := []string{
		"transport: MaxKeys must be >= 0, got -1",
		`transport: PriorityHeader "Bad Header" is not a valid header name`,
		`transport: TenantHeader "x:y" is not a valid header name`,
		"transport: Policies: policy: Attempts must be >= 0, got -2",
		"transport: Policies: policy: Hedge.Quantile must be in (0, 1), got 1.5",
		"transport: Policies: policy: RateLimit.PerSecond must be > 0, got 0",
		`transport: PerKey["b:80"]: policy: Timeout.PerAttempt must be >= 0`,
		`transport: PerKey["b:80"]: policy: Bulkhead.MaxConcurrent must be > 0`,
		`transport: PerKey[""]: not a host[:port]`,
		`transport: PerKey[""]: policy: Retry.BaseDelay must be >= 0`,
		`transport: PerKey["https://c"]: not a host[:port]`,
		`transport: PerKey["H"] and PerKey["h."] are both the key "h"`,
		`transport: PerKey["h."]: policy: Breaker.Probes must be >= 0`,
	}
	tr, err := New(cfg)
	if tr != nil || err == nil {
		t.Fatalf("New = %v, %v; want nil and an error", tr, err)
	}
	lines := strings.Split(err.Error(), "\n")
	for _, w := range want {
		n := 0
		for _, l := range lines {
			if strings.HasPrefix(l, w) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d lines start with %s, want 1", n, w)
		}
	}
	if len(lines) != len(want) {
		t.Errorf("%d lines, want %d (one per problem):\n%v", len(lines), len(want), err)
	}
	if !errors.Is(err, errNotHost) {
		t.Errorf("errors.Is(err, errNotHost) = false for\n%v", err)
	}
	if j, ok := err.(interface{ Unwrap() []error }); !ok || len(j.Unwrap()) != len(want) {
		t.Errorf("New's error is not a flat join of %d errors: %#v", len(want), err)
	}
}

// TestPerKeyEmptyKey: under the default Key an empty PerKey entry names no
// host, and New says so; a Key func may return "", so with one it is a key
// like any other.
func TestPerKeyEmptyKey(t *testing.T) {
	_, err := New(Config{PerKey: map[string]policy.Set{"": {}}})
	if err == nil || err.Error() != `transport: PerKey[""]: not a host[:port]` || !errors.Is(err, errNotHost) {
		t.Errorf("default Key: New error = %v, want PerKey[\"\"]: not a host[:port]", err)
	}
	key := func(r *http.Request) string { return r.Header.Get("Service") }
	if _, err := New(Config{Key: key, PerKey: map[string]policy.Set{"": {}}}); err != nil {
		t.Errorf("with a Key func: New error = %v, want nil", err)
	}
}

// nilTripper is a RoundTripper of a pointer type, whose nil a Config may
// hold.
type nilTripper struct{ http.Transport }

// TestNewRefusesATypedNilBase: a Base that is a nil pointer or func in a
// non-nil interface (an unset *http.Transport variable) is New's error,
// naming the field and the type, not net/http's panic on the first call;
// an untyped nil is the default.
func TestNewRefusesATypedNilBase(t *testing.T) {
	var ht *http.Transport
	var own *nilTripper
	var fn fakeRT
	for _, tc := range []struct {
		base http.RoundTripper
		want string
	}{
		{ht, "transport: Base is a nil *http.Transport"},
		{own, "transport: Base is a nil *transport.nilTripper"},
		{fn, "transport: Base is a nil transport.fakeRT"},
	} {
		for _, set := range []policy.Set{{}, {Replicas: &policy.Replicas{}}} {
			rt, err := New(Config{Base: tc.base, Policies: set})
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("New(Base: %T(nil), Replicas %v) = %v, %v; want %q", tc.base, set.Replicas != nil, rt, err, tc.want)
			}
		}
	}
	if _, err := New(Config{Base: nil}); err != nil {
		t.Errorf("an untyped nil Base: %v", err)
	}
}
