package slogobserver_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/slogobserver"
)

// events returns one event of each kind the Observer logs, each with ctx,
// and the record it makes, by name.
func events(obs *policy.Observer, ctx context.Context) []struct {
	name string
	call func()
	want record
} {
	storeErr := errors.New("redis: connection refused")
	invalid := errors.New("net/http: invalid header field name")
	added, removed := []string{"10.0.0.8:443"}, []string{"10.0.0.7:443"}
	rejected := &policy.RejectedError{Gate: policy.GateRateLimit, Err: policy.ErrRateLimited, Key: "api", RetryAfter: 2 * time.Second}
	return []struct {
		name string
		call func()
		want record
	}{
		{"attempt failed", func() {
			obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "api", Kind: policy.AttemptRetry, Attempt: 2, Outcome: policy.Failure, Latency: 3 * time.Millisecond, StatusCode: 503, Lane: "10.0.0.7:443"})
		}, record{Level: slog.LevelDebug, Msg: "attempt failed", Attrs: map[string]string{
			"key": "api", "kind": "retry", "attempt": "2", "outcome": "failure", "latency_ms": "3", "lane": "10.0.0.7:443", "http.response.status_code": "503",
		}}},
		{"attempt stalled", func() {
			obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "api", Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Failure, Latency: 400 * time.Millisecond, Err: policy.ErrAttemptTimeout, Stalled: true})
		}, record{Level: slog.LevelDebug, Msg: "attempt failed", Attrs: map[string]string{
			"key": "api", "kind": "first", "attempt": "1", "outcome": "failure", "latency_ms": "400", "stalled": "true", "error": policy.ErrAttemptTimeout.Error(),
		}}},
		{"attempt invalid", func() {
			obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "api", Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Invalid, Err: invalid})
		}, record{Level: slog.LevelDebug, Msg: "attempt invalid", Attrs: map[string]string{
			"key": "api", "kind": "first", "attempt": "1", "outcome": "invalid", "latency_ms": "0", "error": "net/http: invalid header field name",
		}}},
		{"attempt discarded", func() {
			obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "api", Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Discarded, Latency: time.Second, Err: context.Canceled})
		}, record{Level: slog.LevelDebug, Msg: "attempt discarded", Attrs: map[string]string{
			"key": "api", "kind": "first", "attempt": "1", "outcome": "discarded", "latency_ms": "1000", "error": "context canceled",
		}}},
		{"attempt succeeded", func() {
			obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "api", Kind: policy.AttemptRetry, Attempt: 2, Outcome: policy.Success, StatusCode: 200})
		}, record{}},
		{"attempt canceled", func() {
			obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "api", Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Canceled, Err: context.Canceled})
		}, record{}},
		{"retry skipped", func() {
			obs.RetrySkipped(policy.RetrySkip{Context: ctx, Key: "api", Priority: shedding.Degraded, Reason: policy.SkipNotReplayable, Attempt: 1, BodyTooLarge: true})
		}, record{Level: slog.LevelDebug, Msg: "retry skipped", Attrs: map[string]string{
			"key": "api", "attempt": "1", "priority": "degraded", "reason": "not_replayable", "body_too_large": "true",
		}}},
		{"retry skipped by a gate", func() {
			obs.RetrySkipped(policy.RetrySkip{Context: ctx, Key: "api", Reason: policy.SkipGate, Gate: policy.GateBulkhead, Attempt: 2})
		}, record{Level: slog.LevelDebug, Msg: "retry skipped", Attrs: map[string]string{
			"key": "api", "attempt": "2", "priority": "critical", "reason": "gate", "gate": "bulkhead",
		}}},
		{"hedge started", func() {
			obs.HedgeStarted(policy.HedgeInfo{Context: ctx, Key: "api", Attempt: 2, Threshold: 40 * time.Millisecond})
		}, record{Level: slog.LevelDebug, Msg: "hedge started", Attrs: map[string]string{
			"key": "api", "attempt": "2", "priority": "critical", "threshold_ms": "40",
		}}},
		{"hedge won", func() {
			obs.HedgeWon(policy.HedgeInfo{Context: ctx, Key: "api", Attempt: 2, Threshold: 40 * time.Millisecond})
		}, record{Level: slog.LevelDebug, Msg: "hedge won", Attrs: map[string]string{
			"key": "api", "attempt": "2", "priority": "critical", "threshold_ms": "40",
		}}},
		{"tie cancelled", func() {
			obs.TieCancelled(policy.HedgeInfo{Context: ctx, Key: "api", Attempt: 1, Tied: true})
		}, record{Level: slog.LevelDebug, Msg: "tie cancelled", Attrs: map[string]string{
			"key": "api", "attempt": "1", "priority": "critical", "threshold_ms": "0",
		}}},
		{"tie ran twice", func() {
			obs.TieRanTwice(policy.HedgeInfo{Context: ctx, Key: "api", Attempt: 2, Threshold: 40 * time.Millisecond, Tied: true})
		}, record{Level: slog.LevelDebug, Msg: "tie ran twice", Attrs: map[string]string{
			"key": "api", "attempt": "2", "priority": "critical", "threshold_ms": "40",
		}}},
		{"hedge suppressed", func() {
			obs.HedgeSuppressed(policy.HedgeSuppression{Context: ctx, Key: "api", Priority: shedding.Bulk, Reason: policy.HedgeBodyTooLarge})
		}, record{Level: slog.LevelDebug, Msg: "hedge suppressed", Attrs: map[string]string{
			"key": "api", "priority": "bulk", "reason": "body_too_large",
		}}},
		{"refused by the rate limit", func() {
			obs.Refused(policy.Refusal{Context: ctx, Key: "api", Kind: policy.AttemptFirst, Gate: policy.GateRateLimit, Err: rejected})
		}, record{Level: slog.LevelDebug, Msg: "refused", Attrs: map[string]string{
			"key": "api", "kind": "first", "gate": "rate_limit", "priority": "critical", "tenant.heavy": "false", "retry_after_ms": "2000",
		}}},
		{"refused by the limiter, heavy tenant", func() {
			obs.Refused(policy.Refusal{Context: ctx, Key: "api", Kind: policy.AttemptRetry, Gate: policy.GateLimiter, Priority: shedding.BestEffort, HeavyTenant: true})
		}, record{Level: slog.LevelDebug, Msg: "refused", Attrs: map[string]string{
			"key": "api", "kind": "retry", "gate": "limiter", "priority": "best_effort", "tenant.heavy": "true",
		}}},
		{"refused by the throttler", func() {
			obs.Refused(policy.Refusal{Context: ctx, Key: "api", Kind: policy.AttemptFirst, Gate: policy.GateThrottler, Priority: shedding.Bulk})
		}, record{Level: slog.LevelDebug, Msg: "refused", Attrs: map[string]string{
			"key": "api", "kind": "first", "gate": "throttler", "priority": "bulk", "tenant.heavy": "false",
		}}},
		{"breaker opened", func() {
			obs.BreakerTransition(policy.BreakerTransition{Context: ctx, Key: "api", From: policy.BreakerHalfOpen, To: policy.BreakerOpen})
		}, record{Level: slog.LevelWarn, Msg: "breaker opened", Attrs: map[string]string{"key": "api", "from": "half_open", "to": "open"}}},
		{"breaker half-open", func() {
			obs.BreakerTransition(policy.BreakerTransition{Context: ctx, Key: "api", From: policy.BreakerOpen, To: policy.BreakerHalfOpen})
		}, record{Level: slog.LevelInfo, Msg: "breaker half-open", Attrs: map[string]string{"key": "api", "from": "open", "to": "half_open"}}},
		{"breaker closed", func() {
			obs.BreakerTransition(policy.BreakerTransition{Context: ctx, Key: "api", From: policy.BreakerHalfOpen, To: policy.BreakerClosed})
		}, record{Level: slog.LevelInfo, Msg: "breaker closed", Attrs: map[string]string{"key": "api", "from": "half_open", "to": "closed"}}},
		{"breaker isolated", func() {
			obs.BreakerTransition(policy.BreakerTransition{Context: ctx, Key: "api", From: policy.BreakerOpen, To: policy.BreakerIsolated})
		}, record{Level: slog.LevelWarn, Msg: "breaker isolated", Attrs: map[string]string{"key": "api", "from": "open", "to": "isolated"}}},
		{"breaker released", func() {
			obs.BreakerTransition(policy.BreakerTransition{Context: ctx, Key: "api", From: policy.BreakerIsolated, To: policy.BreakerClosed})
		}, record{Level: slog.LevelInfo, Msg: "breaker closed", Attrs: map[string]string{"key": "api", "from": "isolated", "to": "closed"}}},
		{"limit changed", func() {
			obs.LimitTransition(policy.LimitTransition{Context: ctx, Key: "api", From: 20, To: 14})
		}, record{Level: slog.LevelDebug, Msg: "limit changed", Attrs: map[string]string{"key": "api", "from": "20", "to": "14"}}},
		{"store failing", func() {
			obs.StoreTransition(policy.StoreTransition{Context: ctx, Key: "api", From: policy.StoreUp, To: policy.StoreFallback, Err: storeErr})
		}, record{Level: slog.LevelWarn, Msg: "store failing", Attrs: map[string]string{
			"key": "api", "from": "up", "to": "fallback", "error": "redis: connection refused",
		}}},
		{"store recovered", func() {
			obs.StoreTransition(policy.StoreTransition{Context: ctx, Key: "api", From: policy.StoreRefusing, To: policy.StoreUp})
		}, record{Level: slog.LevelInfo, Msg: "store recovered", Attrs: map[string]string{"key": "api", "from": "refusing", "to": "up"}}},
		{"lane ejected", func() {
			obs.LaneEjected(policy.LaneEjection{Context: ctx, Key: "api", Addr: "10.0.0.7:443", Index: 3, Reason: policy.EjectConsecutive, For: 30 * time.Second})
		}, record{Level: slog.LevelWarn, Msg: "lane ejected", Attrs: map[string]string{
			"key": "api", "lane": "10.0.0.7:443", "reason": "consecutive", "for_ms": "30000",
		}}},
		{"lane returned", func() {
			obs.LaneReturned(policy.LaneEjection{Context: ctx, Key: "api", Index: 3, Reason: policy.EjectRate, For: time.Minute})
		}, record{Level: slog.LevelInfo, Msg: "lane returned", Attrs: map[string]string{
			"key": "api", "lane": "3", "reason": "rate", "for_ms": "60000",
		}}},
		{"pushback", func() {
			obs.Pushback(policy.Pushback{Context: ctx, Key: "api", StatusCode: 429, RetryAfter: 5 * time.Second})
		}, record{Level: slog.LevelDebug, Msg: "pushback", Attrs: map[string]string{
			"key": "api", "http.response.status_code": "429", "retry_after_ms": "5000",
		}}},
		{"malformed header", func() {
			obs.MalformedHeader(policy.MalformedHeader{Context: ctx, Key: "api", Header: "Retry-After", Value: "soon"})
		}, record{Level: slog.LevelDebug, Msg: "malformed header", Attrs: map[string]string{
			"key": "api", "http.header": "Retry-After", "value": "soon",
		}}},
		{"lanes changed", func() {
			obs.LanesChanged(policy.LaneSetChange{Context: ctx, Key: "api", Added: added, Removed: removed, Lanes: 4})
		}, record{Level: slog.LevelInfo, Msg: "lanes changed", Attrs: map[string]string{
			"key": "api", "added": "[10.0.0.8:443]", "removed": "[10.0.0.7:443]", "lanes": "4",
		}}},
	}
}

// TestSlogEvents checks each event's record: message, level, attributes,
// and the event's context handed to the handler.
func TestSlogEvents(t *testing.T) {
	rec := &recorder{level: slog.LevelDebug}
	obs := slogobserver.New(slog.New(rec), slogobserver.Options{Summary: -1})
	ctx := context.WithValue(context.Background(), requestIDKey{}, "req-1")
	for _, e := range events(obs, ctx) {
		e.call()
		got := rec.take()
		if e.want.Msg == "" {
			if len(got) != 0 {
				t.Errorf("%s: logged%s", e.name, messages(got))
			}
			continue
		}
		e.want.ReqID = "req-1"
		if len(got) != 1 {
			t.Errorf("%s: %d records, want 1:%s", e.name, len(got), messages(got))
			continue
		}
		if diff := cmp.Diff(e.want, got[0]); diff != "" {
			t.Errorf("%s: record (-want +got):\n%s", e.name, diff)
		}
	}
}

// TestSlogCalls: with Options.Calls, every call is logged, at Debug when
// it succeeded or was canceled and at Info otherwise.
func TestSlogCalls(t *testing.T) {
	rec := &recorder{level: slog.LevelDebug}
	obs := slogobserver.New(slog.New(rec), slogobserver.Options{Calls: true})
	ctx := context.Background()
	for _, c := range []struct {
		info  policy.CallInfo
		level slog.Level
		attrs map[string]string
	}{
		{policy.CallInfo{Context: ctx, Key: "api", Outcome: policy.Success, Duration: 12 * time.Millisecond, WireAttempts: 2, StatusCode: 200},
			slog.LevelDebug, map[string]string{"key": "api", "outcome": "success", "priority": "critical", "duration_ms": "12", "attempts": "2", "http.response.status_code": "200"}},
		{policy.CallInfo{Context: ctx, Key: "api", Outcome: policy.Canceled, Priority: shedding.Bulk, Err: context.Canceled},
			slog.LevelDebug, map[string]string{"key": "api", "outcome": "canceled", "priority": "bulk", "duration_ms": "0", "attempts": "0", "error": "context canceled"}},
		{policy.CallInfo{Context: ctx, Key: "api", Outcome: policy.Failure, Duration: time.Second, WireAttempts: 3, StatusCode: 503},
			slog.LevelInfo, map[string]string{"key": "api", "outcome": "failure", "priority": "critical", "duration_ms": "1000", "attempts": "3", "http.response.status_code": "503"}},
		{policy.CallInfo{Context: ctx, Key: "api", Outcome: policy.Rejected, Err: policy.ErrCircuitOpen},
			slog.LevelInfo, map[string]string{"key": "api", "outcome": "rejected", "priority": "critical", "duration_ms": "0", "attempts": "0", "error": "resilix: circuit open"}},
	} {
		obs.CallDone(c.info)
		want := []record{{Level: c.level, Msg: "call done", Attrs: c.attrs}}
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("%v: records (-want +got):\n%s", c.info.Outcome, diff)
		}
	}
}

// TestSlogObserverFuncs: the Observer has a func for every event but
// Attach (it reports no gauges) and, unless Options.Calls, CallDone, so
// that an event policy.Observer gains is not forgotten here.
func TestSlogObserverFuncs(t *testing.T) {
	for _, opts := range []slogobserver.Options{{}, {Calls: true}} {
		v := reflect.ValueOf(slogobserver.New(nil, opts)).Elem()
		for i := range v.NumField() {
			name := v.Type().Field(i).Name
			want := name != "Attach" && (name != "CallDone" || opts.Calls)
			if got := !v.Field(i).IsNil(); got != want {
				t.Errorf("%+v: %s set %v, want %v", opts, name, got, want)
			}
		}
	}
}

// TestSlogFilteredAllocatesNothing: an event whose level the handler
// filters out costs no allocation, for every event, and a nil logger
// (slog.Default(), at Info) filters out the Debug ones as cheaply.
func TestSlogFilteredAllocatesNothing(t *testing.T) {
	h := slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError})
	obs := slogobserver.New(slog.New(h), slogobserver.Options{Calls: true, Attempts: true})
	ctx := context.WithValue(context.Background(), requestIDKey{}, "req-1")
	for _, e := range events(obs, ctx) {
		if n := testing.AllocsPerRun(100, e.call); n != 0 {
			t.Errorf("%s: %v allocations a filtered event, want 0", e.name, n)
		}
	}
	call := policy.CallInfo{Context: ctx, Key: "api", Outcome: policy.Failure, WireAttempts: 3, Err: errors.New("boom")}
	if n := testing.AllocsPerRun(100, func() { obs.CallDone(call) }); n != 0 {
		t.Errorf("CallDone: %v allocations a filtered event, want 0", n)
	}

	def := slogobserver.New(nil, slogobserver.Options{})
	hedge := policy.HedgeInfo{Context: ctx, Key: "api", Attempt: 2, Threshold: time.Millisecond}
	if n := testing.AllocsPerRun(100, func() { def.HedgeStarted(hedge) }); n != 0 {
		t.Errorf("HedgeStarted to slog.Default(): %v allocations, want 0", n)
	}
}
