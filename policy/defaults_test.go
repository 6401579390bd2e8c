package policy

import (
	"errors"
	"io"
	"math"
	"net/http"
	"testing"
	"time"
)

func TestThrottlerDefaults(t *testing.T) {
	d := Throttler{}.WithDefaults()
	if d.K != 3 || d.Window != time.Second || d.MinRequests != 5 || d.MaxRejection != 0.8 {
		t.Errorf("defaults: K %v, Window %v, MinRequests %v, MaxRejection %v; want 3, 1s, 5, 0.8",
			d.K, d.Window, d.MinRequests, d.MaxRejection)
	}
	if got := (Throttler{MinRequests: -1}).WithDefaults().MinRequests; got >= 0 {
		t.Errorf("a negative MinRequests must stay negative (no floor), got %d", got)
	}
}

func TestThrottlerValidate(t *testing.T) {
	for _, tt := range []struct {
		cfg Throttler
		ok  bool
	}{
		{Throttler{}, true},
		{Throttler{K: 1.5, Window: time.Minute}, true},
		{Throttler{K: 0.5}, false},
		{Throttler{K: math.NaN()}, false},
		{Throttler{Window: -1}, false},
		{Throttler{MinRequests: 5}, true},
		{Throttler{MinRequests: -1}, true}, // no floor
		{Throttler{MaxRejection: 0.5}, true},
		{Throttler{MaxRejection: 1}, true}, // no ceiling
		{Throttler{MaxRejection: 1.5}, false},
		{Throttler{MaxRejection: -0.5}, false},
		{Throttler{MaxRejection: math.NaN()}, false},
	} {
		if err := tt.cfg.validate(); (err == nil) != tt.ok {
			t.Errorf("%+v: validate() = %v", tt.cfg, err)
		}
	}
	err := (&Throttler{MaxRejection: 1.5}).validate()
	if want := "policy: Throttler.MaxRejection must be in (0, 1], got 1.5"; err == nil || err.Error() != want {
		t.Errorf("validate() = %v, want %q", err, want)
	}
}

func TestDefaultAccepted(t *testing.T) {
	tests := []struct {
		status int
		err    error
		want   bool
	}{
		{200, nil, true},
		{204, nil, true},
		{304, nil, true},
		{400, nil, true},
		{404, nil, true},
		{408, nil, true},
		{429, nil, false},
		{500, nil, true},
		{501, nil, true},
		{502, nil, false},
		{503, nil, false},
		{504, nil, false},
		{0, errors.New("connection refused"), false},
		{0, io.ErrUnexpectedEOF, false},
	}
	for _, tt := range tests {
		var resp *http.Response
		if tt.err == nil {
			resp = &http.Response{StatusCode: tt.status}
		}
		if got := DefaultAccepted(resp, tt.err); got != tt.want {
			t.Errorf("DefaultAccepted(%d, %v) = %v, want %v", tt.status, tt.err, got, tt.want)
		}
	}
	if got := (Throttler{}).WithDefaults().Accepted; got == nil {
		t.Error("WithDefaults left Accepted nil")
	}
}

func TestRateLimitDefaults(t *testing.T) {
	for _, tt := range []struct {
		perSecond float64
		burst     int
	}{{0.5, 1}, {1, 1}, {10, 1}, {11, 2}, {95, 10}, {1000, 100}} {
		if got := (RateLimit{PerSecond: tt.perSecond}).WithDefaults().Burst; got != tt.burst {
			t.Errorf("PerSecond %v: Burst = %d, want %d", tt.perSecond, got, tt.burst)
		}
	}
	if got := (RateLimit{PerSecond: 10, Burst: 7}).WithDefaults().Burst; got != 7 {
		t.Errorf("Burst 7 became %d", got)
	}
}

func TestHedgeDefaults(t *testing.T) {
	got := Hedge{WinRate: &WinRate{}}.WithDefaults()
	if got.Quantile != 0.95 || got.MaxConcurrent != 3 || got.MinSamples != 20 ||
		got.Window != 30*time.Second || got.SuppressAt != 0.5 ||
		got.WinRate.Floor != 0.1 || got.WinRate.MinAllowance != 0.05 || got.WinRate.MinSamples != 10 {
		t.Fatalf("defaults %+v %+v", got, *got.WinRate)
	}
	if (Hedge{}).WithDefaults().WinRate != nil {
		t.Fatal("WinRate must stay off unless set")
	}
}

// TestEnumNames: every enum's names are snake_case, and a value with no
// name reads as type(value), in one format.
func TestEnumNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{BreakerHalfOpen.String(), "half_open"},
		{BreakerIsolated.String(), "isolated"},
		{BreakerState(9).String(), "breaker_state(9)"},
		{GateRateLimit.String(), "rate_limit"},
		{GateAdmission.String(), "admission"},
		{GateDeadline.String(), "deadline"},
		{Gate(0).String(), "gate(0)"},
		{HedgeBodyError.String(), "body_error"},
		{HedgeBodyPending.String(), "body_pending"},
		{HedgeBodyTooLarge.String(), "body_too_large"},
		{SuppressReason(99).String(), "suppress_reason(99)"},
		{AttemptHedge.String(), "hedge"},
		{AttemptKind(0).String(), "attempt_kind(0)"},
		{SkipNotReplayable.String(), "not_replayable"},
		{SkipGate.String(), "gate"},
		{SkipReason(42).String(), "skip_reason(42)"},
		{RetryAsked.String(), "asked"},
		{RetryUnsent.String(), "unsent"},
		{RetryReason(0).String(), "retry_reason(0)"},
		{Discarded.String(), "discarded"},
		{Rejected.String(), "rejected"},
		{Invalid.String(), "invalid"},
		{Outcome(7).String(), "outcome(7)"},
		{EjectRate.String(), "rate"},
		{EjectLatency.String(), "latency"},
		{EjectionReason(0).String(), "ejection_reason(0)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestBudgetDefaults(t *testing.T) {
	for _, tt := range []struct {
		cfg, want Budget
	}{
		{Budget{}, Budget{Ratio: 0.2, MinPerSecond: 10, Max: 20}},
		{Budget{MinPerSecond: 50}, Budget{Ratio: 0.2, MinPerSecond: 50, Max: 100}}, // two seconds of the floor
		{Budget{MinPerSecond: 2}, Budget{Ratio: 0.2, MinPerSecond: 2, Max: 10}},
		{Budget{MinPerSecond: -1}, Budget{Ratio: 0.2, MinPerSecond: -1, Max: 10}},
		{Budget{Ratio: 0.05, Max: 3}, Budget{Ratio: 0.05, MinPerSecond: 10, Max: 3}},
		{Budget{Ratio: -1}, Budget{Ratio: -1, MinPerSecond: 10, Max: 20}},
	} {
		if got := tt.cfg.WithDefaults(); got != tt.want {
			t.Errorf("%+v.WithDefaults() = %+v, want %+v", tt.cfg, got, tt.want)
		}
	}
}

func TestReplicasDefaults(t *testing.T) {
	d := Replicas{}.WithDefaults()
	if d.Connections != 4 || d.Refresh != 5*time.Second || d.MaxEjected != 0.5 || d.ConsecutiveFailures != 5 ||
		d.EjectFor != 30*time.Second || d.MaxEjectFor != 300*time.Second || d.LoadReportAge != 2*time.Second {
		t.Errorf("defaults: %+v; want 4 connections, 5s refresh, 0.5 ejected, 5 failures, 30s..300s, reports 2s old", d)
	}
	if got := (Replicas{EjectFor: 10 * time.Minute}).WithDefaults().MaxEjectFor; got != 10*time.Minute {
		t.Errorf("EjectFor 10m leaves MaxEjectFor %v, want it raised to 10m", got)
	}
	if d := (Replicas{MaxEjected: -1, ConsecutiveFailures: -1, LoadReportAge: -1}).WithDefaults(); d.MaxEjected >= 0 || d.ConsecutiveFailures >= 0 || d.LoadReportAge >= 0 {
		t.Errorf("negative MaxEjected, ConsecutiveFailures and LoadReportAge must stay negative (off), got %+v", d)
	}
}

func TestReplicasValidate(t *testing.T) {
	for _, tt := range []struct {
		cfg Replicas
		ok  bool
	}{
		{Replicas{}, true},
		{Replicas{Connections: 64}, true},
		{Replicas{Connections: 65}, false},
		{Replicas{Connections: -1}, false},
		{Replicas{MaxEjected: 1}, true},
		{Replicas{MaxEjected: -1}, true}, // never eject
		{Replicas{MaxEjected: 1.5}, false},
		{Replicas{MaxEjected: math.NaN()}, false},
		{Replicas{EjectFor: time.Minute, MaxEjectFor: time.Second}, false},
		{Replicas{EjectFor: 10 * time.Minute}, true}, // MaxEjectFor's default follows it
		{Replicas{Refresh: -1}, false},
	} {
		err := tt.cfg.validate()
		if (err == nil) != tt.ok {
			t.Errorf("%+v: validate() = %v, want ok %v", tt.cfg, err, tt.ok)
		}
	}
}
