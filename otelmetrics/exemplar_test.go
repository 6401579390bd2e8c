package otelmetrics_test

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/resilix/resilix/otelmetrics"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// TestExemplars checks that every measurement is recorded with its event's
// Context: each event below carries a span of its own, and the SDK's
// default exemplar filter (trace based) keeps, on each instrument's point,
// the span that was in the context the measurement was made with.
func TestExemplars(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	tp := sdktrace.NewTracerProvider() // samples every span
	defer tp.Shutdown(context.Background())
	obs, err := otelmetrics.New(mp)
	if err != nil {
		t.Fatal(err)
	}

	// want maps an instrument to the span id its event carried.
	want := map[string]string{}
	ctxFor := func(instruments ...string) context.Context {
		ctx, span := tp.Tracer("test").Start(context.Background(), instruments[0])
		span.End()
		for _, name := range instruments {
			want[name] = span.SpanContext().SpanID().String()
		}
		return ctx
	}

	obs.CallDone(policy.CallInfo{Context: ctxFor("resilix.calls", "resilix.call.duration"),
		Key: "a.test", Outcome: policy.Success, Duration: time.Millisecond})
	obs.AttemptDone(policy.AttemptInfo{Context: ctxFor("resilix.attempts"),
		Key: "a.test", Kind: policy.AttemptFirst, Outcome: policy.Success})
	obs.Refused(policy.Refusal{Context: ctxFor("resilix.shed"),
		Key: "a.test", Gate: policy.GateBreaker, Priority: shedding.Critical})
	obs.RetrySkipped(policy.RetrySkip{Context: ctxFor("resilix.retries.skipped"),
		Key: "a.test", Reason: policy.SkipBudget, Attempt: 1})
	obs.HedgeStarted(policy.HedgeInfo{Context: ctxFor("resilix.hedges", "resilix.hedge.threshold"),
		Key: "a.test", Attempt: 2, Threshold: time.Millisecond})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	note := func(name string, spanIDs [][]byte) {
		if len(spanIDs) != 1 {
			t.Errorf("%s: %d exemplars, want 1", name, len(spanIDs))
			return
		}
		got[name] = hex.EncodeToString(spanIDs[0])
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		var ids [][]byte
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				for _, e := range dp.Exemplars {
					ids = append(ids, e.SpanID)
				}
			}
		case metricdata.Histogram[float64]:
			for _, dp := range d.DataPoints {
				for _, e := range dp.Exemplars {
					ids = append(ids, e.SpanID)
				}
			}
		default:
			continue // the gauges are observed, with no event
		}
		note(m.Name, ids)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("exemplars' span ids by instrument (-events +collected):\n%s", diff)
	}
}

// TestNilContext: an event built by hand, without a Context, is recorded
// rather than making the SDK panic.
func TestNilContext(t *testing.T) {
	reader, obs := newObserver(t)
	obs.CallDone(policy.CallInfo{Key: "a.test", Outcome: policy.Success})
	obs.AttemptDone(policy.AttemptInfo{Key: "a.test", Kind: policy.AttemptFirst, Outcome: policy.Success})
	obs.Refused(policy.Refusal{Key: "a.test", Gate: policy.GateBreaker})
	obs.RetrySkipped(policy.RetrySkip{Key: "a.test", Reason: policy.SkipBudget})
	obs.HedgeStarted(policy.HedgeInfo{Key: "a.test"})
	obs.HedgeWon(policy.HedgeInfo{Key: "a.test"})
	obs.HedgeSuppressed(policy.HedgeSuppression{Key: "a.test", Reason: policy.HedgeWarming})
	if n := len(collect(t, reader).values); n == 0 {
		t.Error("nothing recorded")
	}
}
