package oteltrace

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/resilix/resilix/policy"
)

// The event names.
const (
	eventAttempt         = "resilix.attempt"
	eventHedgeStarted    = "resilix.hedge.started"
	eventHedgeWon        = "resilix.hedge.won"
	eventTieCancelled    = "resilix.tie.cancelled"
	eventTieRanTwice     = "resilix.tie.ran_twice"
	eventHedgeSuppressed = "resilix.hedge.suppressed"
	eventRefused         = "resilix.refused"
	eventRetrySkipped    = "resilix.retry.skipped"
	eventPushback        = "resilix.pushback"
	eventMalformed       = "resilix.header.malformed"
)

// The attribute names; the package doc says which event carries which.
const (
	// resendCount is set on the span of a call that sent more than one
	// wire attempt: the OpenTelemetry semantic convention's attribute.
	resendCount = attribute.Key("http.request.resend_count")

	attrKey        = attribute.Key("resilix.key")
	attrKind       = attribute.Key("resilix.attempt.kind")
	attrNumber     = attribute.Key("resilix.attempt.number")
	attrOutcome    = attribute.Key("resilix.attempt.outcome")
	attrLatency    = attribute.Key("resilix.attempt.latency")
	attrDiscarded  = attribute.Key("resilix.attempt.discarded")
	attrLane       = attribute.Key("resilix.lane")
	attrStatus     = attribute.Key("http.response.status_code")
	attrError      = attribute.Key("error.message")
	attrThreshold  = attribute.Key("resilix.hedge.threshold")
	attrSuppressed = attribute.Key("resilix.hedge.reason")
	attrGate       = attribute.Key("resilix.gate")
	attrPriority   = attribute.Key("resilix.priority")
	attrHeavy      = attribute.Key("resilix.tenant.heavy")
	attrRetryAfter = attribute.Key("resilix.retry_after")
	attrSkip       = attribute.Key("resilix.retry.reason")
	attrHeader     = attribute.Key("http.header")
)

// New returns an Observer that adds an event to the span in each event's
// Context for every wire attempt, hedge started, won or suppressed,
// refusal, skipped retry, answer that armed pushback and malformed
// header, and sets http.request.resend_count on the
// span of a call that sent more than one wire attempt. The package doc lists the events
// and their attributes.
//
// When the context holds no span, or one that is not recording (not
// sampled, or already ended), every func returns at once and allocates
// nothing. The Observer holds no state, and is safe for concurrent use
// and for sharing between transports. Combine it with others with
// policy.JoinObservers.
func New() *policy.Observer {
	return &policy.Observer{
		CallDone:        callDone,
		AttemptDone:     attemptDone,
		Refused:         refused,
		RetrySkipped:    retrySkipped,
		HedgeStarted:    hedgeStarted,
		HedgeWon:        hedgeWon,
		TieCancelled:    tieCancelled,
		TieRanTwice:     tieRanTwice,
		HedgeSuppressed: hedgeSuppressed,
		Pushback:        pushback,
		MalformedHeader: malformedHeader,
	}
}

// recording returns the span in ctx when it records. A nil context,
// possible only in an event built by hand, holds none.
func recording(ctx context.Context) (trace.Span, bool) {
	if ctx == nil {
		return nil, false
	}
	span := trace.SpanFromContext(ctx)
	return span, span.IsRecording()
}

func callDone(c policy.CallInfo) {
	if c.WireAttempts <= 1 {
		return
	}
	if span, ok := recording(c.Context); ok {
		span.SetAttributes(resendCount.Int(c.WireAttempts - 1))
	}
}

func attemptDone(a policy.AttemptInfo) {
	span, ok := recording(a.Context)
	if !ok {
		return
	}
	kv := make([]attribute.KeyValue, 0, 9)
	kv = append(kv,
		attrKey.String(a.Key),
		attrKind.String(a.Kind.String()),
		attrNumber.Int(a.Attempt),
		attrOutcome.String(a.Outcome.String()),
		attrLatency.Float64(a.Latency.Seconds()),
		attrDiscarded.Bool(a.Outcome == policy.Discarded),
	)
	if a.StatusCode != 0 {
		kv = append(kv, attrStatus.Int(a.StatusCode))
	}
	if a.Err != nil {
		kv = append(kv, attrError.String(a.Err.Error()))
	}
	if a.Lane != "" {
		kv = append(kv, attrLane.String(a.Lane))
	}
	span.AddEvent(eventAttempt, trace.WithAttributes(kv...))
}

func hedgeStarted(h policy.HedgeInfo) { hedgeEvent(eventHedgeStarted, h) }

func hedgeWon(h policy.HedgeInfo) { hedgeEvent(eventHedgeWon, h) }

func tieCancelled(h policy.HedgeInfo) { hedgeEvent(eventTieCancelled, h) }

func tieRanTwice(h policy.HedgeInfo) { hedgeEvent(eventTieRanTwice, h) }

func hedgeEvent(name string, h policy.HedgeInfo) {
	if span, ok := recording(h.Context); ok {
		span.AddEvent(name, trace.WithAttributes(
			attrKey.String(h.Key),
			attrNumber.Int(h.Attempt),
			attrThreshold.Float64(h.Threshold.Seconds()),
		))
	}
}

func hedgeSuppressed(h policy.HedgeSuppression) {
	if span, ok := recording(h.Context); ok {
		span.AddEvent(eventHedgeSuppressed, trace.WithAttributes(
			attrKey.String(h.Key),
			attrSuppressed.String(h.Reason.String()),
		))
	}
}

func refused(r policy.Refusal) {
	span, ok := recording(r.Context)
	if !ok {
		return
	}
	kv := make([]attribute.KeyValue, 0, 6)
	kv = append(kv,
		attrKey.String(r.Key),
		attrKind.String(r.Kind.String()),
		attrGate.String(r.Gate.String()),
		attrPriority.String(r.Priority.String()),
		attrHeavy.Bool(r.HeavyTenant),
	)
	if r.Err != nil && r.Err.RetryAfter > 0 {
		kv = append(kv, attrRetryAfter.Float64(r.Err.RetryAfter.Seconds()))
	}
	span.AddEvent(eventRefused, trace.WithAttributes(kv...))
}

func retrySkipped(k policy.RetrySkip) {
	span, ok := recording(k.Context)
	if !ok {
		return
	}
	kv := make([]attribute.KeyValue, 0, 4)
	kv = append(kv,
		attrKey.String(k.Key),
		attrNumber.Int(k.Attempt),
		attrSkip.String(k.Reason.String()),
	)
	if k.Reason == policy.SkipGate {
		kv = append(kv, attrGate.String(k.Gate.String()))
	}
	span.AddEvent(eventRetrySkipped, trace.WithAttributes(kv...))
}

func pushback(p policy.Pushback) {
	if span, ok := recording(p.Context); ok {
		span.AddEvent(eventPushback, trace.WithAttributes(
			attrKey.String(p.Key),
			attrStatus.Int(p.StatusCode),
			attrRetryAfter.Float64(p.RetryAfter.Seconds()),
		))
	}
}

// malformedHeader records the header's name, not its value: a value that
// does not parse may be anything, of any length.
func malformedHeader(m policy.MalformedHeader) {
	if span, ok := recording(m.Context); ok {
		span.AddEvent(eventMalformed, trace.WithAttributes(
			attrKey.String(m.Key),
			attrHeader.String(m.Header),
		))
	}
}
