package slogobserver

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/resilix/resilix/policy"
)

// Options says what to log beyond what resilix does to a call. The zero
// Options logs nothing on the success path, and is the recommended setting.
type Options struct {
	// Calls logs every call as RoundTrip returns, "call done": at Debug
	// when it succeeded or the caller gave up, at Info when it failed, was
	// refused or could not be sent. If false, calls are not logged (what
	// went wrong in one is logged as it happens).
	Calls bool

	// Attempts logs, at Debug, "attempt done" for every wire attempt that
	// is otherwise not logged: one that succeeded, and one the caller gave
	// up on. If false, only failed, invalid and discarded attempts are
	// logged.
	Attempts bool

	// Summary is how often a key's summary line comes at most: the
	// counts of what went wrong in its calls since its last one (failed
	// and invalid attempts, skipped retries, refusals by gate, pushbacks,
	// malformed headers), each of which is logged one by one at Debug
	// only. A key's summary is written by the first event of any key
	// after Summary has passed since its counting began, so that no timer
	// runs: a key whose calls stopped has its last counts written by the
	// next event of another key, or never. A key with nothing to count
	// has no summary. If zero, DefaultSummary is used. If negative, no
	// summary is written, and nothing is counted.
	Summary time.Duration
}

// DefaultSummary is the Summary used when the field is zero.
const DefaultSummary = 10 * time.Second

// The messages, one per kind of record; the package doc lists them.
const (
	msgAttemptFailed    = "attempt failed"
	msgAttemptInvalid   = "attempt invalid"
	msgAttemptDiscarded = "attempt discarded"
	msgAttemptDone      = "attempt done"
	msgCallDone         = "call done"
	msgRetrySkipped     = "retry skipped"
	msgHedgeStarted     = "hedge started"
	msgHedgeWon         = "hedge won"
	msgHedgeSuppressed  = "hedge suppressed"
	msgRefused          = "refused"
	msgBreakerOpened    = "breaker opened"
	msgBreakerHalfOpen  = "breaker half-open"
	msgBreakerClosed    = "breaker closed"
	msgBreakerIsolated  = "breaker isolated"
	msgLimitChanged     = "limit changed"
	msgStoreFailing     = "store failing"
	msgStoreRecovered   = "store recovered"
	msgLaneEjected      = "lane ejected"
	msgLaneReturned     = "lane returned"
	msgPushback         = "pushback"
	msgMalformedHeader  = "malformed header"
	msgLanesChanged     = "lanes changed"
	msgSummary          = "summary"
)

// The attribute keys, named as otelmetrics' attributes and, for those it
// has not, as oteltrace's without the resilix. prefix.
const (
	attrKey          = "key"
	attrKind         = "kind"
	attrAttempt      = "attempt"
	attrAttempts     = "attempts"
	attrOutcome      = "outcome"
	attrLatency      = "latency_ms"
	attrDuration     = "duration_ms"
	attrLane         = "lane"
	attrStatus       = "http.response.status_code"
	attrError        = "error"
	attrPriority     = "priority"
	attrReason       = "reason"
	attrGate         = "gate"
	attrBodyTooLarge = "body_too_large"
	attrThreshold    = "threshold_ms"
	attrHeavy        = "tenant.heavy"
	attrRetryAfter   = "retry_after_ms"
	attrFrom         = "from"
	attrTo           = "to"
	attrFor          = "for_ms"
	attrHeader       = "http.header"
	attrValue        = "value"
	attrAdded        = "added"
	attrRemoved      = "removed"
	attrLanes        = "lanes"
	attrSince        = "since_ms"
	attrRefused      = "refused"
)

// The counts of a summary line, in the order it writes them.
const (
	countFailed  = iota // attempt failed
	countInvalid        // attempt invalid
	countSkipped        // retry skipped
	countPushback
	countMalformed
	countRefused // one per Gate from here
)

var countNames = [countRefused]string{"attempts_failed", "attempts_invalid", "retries_skipped", "pushbacks", "malformed_headers"}

// gates is how many counts of refusals a tally has: one per Gate, the
// zero Gate standing for any other.
const gates = 8

// millis returns d as a number of milliseconds, with its fraction: slog's
// JSON handler writes a time.Duration as integer nanoseconds, and its
// text handler as "1.5ms"; a number in a field named for its unit reads
// the same in both.
func millis(key string, d time.Duration) slog.Attr {
	return slog.Float64(key, float64(d)/float64(time.Millisecond))
}

// New returns an Observer that logs to l what resilix does to calls: the
// package doc lists the records, their levels and their attributes. A nil
// l logs to slog.Default(), as it is at each event, so that a later
// slog.SetDefault applies.
//
// Options is taken by value, as every resilix config is: New keeps a copy,
// and the zero Options is the recommended setting.
//
// The Observer holds the summary's counts, per key, for the keys counted
// in the last Options.Summary (one lock, taken only for the events it
// counts), and is safe for concurrent use and for sharing between
// transports. Combine it with others with
// policy.JoinObservers.
func New(l *slog.Logger, opts Options) *policy.Observer {
	if opts.Summary == 0 {
		opts.Summary = DefaultSummary
	}
	o := &observer{l: l, opts: opts, tallies: map[string]*tally{}}
	obs := &policy.Observer{
		AttemptDone:       o.attemptDone,
		Refused:           o.refused,
		RetrySkipped:      o.retrySkipped,
		HedgeStarted:      o.hedgeStarted,
		HedgeWon:          o.hedgeWon,
		HedgeSuppressed:   o.hedgeSuppressed,
		BreakerTransition: o.breakerTransition,
		MalformedHeader:   o.malformedHeader,
		LimitTransition:   o.limitTransition,
		StoreTransition:   o.storeTransition,
		Pushback:          o.pushback,
		LaneEjected:       o.laneEjected,
		LaneReturned:      o.laneReturned,
		LanesChanged:      o.lanesChanged,
	}
	if opts.Calls {
		obs.CallDone = o.callDone
	}
	return obs
}

type observer struct {
	l    *slog.Logger // nil: slog.Default()
	opts Options

	mu      sync.Mutex
	tallies map[string]*tally // by key, those counting now
	due     time.Time         // the earliest end of a tally's interval
}

// tally is what a key's summary counts.
type tally struct {
	since time.Time
	n     [countRefused + gates]int
}

// count counts one event of kind c for key, if the handler would write
// its summary, and then writes the summaries that are due, with no lock
// held. It allocates only for a key that starts counting, and to write.
func (o *observer) count(ctx context.Context, key string, c int) {
	if o.opts.Summary < 0 {
		return
	}
	_, h, ok := o.enabled(ctx, slog.LevelInfo)
	if !ok {
		return
	}
	now := time.Now()
	o.mu.Lock()
	t := o.tallies[key]
	if t == nil {
		t = &tally{since: now}
		o.tallies[key] = t
		if len(o.tallies) == 1 {
			o.due = now.Add(o.opts.Summary)
		}
	}
	t.n[c]++
	if now.Before(o.due) {
		o.mu.Unlock()
		return
	}
	var done []summary
	o.due = time.Time{}
	for k, t := range o.tallies {
		if end := t.since.Add(o.opts.Summary); now.Before(end) {
			if o.due.IsZero() || end.Before(o.due) {
				o.due = end
			}
			continue
		}
		done = append(done, summary{key: k, since: now.Sub(t.since), n: t.n})
		delete(o.tallies, k)
	}
	o.mu.Unlock()
	slices.SortFunc(done, func(a, b summary) int { return strings.Compare(a.key, b.key) })
	for _, s := range done {
		s.emit(context.Background(), h) // no one call's: the summary is the key's
	}
}

// summary is a tally taken out to be written.
type summary struct {
	key   string
	since time.Duration
	n     [countRefused + gates]int
}

// emit writes the summary at Info: the key, the span counted, and each
// count that is not zero, the refusals as a group by gate.
func (s summary) emit(ctx context.Context, h slog.Handler) {
	attrs := make([]slog.Attr, 0, 2+countRefused+1)
	attrs = append(attrs, slog.String(attrKey, s.key), millis(attrSince, s.since))
	for c, name := range countNames {
		if s.n[c] > 0 {
			attrs = append(attrs, slog.Int(name, s.n[c]))
		}
	}
	var refused []any
	for g, n := range s.n[countRefused:] {
		if n > 0 {
			name := "other"
			if g > 0 {
				name = policy.Gate(g).String()
			}
			refused = append(refused, slog.Int(name, n))
		}
	}
	if len(refused) > 0 {
		attrs = append(attrs, slog.Group(attrRefused, refused...))
	}
	emit(ctx, h, slog.LevelInfo, msgSummary, attrs...)
}

// enabled returns the handler to log a record at level to, and whether it
// would: every func asks before it builds its attributes, so that a
// record filtered out costs no allocation. A nil context, possible only
// in an event built by hand, is read as context.Background(), as
// slog.Logger does.
func (o *observer) enabled(ctx context.Context, level slog.Level) (context.Context, slog.Handler, bool) {
	l := o.l
	if l == nil {
		l = slog.Default()
	}
	if ctx == nil {
		ctx = context.Background()
	}
	h := l.Handler()
	return ctx, h, h.Enabled(ctx, level)
}

// emit hands the record to h, with no source position: the line that logs
// is in resilix, not in the caller's code. Like slog.Logger, it drops the
// handler's error.
func emit(ctx context.Context, h slog.Handler, level slog.Level, msg string, attrs ...slog.Attr) {
	r := slog.NewRecord(time.Now(), level, msg, 0)
	r.AddAttrs(attrs...)
	_ = h.Handle(ctx, r)
}

func (o *observer) attemptDone(a policy.AttemptInfo) {
	level, msg := slog.LevelDebug, msgAttemptDone
	switch a.Outcome {
	case policy.Failure:
		msg = msgAttemptFailed
		o.count(a.Context, a.Key, countFailed)
	case policy.Invalid:
		msg = msgAttemptInvalid
		o.count(a.Context, a.Key, countInvalid)
	case policy.Discarded:
		msg = msgAttemptDiscarded
	default: // the success path, or the caller gave up
		if !o.opts.Attempts {
			return
		}
	}
	ctx, h, ok := o.enabled(a.Context, level)
	if !ok {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs,
		slog.String(attrKey, a.Key),
		slog.String(attrKind, a.Kind.String()),
		slog.Int(attrAttempt, a.Attempt),
		slog.String(attrOutcome, a.Outcome.String()),
		millis(attrLatency, a.Latency),
	)
	if a.Lane != "" {
		attrs = append(attrs, slog.String(attrLane, a.Lane))
	}
	attrs = result(attrs, a.StatusCode, a.Err)
	emit(ctx, h, level, msg, attrs...)
}

// result appends what an attempt or a call came back with: a status, an
// error, or both for a hand-built event.
func result(attrs []slog.Attr, status int, err error) []slog.Attr {
	if status != 0 {
		attrs = append(attrs, slog.Int(attrStatus, status))
	}
	if err != nil {
		attrs = append(attrs, slog.Any(attrError, err))
	}
	return attrs
}

func (o *observer) callDone(c policy.CallInfo) {
	level := slog.LevelInfo
	if c.Outcome == policy.Success || c.Outcome == policy.Canceled {
		level = slog.LevelDebug
	}
	ctx, h, ok := o.enabled(c.Context, level)
	if !ok {
		return
	}
	attrs := make([]slog.Attr, 0, 7)
	attrs = append(attrs,
		slog.String(attrKey, c.Key),
		slog.String(attrOutcome, c.Outcome.String()),
		slog.String(attrPriority, c.Priority.String()),
		millis(attrDuration, c.Duration),
		slog.Int(attrAttempts, c.WireAttempts),
	)
	attrs = result(attrs, c.StatusCode, c.Err)
	emit(ctx, h, level, msgCallDone, attrs...)
}

func (o *observer) retrySkipped(s policy.RetrySkip) {
	o.count(s.Context, s.Key, countSkipped)
	ctx, h, ok := o.enabled(s.Context, slog.LevelDebug)
	if !ok {
		return
	}
	attrs := make([]slog.Attr, 0, 6)
	attrs = append(attrs,
		slog.String(attrKey, s.Key),
		slog.Int(attrAttempt, s.Attempt),
		slog.String(attrPriority, s.Priority.String()),
		slog.String(attrReason, s.Reason.String()),
	)
	if s.Reason == policy.SkipGate {
		attrs = append(attrs, slog.String(attrGate, s.Gate.String()))
	}
	if s.BodyTooLarge {
		attrs = append(attrs, slog.Bool(attrBodyTooLarge, true))
	}
	emit(ctx, h, slog.LevelDebug, msgRetrySkipped, attrs...)
}

func (o *observer) hedgeStarted(i policy.HedgeInfo) { o.hedge(msgHedgeStarted, i) }

func (o *observer) hedgeWon(i policy.HedgeInfo) { o.hedge(msgHedgeWon, i) }

func (o *observer) hedge(msg string, i policy.HedgeInfo) {
	ctx, h, ok := o.enabled(i.Context, slog.LevelDebug)
	if !ok {
		return
	}
	emit(ctx, h, slog.LevelDebug, msg,
		slog.String(attrKey, i.Key),
		slog.Int(attrAttempt, i.Attempt),
		slog.String(attrPriority, i.Priority.String()),
		millis(attrThreshold, i.Threshold),
	)
}

func (o *observer) hedgeSuppressed(s policy.HedgeSuppression) {
	ctx, h, ok := o.enabled(s.Context, slog.LevelDebug)
	if !ok {
		return
	}
	emit(ctx, h, slog.LevelDebug, msgHedgeSuppressed,
		slog.String(attrKey, s.Key),
		slog.String(attrPriority, s.Priority.String()),
		slog.String(attrReason, s.Reason.String()),
	)
}

func (o *observer) refused(r policy.Refusal) {
	g := int(r.Gate)
	if g >= gates {
		g = 0
	}
	o.count(r.Context, r.Key, countRefused+g)
	ctx, h, ok := o.enabled(r.Context, slog.LevelDebug)
	if !ok {
		return
	}
	attrs := make([]slog.Attr, 0, 6)
	attrs = append(attrs,
		slog.String(attrKey, r.Key),
		slog.String(attrKind, r.Kind.String()),
		slog.String(attrGate, r.Gate.String()),
		slog.String(attrPriority, r.Priority.String()),
		slog.Bool(attrHeavy, r.HeavyTenant),
	)
	if r.Err != nil && r.Err.RetryAfter > 0 {
		attrs = append(attrs, millis(attrRetryAfter, r.Err.RetryAfter))
	}
	emit(ctx, h, slog.LevelDebug, msgRefused, attrs...)
}

func (o *observer) breakerTransition(b policy.BreakerTransition) {
	level, msg := slog.LevelInfo, msgBreakerClosed
	switch b.To {
	case policy.BreakerOpen:
		level, msg = slog.LevelWarn, msgBreakerOpened
	case policy.BreakerHalfOpen:
		msg = msgBreakerHalfOpen
	case policy.BreakerIsolated:
		level, msg = slog.LevelWarn, msgBreakerIsolated
	}
	ctx, h, ok := o.enabled(b.Context, level)
	if !ok {
		return
	}
	emit(ctx, h, level, msg,
		slog.String(attrKey, b.Key),
		slog.String(attrFrom, b.From.String()),
		slog.String(attrTo, b.To.String()),
	)
}

func (o *observer) limitTransition(l policy.LimitTransition) {
	ctx, h, ok := o.enabled(l.Context, slog.LevelDebug)
	if !ok {
		return
	}
	emit(ctx, h, slog.LevelDebug, msgLimitChanged,
		slog.String(attrKey, l.Key),
		slog.Int(attrFrom, l.From),
		slog.Int(attrTo, l.To),
	)
}

func (o *observer) storeTransition(s policy.StoreTransition) {
	level, msg := slog.LevelWarn, msgStoreFailing
	if s.To == policy.StoreUp {
		level, msg = slog.LevelInfo, msgStoreRecovered
	}
	ctx, h, ok := o.enabled(s.Context, level)
	if !ok {
		return
	}
	attrs := make([]slog.Attr, 0, 4)
	attrs = append(attrs,
		slog.String(attrKey, s.Key),
		slog.String(attrFrom, s.From.String()),
		slog.String(attrTo, s.To.String()),
	)
	if s.Err != nil {
		attrs = append(attrs, slog.Any(attrError, s.Err))
	}
	emit(ctx, h, level, msg, attrs...)
}

func (o *observer) laneEjected(e policy.LaneEjection) { o.lane(slog.LevelWarn, msgLaneEjected, e) }

func (o *observer) laneReturned(e policy.LaneEjection) { o.lane(slog.LevelInfo, msgLaneReturned, e) }

func (o *observer) lane(level slog.Level, msg string, e policy.LaneEjection) {
	ctx, h, ok := o.enabled(e.Context, level)
	if !ok {
		return
	}
	emit(ctx, h, level, msg,
		slog.String(attrKey, e.Key),
		slog.String(attrLane, policy.LaneName(e.Addr, e.Index)),
		slog.String(attrReason, e.Reason.String()),
		millis(attrFor, e.For),
	)
}

func (o *observer) pushback(p policy.Pushback) {
	o.count(p.Context, p.Key, countPushback)
	ctx, h, ok := o.enabled(p.Context, slog.LevelDebug)
	if !ok {
		return
	}
	emit(ctx, h, slog.LevelDebug, msgPushback,
		slog.String(attrKey, p.Key),
		slog.Int(attrStatus, p.StatusCode),
		millis(attrRetryAfter, p.RetryAfter),
	)
}

// malformedHeader logs the value as resilix gives it, at most its first 64
// bytes: a handler quotes it as it quotes any string.
func (o *observer) malformedHeader(m policy.MalformedHeader) {
	o.count(m.Context, m.Key, countMalformed)
	ctx, h, ok := o.enabled(m.Context, slog.LevelDebug)
	if !ok {
		return
	}
	emit(ctx, h, slog.LevelDebug, msgMalformedHeader,
		slog.String(attrKey, m.Key),
		slog.String(attrHeader, m.Header),
		slog.String(attrValue, m.Value),
	)
}

// lanesChanged logs, at Info, a key's lanes after an answer of its
// Endpoints that changed them: the addresses added and removed, and how
// many lanes it has.
func (o *observer) lanesChanged(c policy.LaneSetChange) {
	ctx, h, ok := o.enabled(c.Context, slog.LevelInfo)
	if !ok {
		return
	}
	emit(ctx, h, slog.LevelInfo, msgLanesChanged,
		slog.String(attrKey, c.Key),
		slog.Any(attrAdded, c.Added),
		slog.Any(attrRemoved, c.Removed),
		slog.Int(attrLanes, c.Lanes),
	)
}
