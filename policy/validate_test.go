package policy

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestValidateReportsEveryField: a set with a bad field in every policy,
// several in some, gets one error naming each of them, one per line; none
// hides another.
func TestValidateReportsEveryField(t *testing.T) {
	s := Set{
		Attempts: -1,
		Budget:   Budget{Ratio: math.NaN(), MinPerSecond: math.Inf(1), Max: 0.5},
		Retry:    &Retry{BaseDelay: -1, MaxDelay: -1},
		Hedge: &Hedge{
			Quantile: 2, MaxConcurrent: 1, MinSamples: -1, Window: -1, SuppressAt: 3,
			WinRate: &WinRate{Floor: 1, MinAllowance: 2, MinSamples: -1},
		},
		Throttler: &Throttler{K: 0.5, Window: -1, MaxRejection: 2},
		Breaker:   &Breaker{FailureRatio: 2, MinCalls: -1, Window: -1, OpenFor: -1, Probes: -1},
		Limiter:   &Limiter{InitialLimit: -1, MinLimit: -1, MaxLimit: -1, QueueFactor: math.NaN()},
		Bulkhead:  &Bulkhead{MaxConcurrent: 0, MaxWait: -1},
		RateLimit: &RateLimit{PerSecond: -1, Burst: -1, MaxWait: -1},
		Timeout:   &Timeout{PerAttempt: -1},
		Replicas:  &Replicas{Connections: 65, Refresh: -1, MaxEjected: 2, EjectFor: -1, MaxEjectFor: -1},
	}
	want := []string{
		"policy: Attempts must be >= 0",
		"policy: Budget.Ratio ",
		"policy: Budget.MinPerSecond ",
		"policy: Budget.Max ",
		"policy: Retry.BaseDelay must be >= 0",
		"policy: Retry.MaxDelay must be >= 0",
		"policy: Hedge.Quantile ",
		"policy: Hedge.MaxConcurrent must be >= 2",
		"policy: Hedge.MinSamples ",
		"policy: Hedge.Window ",
		"policy: Hedge.SuppressAt ",
		"policy: Hedge.WinRate.Floor ",
		"policy: Hedge.WinRate.MinAllowance ",
		"policy: Hedge.WinRate.MinSamples ",
		"policy: Throttler.K ",
		"policy: Throttler.Window ",
		"policy: Throttler.MaxRejection ",
		"policy: Breaker.FailureRatio ",
		"policy: Breaker.MinCalls ",
		"policy: Breaker.Window ",
		"policy: Breaker.OpenFor ",
		"policy: Breaker.Probes ",
		"policy: Limiter.InitialLimit ",
		"policy: Limiter.MinLimit ",
		"policy: Limiter.MaxLimit ",
		"policy: Limiter.QueueFactor ",
		"policy: Bulkhead.MaxConcurrent ",
		"policy: Bulkhead.MaxWait ",
		"policy: RateLimit.PerSecond ",
		"policy: RateLimit.Burst ",
		"policy: RateLimit.MaxWait ",
		"policy: Timeout.PerAttempt ",
		"policy: Replicas.Connections ",
		"policy: Replicas.Refresh ",
		"policy: Replicas.MaxEjected ",
		"policy: Replicas.EjectFor ",
		"policy: Replicas.MaxEjectFor ",
	}
	err := s.Validate()
	if err == nil {
		t.Fatal("Validate() = nil")
	}
	lines := strings.Split(err.Error(), "\n")
	for _, w := range want {
		if n := countPrefixed(lines, w); n != 1 {
			t.Errorf("%d lines start with %q, want 1", n, w)
		}
	}
	if len(lines) != len(want) {
		t.Errorf("%d lines, want %d (one per bad field):\n%v", len(lines), len(want), err)
	}
	// Flat: every line is one error of the join, so a caller can range
	// over them.
	if j, ok := err.(interface{ Unwrap() []error }); !ok || len(j.Unwrap()) != len(want) {
		t.Errorf("Validate() is not a flat join of %d errors: %#v", len(want), err)
	}
}

// TestValidateReportsEveryRuleOfAField: a value that breaks several
// rules is reported once per rule, and nothing is reported twice.
func TestValidateReportsEveryRuleOfAField(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  Set
		want []string
	}{
		{"retry delays", Set{Retry: &Retry{BaseDelay: -1, MaxDelay: -1}},
			[]string{"Retry.BaseDelay must be >= 0", "Retry.MaxDelay must be >= 0"}},
		{"limiter bounds", Set{Limiter: &Limiter{MinLimit: 10, MaxLimit: 5, QueueFactor: 200}},
			[]string{"Limiter.MinLimit (10) must be <= Limiter.MaxLimit (5)", "Limiter.QueueFactor"}},
		{"attempts and a policy", Set{Attempts: 2, Timeout: &Timeout{PerAttempt: -time.Second}},
			[]string{"Attempts is 2 but neither Retry nor Hedge is set", "Timeout.PerAttempt must be >= 0"}},
	} {
		err := tc.set.Validate()
		if err == nil {
			t.Errorf("%s: Validate() = nil, want %q", tc.name, tc.want)
			continue
		}
		lines := strings.Split(err.Error(), "\n")
		for _, w := range tc.want {
			if n := countPrefixed(lines, "policy: "+w); n != 1 {
				t.Errorf("%s: %d lines start with %q, want 1:\n%v", tc.name, n, "policy: "+w, err)
			}
		}
		if len(lines) != len(tc.want) {
			t.Errorf("%s: %d lines, want %d:\n%v", tc.name, len(lines), len(tc.want), err)
		}
	}
}

// TestValidateOneBadFieldIsOneError: a set with one bad field reports
// that one field alone, with no join around it to unwrap.
func TestValidateOneBadFieldIsOneError(t *testing.T) {
	err := (&Set{Hedge: &Hedge{Quantile: 1.5}}).Validate()
	if got, want := err.Error(), "policy: Hedge.Quantile must be in (0, 1), got 1.5"; got != want {
		t.Errorf("Validate() = %q, want %q", got, want)
	}
	var j interface{ Unwrap() []error }
	if errors.As(err, &j) && len(j.Unwrap()) != 1 {
		t.Errorf("Validate() joins %d errors, want 1", len(j.Unwrap()))
	}
}

func countPrefixed(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// TestRetryMaxDelayFollowsALargerBaseDelay: the default MaxDelay (5s)
// never caps an explicit BaseDelay above it, which would silently shorten
// the backoff the caller asked for; it follows BaseDelay instead. An
// explicit MaxDelay below BaseDelay is an error naming both.
func TestRetryMaxDelayFollowsALargerBaseDelay(t *testing.T) {
	for _, tc := range []struct {
		r        Retry
		maxDelay time.Duration
	}{
		{Retry{}, 5 * time.Second},
		{Retry{BaseDelay: time.Second}, 5 * time.Second},
		{Retry{BaseDelay: 5 * time.Second}, 5 * time.Second},
		{Retry{BaseDelay: 10 * time.Second}, 10 * time.Second},
		{Retry{BaseDelay: 10 * time.Second, MaxDelay: time.Minute}, time.Minute},
	} {
		if err := (&Set{Retry: &tc.r}).Validate(); err != nil {
			t.Errorf("%+v: Validate() = %v", tc.r, err)
		}
		r := tc.r.WithDefaults()
		if r.MaxDelay != tc.maxDelay {
			t.Errorf("%+v: MaxDelay = %v with defaults, want %v", tc.r, r.MaxDelay, tc.maxDelay)
		}
		if got, want := r.Backoff(0, 0.5), or(tc.r.BaseDelay, 50*time.Millisecond)/2; got != want {
			t.Errorf("%+v: first backoff at u=0.5 = %v, want half of BaseDelay, %v", tc.r, got, want)
		}
	}
	err := (&Set{Retry: &Retry{BaseDelay: 10 * time.Second, MaxDelay: 5 * time.Second}}).Validate()
	if want := "policy: Retry.MaxDelay (5s) must be >= Retry.BaseDelay (10s)"; err == nil || err.Error() != want {
		t.Errorf("Validate() = %v, want %q", err, want)
	}
}

// TestLimiterInitialLimitWithinItsBounds: the default InitialLimit (20)
// follows the bounds, documented; an explicit one outside them is an
// error naming the fields, not silently moved inside.
func TestLimiterInitialLimitWithinItsBounds(t *testing.T) {
	for _, tc := range []struct {
		l       Limiter
		initial int
	}{
		{Limiter{}, 20},
		{Limiter{MaxLimit: 5}, 5},
		{Limiter{MinLimit: 50}, 50},
		{Limiter{InitialLimit: 10, MinLimit: 10, MaxLimit: 10}, 10},
		{Limiter{InitialLimit: 1000}, 1000},
	} {
		if err := (&Set{Limiter: &tc.l}).Validate(); err != nil {
			t.Errorf("%+v: Validate() = %v", tc.l, err)
		}
		if got := tc.l.WithDefaults().InitialLimit; got != tc.initial {
			t.Errorf("%+v: InitialLimit = %d with defaults, want %d", tc.l, got, tc.initial)
		}
	}
	for _, tc := range []struct {
		l    Limiter
		want string
	}{
		{Limiter{InitialLimit: 5000}, "policy: Limiter.InitialLimit (5000) must be <= Limiter.MaxLimit (1000)"},
		{Limiter{InitialLimit: 50, MaxLimit: 10}, "policy: Limiter.InitialLimit (50) must be <= Limiter.MaxLimit (10)"},
		{Limiter{InitialLimit: 5, MinLimit: 10}, "policy: Limiter.InitialLimit (5) must be >= Limiter.MinLimit (10)"},
	} {
		err := (&Set{Limiter: &tc.l}).Validate()
		if err == nil || err.Error() != tc.want {
			t.Errorf("%+v: Validate() = %v, want %q", tc.l, err, tc.want)
		}
	}
}

// TestRateLimitBurstIsCountedExactly: the bucket counts tokens in a
// float64, exact up to 2^53; a Burst above that, explicit or the default
// ceil(PerSecond/10), is an error rather than a bucket that miscounts (or,
// past an int, a default that overflows to 1 on some platforms).
func TestRateLimitBurstIsCountedExactly(t *testing.T) {
	for _, r := range []RateLimit{
		{PerSecond: 1e17}, // default Burst 1e16, just above 2^53
		{PerSecond: 1e20}, // default Burst overflows an int
		{PerSecond: math.MaxFloat64},
	} {
		err := (&Set{RateLimit: &r}).Validate()
		if err == nil || !strings.HasPrefix(err.Error(), "policy: RateLimit.Burst ") {
			t.Errorf("%+v: Validate() = %v, want a RateLimit.Burst error", r, err)
		}
	}
	if strconv.IntSize == 64 {
		big := int64(1 << 53)
		if err := (&Set{RateLimit: &RateLimit{PerSecond: 10, Burst: int(big + 1)}}).Validate(); err == nil ||
			!strings.HasPrefix(err.Error(), "policy: RateLimit.Burst must be <= 2^53") {
			t.Errorf("Burst 2^53+1: Validate() = %v, want a RateLimit.Burst error", err)
		}
		if err := (&Set{RateLimit: &RateLimit{PerSecond: 10, Burst: int(big)}}).Validate(); err != nil {
			t.Errorf("Burst 2^53: Validate() = %v", err)
		}
	}
	for _, r := range []RateLimit{
		{PerSecond: 1e16}, // default Burst 1e15
		{PerSecond: 1e20, Burst: 100},
	} {
		if err := (&Set{RateLimit: &r}).Validate(); err != nil {
			t.Errorf("%+v: Validate() = %v", r, err)
		}
	}
}

// TestThrottlerKNamesItsRange: K's message states both bounds it enforces,
// so a K too large is not told it must be >= 1.
func TestThrottlerKNamesItsRange(t *testing.T) {
	for _, k := range []float64{0.5, 1e9, math.Inf(1), math.NaN()} {
		err := (&Set{Throttler: &Throttler{K: k}}).Validate()
		if want := fmt.Sprintf("policy: Throttler.K must be in [1, 1e9), got %v", k); err == nil || err.Error() != want {
			t.Errorf("K %v: Validate() = %v, want %q", k, err, want)
		}
	}
	for _, k := range []float64{1, 2, 1e9 - 1} {
		if err := (&Set{Throttler: &Throttler{K: k}}).Validate(); err != nil {
			t.Errorf("K %v: Validate() = %v", k, err)
		}
	}
}

// TestSetCombinationsThatCannotDoWhatTheySay: Attempts counts the first
// call, so with Attempts 1 a Retry never retries and a Hedge never hedges;
// and a call never has more legs in flight than its Attempts, so a
// MaxConcurrent above them is never reached. Each is an error naming the
// fields; a zero Attempts is 3 when Retry or Hedge is set.
func TestSetCombinationsThatCannotDoWhatTheySay(t *testing.T) {
	for _, tc := range []struct {
		set  Set
		want string // "" for valid
	}{
		{Set{Attempts: 1, Retry: &Retry{}},
			"policy: Attempts is 1 but Retry is set: Attempts counts the first call, so none would ever be retried"},
		{Set{Attempts: 1, Hedge: &Hedge{}},
			"policy: Attempts is 1 but Hedge is set: Attempts counts the first call, so none would ever be hedged"},
		{Set{Attempts: 1, Retry: &Retry{}, Hedge: &Hedge{}},
			"policy: Attempts is 1 but Retry and Hedge are set: Attempts counts the first call, so none would ever be retried or hedged"},
		{Set{Attempts: 1}, ""},
		{Set{Attempts: 2, Retry: &Retry{}}, ""},
		{Set{Hedge: &Hedge{MaxConcurrent: 4}},
			"policy: Hedge.MaxConcurrent (4) must be <= Attempts (3, the default with Retry or Hedge set): a call never has more legs than Attempts"},
		{Set{Attempts: 2, Hedge: &Hedge{MaxConcurrent: 3}},
			"policy: Hedge.MaxConcurrent (3) must be <= Attempts (2): a call never has more legs than Attempts"},
		{Set{Hedge: &Hedge{MaxConcurrent: 3}}, ""},
		{Set{Attempts: 2, Hedge: &Hedge{}}, ""}, // the default MaxConcurrent (3) is bounded by Attempts
		{Set{Attempts: 5, Hedge: &Hedge{MaxConcurrent: 5}}, ""},
	} {
		err := tc.set.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: Validate() = %v, want nil", tc.set, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%+v: Validate() = %v, want %q", tc.set, err, tc.want)
		}
	}
}
