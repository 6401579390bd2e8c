package oteltrace_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/resilix/resilix/oteltrace"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// recorder returns a TracerProvider that samples every span and the
// in-memory recorder of its ended spans.
func recorder(t testing.TB) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, rec
}

// kvString writes attributes as "k=v" in key order, joined by spaces.
func kvString(kvs []attribute.KeyValue) string {
	var s []string
	for _, kv := range kvs {
		s = append(s, string(kv.Key)+"="+kv.Value.String())
	}
	slices.Sort(s)
	return strings.Join(s, " ")
}

// events returns a span's events as "name k=v ...".
func events(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, strings.TrimSpace(e.Name+" "+kvString(e.Attributes)))
	}
	return out
}

// TestEvents sends one event of each kind the Observer handles, and checks
// the span's events and attributes name for name.
func TestEvents(t *testing.T) {
	tp, rec := recorder(t)
	obs := oteltrace.New()
	ctx, span := tp.Tracer("test").Start(context.Background(), "GET")

	obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "a.test", Kind: policy.AttemptFirst, Attempt: 1,
		Outcome: policy.Failure, Latency: 250 * time.Millisecond, StatusCode: 503})
	obs.RetrySkipped(policy.RetrySkip{Context: ctx, Key: "a.test", Reason: policy.SkipGate, Gate: policy.GateBreaker, Attempt: 1})
	obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "a.test", Kind: policy.AttemptRetry, Attempt: 2,
		Outcome: policy.Failure, Latency: time.Second, Err: errors.New("connection reset")})
	obs.RetrySkipped(policy.RetrySkip{Context: ctx, Key: "a.test", Reason: policy.SkipBudget, Attempt: 2})
	obs.HedgeStarted(policy.HedgeInfo{Context: ctx, Key: "a.test", Attempt: 3, Threshold: 20 * time.Millisecond})
	obs.HedgeWon(policy.HedgeInfo{Context: ctx, Key: "a.test", Attempt: 3, Threshold: 20 * time.Millisecond})
	obs.TieCancelled(policy.HedgeInfo{Context: ctx, Key: "a.test", Attempt: 4, Tied: true})
	obs.TieRanTwice(policy.HedgeInfo{Context: ctx, Key: "a.test", Attempt: 5, Threshold: 20 * time.Millisecond, Tied: true})
	obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "a.test", Kind: policy.AttemptHedge, Attempt: 3,
		Outcome: policy.Success, Latency: 5 * time.Millisecond, StatusCode: 200, Lane: "10.0.0.7:443"})
	obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "a.test", Kind: policy.AttemptRetry, Attempt: 2,
		Outcome: policy.Discarded, Latency: 25 * time.Millisecond, Err: context.Canceled})
	obs.HedgeSuppressed(policy.HedgeSuppression{Context: ctx, Key: "a.test", Reason: policy.HedgeBudget})
	obs.Refused(policy.Refusal{Context: ctx, Key: "a.test", Kind: policy.AttemptHedge, Gate: policy.GateRateLimit,
		Priority: shedding.Bulk, HeavyTenant: true,
		Err: &policy.RejectedError{Gate: policy.GateRateLimit, RetryAfter: 1500 * time.Millisecond}})
	obs.Refused(policy.Refusal{Context: ctx, Key: "a.test", Kind: policy.AttemptFirst, Gate: policy.GateBreaker,
		Priority: shedding.Critical, Err: &policy.RejectedError{Gate: policy.GateBreaker}})
	obs.Pushback(policy.Pushback{Context: ctx, Key: "a.test", StatusCode: 429, RetryAfter: 2 * time.Second})
	obs.MalformedHeader(policy.MalformedHeader{Context: ctx, Key: "a.test", Header: "Resilix-Priority", Value: "urgent!"})
	obs.CallDone(policy.CallInfo{Context: ctx, Key: "a.test", Outcome: policy.Success, WireAttempts: 3, StatusCode: 200})
	span.End()

	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	want := []string{
		"resilix.attempt http.response.status_code=503 resilix.attempt.discarded=false resilix.attempt.kind=first resilix.attempt.latency=0.25 resilix.attempt.number=1 resilix.attempt.outcome=failure resilix.key=a.test",
		"resilix.retry.skipped resilix.attempt.number=1 resilix.gate=breaker resilix.key=a.test resilix.retry.reason=gate",
		"resilix.attempt error.message=connection reset resilix.attempt.discarded=false resilix.attempt.kind=retry resilix.attempt.latency=1 resilix.attempt.number=2 resilix.attempt.outcome=failure resilix.key=a.test",
		"resilix.retry.skipped resilix.attempt.number=2 resilix.key=a.test resilix.retry.reason=budget",
		"resilix.hedge.started resilix.attempt.number=3 resilix.hedge.threshold=0.02 resilix.key=a.test",
		"resilix.hedge.won resilix.attempt.number=3 resilix.hedge.threshold=0.02 resilix.key=a.test",
		"resilix.tie.cancelled resilix.attempt.number=4 resilix.hedge.threshold=0 resilix.key=a.test",
		"resilix.tie.ran_twice resilix.attempt.number=5 resilix.hedge.threshold=0.02 resilix.key=a.test",
		"resilix.attempt http.response.status_code=200 resilix.attempt.discarded=false resilix.attempt.kind=hedge resilix.attempt.latency=0.005 resilix.attempt.number=3 resilix.attempt.outcome=success resilix.key=a.test resilix.lane=10.0.0.7:443",
		"resilix.attempt error.message=context canceled resilix.attempt.discarded=true resilix.attempt.kind=retry resilix.attempt.latency=0.025 resilix.attempt.number=2 resilix.attempt.outcome=discarded resilix.key=a.test",
		"resilix.hedge.suppressed resilix.hedge.reason=budget resilix.key=a.test",
		"resilix.refused resilix.attempt.kind=hedge resilix.gate=rate_limit resilix.key=a.test resilix.priority=bulk resilix.retry_after=1.5 resilix.tenant.heavy=true",
		"resilix.refused resilix.attempt.kind=first resilix.gate=breaker resilix.key=a.test resilix.priority=critical resilix.tenant.heavy=false",
		"resilix.pushback http.response.status_code=429 resilix.key=a.test resilix.retry_after=2",
		"resilix.header.malformed http.header=Resilix-Priority resilix.key=a.test",
	}
	if diff := cmp.Diff(want, events(spans[0])); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got := kvString(spans[0].Attributes()); got != "http.request.resend_count=2" {
		t.Errorf("span attributes %q, want http.request.resend_count=2", got)
	}
	for _, kv := range spans[0].Attributes() {
		if kv.Key == "http.request.resend_count" && kv.Value.Type() != attribute.INT64 {
			t.Errorf("http.request.resend_count is a %v, want an int", kv.Value.Type())
		}
	}
}

// TestResendCountOnlyWhenResent: a call with one wire attempt, or none (a
// refused first attempt), leaves the span's attributes alone.
func TestResendCountOnlyWhenResent(t *testing.T) {
	tp, rec := recorder(t)
	obs := oteltrace.New()
	for _, wire := range []int{0, 1} {
		ctx, span := tp.Tracer("test").Start(context.Background(), fmt.Sprint(wire))
		obs.CallDone(policy.CallInfo{Context: ctx, Key: "a.test", WireAttempts: wire})
		span.End()
	}
	for _, s := range rec.Ended() {
		if len(s.Attributes()) != 0 {
			t.Errorf("%s wire attempts: span attributes %v", s.Name(), s.Attributes())
		}
	}
}

var (
	errAttempt = errors.New("x")
	errRefused = &policy.RejectedError{Gate: policy.GateBreaker, RetryAfter: time.Second}
)

// allEvents calls every func of obs once with ctx.
func allEvents(obs *policy.Observer, ctx context.Context) {
	obs.CallDone(policy.CallInfo{Context: ctx, Key: "a.test", WireAttempts: 3})
	obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "a.test", Kind: policy.AttemptRetry, Attempt: 2,
		Outcome: policy.Failure, StatusCode: 503, Err: errAttempt, Lane: "3"})
	obs.Refused(policy.Refusal{Context: ctx, Key: "a.test", Kind: policy.AttemptRetry, Gate: policy.GateBreaker, Err: errRefused})
	obs.RetrySkipped(policy.RetrySkip{Context: ctx, Key: "a.test", Reason: policy.SkipGate, Gate: policy.GateBreaker})
	obs.HedgeStarted(policy.HedgeInfo{Context: ctx, Key: "a.test", Attempt: 2})
	obs.HedgeWon(policy.HedgeInfo{Context: ctx, Key: "a.test", Attempt: 2})
	obs.HedgeSuppressed(policy.HedgeSuppression{Context: ctx, Key: "a.test", Reason: policy.HedgeWarming})
	obs.Pushback(policy.Pushback{Context: ctx, Key: "a.test", StatusCode: 503, RetryAfter: time.Second})
	obs.MalformedHeader(policy.MalformedHeader{Context: ctx, Key: "a.test", Header: "Retry-After", Value: "soon"})
}

// TestNoSpanCostsNothing: without a recording span in the context (none,
// one that is not sampled, one already ended, or no context at all) every
// func returns without allocating, and nothing is recorded.
func TestNoSpanCostsNothing(t *testing.T) {
	tp, rec := recorder(t)
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSpanProcessor(rec))
	defer never.Shutdown(context.Background())
	unsampled, span := never.Tracer("test").Start(context.Background(), "unsampled")
	defer span.End()
	ended, span := tp.Tracer("test").Start(context.Background(), "ended")
	span.End()
	obs := oteltrace.New()
	for _, c := range []struct {
		name string
		ctx  context.Context
	}{
		{"no span", context.Background()},
		{"not sampled", unsampled},
		{"ended", ended},
		{"nil context", nil},
	} {
		if n := testing.AllocsPerRun(100, func() { allEvents(obs, c.ctx) }); n != 0 {
			t.Errorf("%s: %v allocations per round of events, want 0", c.name, n)
		}
	}
	for _, s := range rec.Ended() {
		if len(s.Events()) != 0 || len(s.Attributes()) != 0 {
			t.Errorf("span %q got events %v, attributes %v", s.Name(), events(s), s.Attributes())
		}
	}
}

// BenchmarkEvents is the cost of one round of the nine events, without a
// span in the context and with a recording one.
func BenchmarkEvents(b *testing.B) {
	tp := sdktrace.NewTracerProvider() // records, exports nothing
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	obs := oteltrace.New()
	b.Run("no-span", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			allEvents(obs, context.Background())
		}
	})
	b.Run("recording", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			// A span per round: the SDK caps a span's events at 128.
			ctx, span := tp.Tracer("bench").Start(context.Background(), "GET")
			allEvents(obs, ctx)
			span.End()
		}
	})
}
