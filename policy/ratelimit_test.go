package policy

import (
	"context"
	"strings"
	"testing"
	"time"
)

// nopStore is a SharedLimiter that is never asked: validation and defaults
// only look at whether Shared is set.
type nopStore struct{}

func (nopStore) Take(context.Context, string, int) (int, time.Duration, error) { return 0, 0, nil }

func TestRateLimitSharedDefaults(t *testing.T) {
	for _, tt := range []struct {
		perSecond float64
		lease     int
	}{{0.001, 1}, {1, 1}, {4, 1}, {5, 2}, {200.0 / 3, 17}, {1000, 250}, {1e12, 1 << 20}} {
		r := RateLimit{PerSecond: tt.perSecond, Burst: 1, Shared: nopStore{}}.WithDefaults()
		if r.Lease != tt.lease || r.LeaseTTL != time.Second || r.StoreTimeout != 50*time.Millisecond || r.FailOpen {
			t.Errorf("PerSecond %v: Lease %d, LeaseTTL %v, StoreTimeout %v, FailOpen %v; want %d, 1s, 50ms, false",
				tt.perSecond, r.Lease, r.LeaseTTL, r.StoreTimeout, r.FailOpen, tt.lease)
		}
	}
	set := RateLimit{PerSecond: 10, Shared: nopStore{}, Lease: 7, LeaseTTL: time.Minute, StoreTimeout: time.Second, FailOpen: true}
	if got := set.WithDefaults(); got.Lease != 7 || got.LeaseTTL != time.Minute || got.StoreTimeout != time.Second || !got.FailOpen {
		t.Errorf("explicit fields changed by WithDefaults: %+v", got)
	}
	// Without a store, the shared fields stay zero: nothing reads them.
	if got := (RateLimit{PerSecond: 10}).WithDefaults(); got.Lease != 0 || got.LeaseTTL != 0 || got.StoreTimeout != 0 {
		t.Errorf("a local RateLimit got shared defaults: %+v", got)
	}
}

// TestRateLimitSharedValidate: the fields of a shared rate limit are
// checked like any other, and setting one without a store is an error
// that names it, not a setting silently ignored.
func TestRateLimitSharedValidate(t *testing.T) {
	for _, tc := range []struct {
		r    RateLimit
		want []string // line prefixes, after "policy: "; none: valid
	}{
		{RateLimit{PerSecond: 10, Shared: nopStore{}}, nil},
		{RateLimit{PerSecond: 10, Shared: nopStore{}, Lease: 5, LeaseTTL: time.Minute, StoreTimeout: time.Second, FailOpen: true}, nil},
		{RateLimit{PerSecond: 10, Shared: nopStore{}, Lease: -1, LeaseTTL: -1, StoreTimeout: -1}, []string{
			"RateLimit.Lease must be >= 0, got -1",
			"RateLimit.LeaseTTL must be >= 0, got -1ns",
			"RateLimit.StoreTimeout must be >= 0, got -1ns",
		}},
		{RateLimit{PerSecond: 10, Lease: 5}, []string{"RateLimit.Lease is 5 but RateLimit.Shared is nil"}},
		{RateLimit{PerSecond: 10, LeaseTTL: time.Second}, []string{"RateLimit.LeaseTTL is 1s but RateLimit.Shared is nil"}},
		{RateLimit{PerSecond: 10, StoreTimeout: time.Second}, []string{"RateLimit.StoreTimeout is 1s but RateLimit.Shared is nil"}},
		{RateLimit{PerSecond: 10, FailOpen: true}, []string{"RateLimit.FailOpen is set but RateLimit.Shared is nil"}},
		{RateLimit{Shared: nopStore{}}, []string{"RateLimit.PerSecond must be > 0"}},
	} {
		err := (&Set{RateLimit: &tc.r}).Validate()
		if tc.want == nil {
			if err != nil {
				t.Errorf("%+v: Validate() = %v", tc.r, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%+v: Validate() = nil, want %q", tc.r, tc.want)
			continue
		}
		lines := strings.Split(err.Error(), "\n")
		for _, w := range tc.want {
			if n := countPrefixed(lines, "policy: "+w); n != 1 {
				t.Errorf("%+v: %d lines start with %q, want 1:\n%v", tc.r, n, "policy: "+w, err)
			}
		}
		if len(lines) != len(tc.want) {
			t.Errorf("%+v: %d lines, want %d:\n%v", tc.r, len(lines), len(tc.want), err)
		}
	}
}

func TestStoreStateNames(t *testing.T) {
	for _, tc := range []struct {
		s    StoreState
		want string
	}{{0, "store_state(0)"}, {StoreUp, "up"}, {StoreFallback, "fallback"}, {StoreRefusing, "refusing"}, {9, "store_state(9)"}} {
		if got := tc.s.String(); got != tc.want {
			t.Errorf("StoreState(%d) = %q, want %q", tc.s, got, tc.want)
		}
	}
}
