package policy

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestBackoff steps Backoff over the retries already made and the draw:
// u·min(MaxDelay, BaseDelay·2ⁿ), n = 0 before the first retry, exact to the
// nanosecond.
func TestBackoff(t *testing.T) {
	const (
		ms  = time.Millisecond
		big = math.MaxInt // retries: no overflow, no long loop
	)
	for _, tc := range []struct {
		base, max time.Duration
		retries   int
		u         float64
		want      time.Duration
	}{
		// Before the first retry the ceiling is BaseDelay.
		{100 * ms, time.Second, 0, 0, 0},
		{100 * ms, time.Second, 0, 0.5, 50 * ms},
		{100 * ms, time.Second, 0, 0.999, 99900 * time.Microsecond},
		// Then it doubles with each retry made.
		{100 * ms, time.Second, 1, 0, 0},
		{100 * ms, time.Second, 1, 0.5, 100 * ms},
		{100 * ms, time.Second, 1, 0.999, 199800 * time.Microsecond},
		{100 * ms, time.Second, 2, 0.5, 200 * ms},
		{100 * ms, time.Second, 2, 0.999, 399600 * time.Microsecond},
		{100 * ms, time.Second, 3, 0, 0},
		{100 * ms, time.Second, 3, 0.5, 400 * ms},
		{100 * ms, time.Second, 3, 0.999, 799200 * time.Microsecond},
		// Until MaxDelay caps it: 1.6s would be next.
		{100 * ms, time.Second, 4, 0.5, 500 * ms},
		{100 * ms, time.Second, 4, 0.999, 999 * ms},
		{100 * ms, time.Second, 60, 0.5, 500 * ms},
		{100 * ms, time.Second, big, 0, 0},
		{100 * ms, time.Second, big, 0.5, 500 * ms},
		{100 * ms, time.Second, big, 0.999, 999 * ms},
		// A negative count is taken as 0.
		{100 * ms, time.Second, -1, 0.5, 50 * ms},
		{100 * ms, time.Second, -big, 0.999, 99900 * time.Microsecond},
		// The defaults: 50ms, then 100ms, 200ms, 400ms, ..., at most 5s.
		{0, 0, 0, 0.5, 25 * ms},
		{0, 0, 1, 0.999, 99900 * time.Microsecond},
		{0, 0, 3, 0.5, 200 * ms},
		{0, 0, 7, 0.5, 2500 * ms}, // 6.4s capped
		{0, 0, big, 0.999, 4995 * ms},
		// MaxDelay not a power-of-two multiple of BaseDelay: 120ms capped.
		{30 * ms, 100 * ms, 1, 0.5, 30 * ms},
		{30 * ms, 100 * ms, 2, 0.5, 50 * ms},
		{30 * ms, 100 * ms, 3, 0.999, 99900 * time.Microsecond},
		// BaseDelay = MaxDelay: no growth at all.
		{time.Second, time.Second, 0, 0.5, 500 * ms},
		{time.Second, time.Second, 5, 0.5, 500 * ms},
		// A MaxDelay near the largest Duration: the doubling stops there
		// instead of overflowing.
		{1, math.MaxInt64, 62, 0.5, 1 << 61},
		{1, math.MaxInt64, 63, 0.5, 1 << 62},
		{1, math.MaxInt64, big, 0.5, 1 << 62},
		{math.MaxInt64/2 + 1, math.MaxInt64, 1, 0.5, 1 << 62},
	} {
		r := Retry{BaseDelay: tc.base, MaxDelay: tc.max}.WithDefaults()
		if got := r.Backoff(tc.retries, tc.u); got != tc.want {
			t.Errorf("Retry{BaseDelay: %v, MaxDelay: %v}.Backoff(%d, %v) = %v (%d), want %v (%d)",
				tc.base, tc.max, tc.retries, tc.u, got, int64(got), tc.want, int64(tc.want))
		}
	}
}

func TestBackoffCeilings(t *testing.T) {
	r := Retry{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}.WithDefaults()
	for _, tc := range []struct {
		n    int // retries already made
		ceil time.Duration
	}{
		{0, 100 * time.Millisecond},
		{1, 200 * time.Millisecond},
		{2, 400 * time.Millisecond},
		{3, 800 * time.Millisecond},
		{4, time.Second},
		{60, time.Second}, // no overflow however many retries
	} {
		if got := r.Backoff(tc.n, 0.999999999); got > tc.ceil || got < tc.ceil*99/100 {
			t.Errorf("Backoff(%d, ~1) = %v, want just under %v", tc.n, got, tc.ceil)
		}
		if got := r.Backoff(tc.n, 0); got != 0 {
			t.Errorf("Backoff(%d, 0) = %v, want 0 (full jitter)", tc.n, got)
		}
	}
}

func TestBackoffFullJitterIsUniform(t *testing.T) {
	r := Retry{}.WithDefaults()
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 20000
	ceil := r.BaseDelay * 4 // the third retry, two made
	var sum time.Duration
	for range n {
		d := r.Backoff(2, rng.Float64())
		if d < 0 || d >= ceil {
			t.Fatalf("Backoff = %v outside [0, %v)", d, ceil)
		}
		sum += d
	}
	mean := sum / n
	if mean < ceil*45/100 || mean > ceil*55/100 {
		t.Fatalf("mean backoff %v, want about %v", mean, ceil/2)
	}
}

func TestRetryDefaults(t *testing.T) {
	r := Retry{}.WithDefaults()
	if r.BaseDelay != 50*time.Millisecond || r.MaxDelay != 5*time.Second || r.MaxRetryAfter != 10*time.Second {
		t.Fatalf("defaults = %+v", r)
	}
	if got := (Retry{MaxRetryAfter: -1}).WithDefaults().MaxRetryAfter; got >= 0 {
		t.Fatalf("negative MaxRetryAfter must stay negative (off), got %v", got)
	}
}

// TestRetryDelayReplacesTheBackoffFields: Delay replaces the backoff that
// BaseDelay and MaxDelay shape, so setting them beside it is an error
// rather than a setting silently ignored; MaxRetryAfter still applies.
func TestRetryDelayReplacesTheBackoffFields(t *testing.T) {
	delay := func(int) time.Duration { return time.Second }
	for _, tc := range []struct {
		r    Retry
		want []string
	}{
		{Retry{Delay: delay}, nil},
		{Retry{Delay: delay, MaxRetryAfter: time.Minute}, nil},
		{Retry{Delay: delay, BaseDelay: time.Second},
			[]string{"policy: Retry.BaseDelay is set, but Retry.Delay replaces the backoff it shapes"}},
		{Retry{Delay: delay, BaseDelay: time.Second, MaxDelay: time.Minute}, []string{
			"policy: Retry.BaseDelay is set, but Retry.Delay replaces the backoff it shapes",
			"policy: Retry.MaxDelay is set, but Retry.Delay replaces the backoff it shapes",
		}},
	} {
		err := (&Set{Retry: &tc.r}).Validate()
		var got []string
		if err != nil {
			got = strings.Split(err.Error(), "\n")
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("Validate(%+v) = %q, want %q", tc.r, got, tc.want)
		}
	}
}
