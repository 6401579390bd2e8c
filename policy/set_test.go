package policy

import (
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
)

func TestSetValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		set  Set
		want string
	}{
		{Set{Attempts: -1}, "policy: Attempts must be >= 0"},
		{Set{Attempts: 3}, "policy: Attempts is 3 but neither Retry nor Hedge is set"},
		{Set{Retry: &Retry{BaseDelay: -1}}, "policy: Retry.BaseDelay must be >= 0"},
		{Set{Retry: &Retry{BaseDelay: 10, MaxDelay: 5}}, "policy: Retry.MaxDelay"},
		{Set{Hedge: &Hedge{Quantile: 1}}, "policy: Hedge.Quantile must be in (0, 1)"},
		{Set{Hedge: &Hedge{Quantile: -0.5}}, "policy: Hedge.Quantile must be in (0, 1)"},
		{Set{Hedge: &Hedge{MaxConcurrent: 1}}, "policy: Hedge.MaxConcurrent must be >= 2"},
		{Set{Hedge: &Hedge{WinRate: &WinRate{Floor: 2}}}, "policy: Hedge.WinRate.Floor"},
		{Set{Timeout: &Timeout{PerAttempt: -1}}, "policy: Timeout.PerAttempt must be >= 0"},
		{Set{RateLimit: &RateLimit{}}, "policy: RateLimit.PerSecond must be > 0"},
		{Set{RateLimit: &RateLimit{PerSecond: math.NaN()}}, "policy: RateLimit.PerSecond must be > 0"},
		{Set{Bulkhead: &Bulkhead{}}, "policy: Bulkhead.MaxConcurrent must be > 0"},
		{Set{Breaker: &Breaker{FailureRatio: 1.5}}, "policy: Breaker.FailureRatio"},
		{Set{Budget: Budget{Max: 0.5}}, "policy: Budget.Max"},
		{Set{Budget: Budget{Ratio: math.Inf(1)}}, "policy: Budget.Ratio"},
		{Set{Throttler: &Throttler{K: 0.5}}, "policy: Throttler.K must be in [1, 1e9)"},
		{Set{Limiter: &Limiter{MinLimit: 10, MaxLimit: 5}}, "policy: Limiter.MinLimit"},
	} {
		err := tc.set.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
		}
	}
}

func TestZeroValuedPoliciesAreValid(t *testing.T) {
	s := Set{
		Retry: &Retry{}, Hedge: &Hedge{WinRate: &WinRate{}}, Throttler: &Throttler{}, Breaker: &Breaker{},
		Limiter: &Limiter{}, Timeout: &Timeout{},
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("zero-valued policies must be valid: %v", err)
	}
	if got := s.MaxAttempts(); got != 3 {
		t.Fatalf("MaxAttempts = %d, want 3 with Retry set", got)
	}
	if got := (&Set{}).MaxAttempts(); got != 1 {
		t.Fatalf("MaxAttempts = %d, want 1 without Retry or Hedge", got)
	}
}

func TestDefaultClassify(t *testing.T) {
	for code, want := range map[int]Outcome{
		200: Success, 204: Success, 301: Success, 400: Success, 404: Success, 409: Success,
		408: Failure, 429: Failure, 500: Failure, 501: Success, 502: Failure, 503: Failure, 504: Failure, 599: Failure,
	} {
		if got := DefaultClassify(&http.Response{StatusCode: code}, nil); got != want {
			t.Errorf("DefaultClassify(%d) = %v, want %v", code, got, want)
		}
	}
	if got := DefaultClassify(nil, errors.New("connection reset")); got != Failure {
		t.Errorf("DefaultClassify(error) = %v, want failure", got)
	}
}

func TestRejectedErrorMatchesBothSentinels(t *testing.T) {
	var err error = &RejectedError{Gate: GateBreaker, Err: ErrCircuitOpen, Key: "api:443", RetryAfter: 2e9}
	if !errors.Is(err, ErrRejected) || !errors.Is(err, ErrCircuitOpen) || errors.Is(err, ErrShed) {
		t.Fatalf("errors.Is mismatch for %v", err)
	}
	if got, want := err.Error(), `resilix: circuit open (key "api:443", priority critical, retry after 2s)`; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

// TestIsolatedMatchesCircuitOpen: an isolated key's refusal matches its own
// sentinel, the breaker's and ErrRejected, and no other gate's.
func TestIsolatedMatchesCircuitOpen(t *testing.T) {
	var err error = &RejectedError{Gate: GateBreaker, Err: ErrIsolated, Key: "api"}
	if !errors.Is(err, ErrRejected) || !errors.Is(err, ErrCircuitOpen) || !errors.Is(err, ErrIsolated) || errors.Is(err, ErrShed) {
		t.Fatalf("errors.Is mismatch for %v", err)
	}
	if errors.Is(ErrCircuitOpen, ErrIsolated) {
		t.Fatal("a plain open breaker matches ErrIsolated")
	}
	if got, want := err.Error(), `resilix: isolated (key "api", priority critical)`; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

// TestReplayBytes: ReplayBuffer's zero is the 64 KiB default and any
// negative value turns buffering off; every value is valid.
func TestReplayBytes(t *testing.T) {
	for _, tc := range []struct{ in, want int }{
		{0, 64 << 10},
		{-1, -1},
		{-1 << 40, -1},
		{1, 1},
		{1 << 20, 1 << 20},
	} {
		s := Set{ReplayBuffer: tc.in, Retry: &Retry{}}
		if got := s.ReplayBytes(); got != tc.want {
			t.Errorf("ReplayBuffer %d: ReplayBytes() = %d, want %d", tc.in, got, tc.want)
		}
		if err := s.Validate(); err != nil {
			t.Errorf("ReplayBuffer %d: %v", tc.in, err)
		}
	}
}
