package policy

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestBackoffCeilings(t *testing.T) {
	r := Retry{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}.WithDefaults()
	for _, tc := range []struct {
		n    int
		ceil time.Duration
	}{
		{1, 100 * time.Millisecond},
		{2, 200 * time.Millisecond},
		{3, 400 * time.Millisecond},
		{4, 800 * time.Millisecond},
		{5, time.Second},
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
	ceil := r.BaseDelay * 4 // third retry
	var sum time.Duration
	for range n {
		d := r.Backoff(3, rng.Float64())
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
