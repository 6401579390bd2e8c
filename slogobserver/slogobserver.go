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

	// Summary is how long an interval of the summaries is: the counts of
	// what went wrong in the calls of every key (failed and invalid
	// attempts, skipped retries, refusals by gate, pushbacks, malformed
	// headers), each of which is logged one by one at Debug only, from
	// the first counted event, written together once Summary has passed.
	// They are written by the first counted event, of any key, after
	// the interval, so that no timer runs, or by Flush: counts left when
	// the events stop wait for Flush. A key with nothing to count has no
	// summary. If zero, DefaultSummary is used. If negative, no summary
	// is written, and nothing is counted.
	Summary time.Duration

	// SummaryKeys is how many keys get a summary line of their own each
	// interval: those with the most counted events, ties by key. The
	// counts of the other keys are summed in one more line, so that an
	// interval writes at most SummaryKeys+1 summaries however many keys
	// failed. If zero, DefaultSummaryKeys is used. If negative, every
	// key's counts are in that one line.
	SummaryKeys int
}

// DefaultSummary is the Summary used when the field is zero.
const DefaultSummary = 10 * time.Second

// DefaultSummaryKeys is the SummaryKeys used when the field is zero: 5
// summaries an interval, at most 20 in any 30 s at DefaultSummary.
const DefaultSummaryKeys = 4

// maxTallies bounds the keys counted an interval, as
// transport.DefaultMaxKeys bounds the keys a transport keeps: the events
// of a key past them are added to the other keys' line, which does not
// count the key in other_keys.
const maxTallies = 1024

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
	msgTieCancelled     = "tie cancelled"
	msgTieRanTwice      = "tie ran twice"
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
	msgLaneStarved      = "lane starved"
	msgLaneFed          = "lane fed again"
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
	attrStalled      = "stalled"
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
	attrOtherKeys    = "other_keys"
	attrShare        = "share"
	attrFairShare    = "fair_share"
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

// Logger logs to a *slog.Logger what resilix does to calls, through the
// policy.Observer its Observer method returns: the package doc lists the
// records, their levels and their attributes.
//
// It counts the per-call events of every key over an interval
// (Options.Summary) and writes the counts as summary lines at Info, at
// most Options.SummaryKeys+1 an interval, with no timer: the first
// counted event after the interval writes them. Call Flush at shutdown,
// after the transports' last calls, so that the counts of the last
// interval are written too. It counts each key's attempts by lane, to log
// a lane starved of its share and fed again.
//
// Its memory is bounded whatever keys arrive: the counts of at most 1024
// keys an interval, and those of the lanes (at most policy.MaxLanes each)
// of at most 1024 keys with attempts in the last 20 s.
//
// A Logger is safe for concurrent use, and its Observer may be shared by
// transports and combined with others with policy.JoinObservers.
type Logger struct {
	l    *slog.Logger // nil: slog.Default()
	opts Options
	obs  policy.Observer

	mu        sync.Mutex
	tallies   map[string]*tally // by key, those counted this interval: at most maxTallies
	untracked tally             // the counts of keys past maxTallies this interval
	start     time.Time         // the interval's start; zero: nothing counted

	lanes laneWatch
}

// New returns an Observer that logs to l what resilix does to calls: the
// Observer of NewLogger(l, opts), for a caller that needs no Flush (the
// last interval's summaries are then lost when the process exits).
func New(l *slog.Logger, opts Options) *policy.Observer {
	return NewLogger(l, opts).Observer()
}

// NewLogger returns a Logger that logs to l; a nil l logs to
// slog.Default(), as it is at each event, so that a later slog.SetDefault
// applies. Put its Observer in transport.Config.Observer, and call its
// Flush at shutdown.
//
// Options is taken by value, as every resilix config is: NewLogger keeps
// a copy, and the zero Options is the recommended setting.
func NewLogger(l *slog.Logger, opts Options) *Logger {
	if opts.Summary == 0 {
		opts.Summary = DefaultSummary
	}
	if opts.SummaryKeys == 0 {
		opts.SummaryKeys = DefaultSummaryKeys
	}
	lg := &Logger{l: l, opts: opts, tallies: map[string]*tally{}}
	lg.lanes.keys = map[string]*laneKey{}
	lg.obs = policy.Observer{
		AttemptDone:       lg.attemptDone,
		Refused:           lg.refused,
		RetrySkipped:      lg.retrySkipped,
		HedgeStarted:      lg.hedgeStarted,
		HedgeWon:          lg.hedgeWon,
		TieCancelled:      lg.tieCancelled,
		TieRanTwice:       lg.tieRanTwice,
		HedgeSuppressed:   lg.hedgeSuppressed,
		BreakerTransition: lg.breakerTransition,
		MalformedHeader:   lg.malformedHeader,
		LimitTransition:   lg.limitTransition,
		StoreTransition:   lg.storeTransition,
		Pushback:          lg.pushback,
		LaneEjected:       lg.laneEjected,
		LaneReturned:      lg.laneReturned,
		LanesChanged:      lg.lanesChanged,
	}
	if opts.Calls {
		lg.obs.CallDone = lg.callDone
	}
	return lg
}

// Observer returns the policy.Observer that logs, for
// transport.Config.Observer: the same one each call.
func (lg *Logger) Observer() *policy.Observer { return &lg.obs }

// Flush writes the summaries of what was counted since the last ones
// were written, without waiting for the interval to end, and starts a new
// interval with the next counted event. Call it at shutdown, once the
// transports' calls have returned: nothing else writes the last
// interval's counts. It may be called at any time, and more than once.
func (lg *Logger) Flush() {
	out, ok := lg.at(context.Background(), slog.LevelInfo)
	lg.mu.Lock()
	done := lg.takeLocked(time.Now())
	lg.mu.Unlock()
	if ok {
		write(out.h, done)
	}
}

// tally is what a key's summary counts.
type tally struct {
	since time.Time
	n     [countRefused + gates]int
}

// count counts one event of kind c for key, if the handler would write
// its summary: first, when the interval has passed, it takes out the
// interval's counts and writes them, with no lock held, and the event
// starts the next interval. It allocates only for a key that starts
// counting, and to write.
func (lg *Logger) count(ctx context.Context, key string, c int) {
	if lg.opts.Summary < 0 {
		return
	}
	out, ok := lg.at(ctx, slog.LevelInfo)
	if !ok {
		return
	}
	now := time.Now()
	lg.mu.Lock()
	var done []summary
	if !lg.start.IsZero() && now.Sub(lg.start) >= lg.opts.Summary {
		done = lg.takeLocked(now)
	}
	if lg.start.IsZero() {
		lg.start = now
	}
	t := lg.tallies[key]
	if t == nil {
		t = &lg.untracked
		if len(lg.tallies) < maxTallies {
			t = &tally{since: now}
			lg.tallies[key] = t
		}
	}
	t.n[c]++
	lg.mu.Unlock()
	write(out.h, done)
}

// takeLocked takes out the interval's counts as the summaries to write,
// those of the keys with the most first and the other keys' last, and
// ends the interval. lg.mu must be held.
func (lg *Logger) takeLocked(now time.Time) []summary {
	if lg.start.IsZero() {
		return nil
	}
	done := make([]summary, 0, len(lg.tallies)+1)
	for k, t := range lg.tallies {
		done = append(done, summary{key: k, since: now.Sub(t.since), n: t.n})
	}
	clear(lg.tallies)
	untracked := lg.untracked
	lg.untracked = tally{}
	since := now.Sub(lg.start)
	lg.start = time.Time{}

	slices.SortFunc(done, func(a, b summary) int {
		if c := b.total() - a.total(); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	own := min(max(lg.opts.SummaryKeys, 0), len(done))
	if own == len(done) && untracked == (tally{}) {
		return done
	}
	rest := summary{rest: true, since: since, others: len(done) - own, n: untracked.n}
	for _, s := range done[own:] {
		for c, n := range s.n {
			rest.n[c] += n
		}
	}
	return append(done[:own], rest)
}

// write writes the summaries at Info to h, with no lock held.
func write(h slog.Handler, done []summary) {
	out := sink{ctx: context.Background(), h: h, level: slog.LevelInfo} // no one call's: the summary is the key's
	for _, s := range done {
		s.emit(out)
	}
}

// summary is a tally taken out to be written: a key's, or, with rest
// set, the sum of the other keys'.
type summary struct {
	key    string
	rest   bool
	others int // with rest: how many keys it sums
	since  time.Duration
	n      [countRefused + gates]int
}

func (s *summary) total() int {
	var sum int
	for _, n := range s.n {
		sum += n
	}
	return sum
}

// emit writes the summary to out: the key (or how many other keys it
// sums), the span counted, and each count that is not zero, the refusals
// as a group by gate.
func (s summary) emit(out sink) {
	attrs := make([]slog.Attr, 0, 2+countRefused+1)
	if s.rest {
		attrs = append(attrs, slog.Int(attrOtherKeys, s.others))
	} else {
		attrs = append(attrs, slog.String(attrKey, s.key))
	}
	attrs = append(attrs, millis(attrSince, s.since))
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
	out.log(msgSummary, attrs...)
}

// sink is where a record goes: a handler, the context it is given, and the
// record's level, named once for both the question and the record.
type sink struct {
	ctx   context.Context
	h     slog.Handler
	level slog.Level
}

// at returns the sink of a record at level, and whether its handler would
// write it: every func asks before it builds its attributes, so that a
// record filtered out costs no allocation. A nil context, possible only
// in an event built by hand, is read as context.Background(), as
// slog.Logger does.
func (lg *Logger) at(ctx context.Context, level slog.Level) (sink, bool) {
	l := lg.l
	if l == nil {
		l = slog.Default()
	}
	if ctx == nil {
		ctx = context.Background()
	}
	s := sink{ctx: ctx, h: l.Handler(), level: level}
	return s, s.h.Enabled(ctx, level)
}

// log hands a record to the handler, with no source position: the line
// that logs is in resilix, not in the caller's code. Like slog.Logger, it
// drops the handler's error.
func (s sink) log(msg string, attrs ...slog.Attr) {
	r := slog.NewRecord(time.Now(), s.level, msg, 0)
	r.AddAttrs(attrs...)
	_ = s.h.Handle(s.ctx, r)
}

func (lg *Logger) attemptDone(a policy.AttemptInfo) {
	if a.Lane != "" {
		lg.watchLane(a)
	}
	level, msg := slog.LevelDebug, msgAttemptDone
	switch a.Outcome {
	case policy.Failure:
		msg = msgAttemptFailed
		lg.count(a.Context, a.Key, countFailed)
	case policy.Invalid:
		msg = msgAttemptInvalid
		lg.count(a.Context, a.Key, countInvalid)
	case policy.Discarded:
		msg = msgAttemptDiscarded
	default: // the success path, or the caller gave up
		if !lg.opts.Attempts {
			return
		}
	}
	out, ok := lg.at(a.Context, level)
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
	if a.Stalled {
		attrs = append(attrs, slog.Bool(attrStalled, true))
	}
	attrs = result(attrs, a.StatusCode, a.Err)
	out.log(msg, attrs...)
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

func (lg *Logger) callDone(c policy.CallInfo) {
	level := slog.LevelInfo
	if c.Outcome == policy.Success || c.Outcome == policy.Canceled {
		level = slog.LevelDebug
	}
	out, ok := lg.at(c.Context, level)
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
	out.log(msgCallDone, attrs...)
}

func (lg *Logger) retrySkipped(s policy.RetrySkip) {
	lg.count(s.Context, s.Key, countSkipped)
	out, ok := lg.at(s.Context, slog.LevelDebug)
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
	out.log(msgRetrySkipped, attrs...)
}

func (lg *Logger) hedgeStarted(i policy.HedgeInfo) { lg.hedge(msgHedgeStarted, i) }

func (lg *Logger) hedgeWon(i policy.HedgeInfo) { lg.hedge(msgHedgeWon, i) }

func (lg *Logger) tieCancelled(i policy.HedgeInfo) { lg.hedge(msgTieCancelled, i) }

func (lg *Logger) tieRanTwice(i policy.HedgeInfo) { lg.hedge(msgTieRanTwice, i) }

func (lg *Logger) hedge(msg string, i policy.HedgeInfo) {
	if out, ok := lg.at(i.Context, slog.LevelDebug); ok {
		out.log(msg,
			slog.String(attrKey, i.Key),
			slog.Int(attrAttempt, i.Attempt),
			slog.String(attrPriority, i.Priority.String()),
			millis(attrThreshold, i.Threshold),
		)
	}
}

func (lg *Logger) hedgeSuppressed(s policy.HedgeSuppression) {
	if out, ok := lg.at(s.Context, slog.LevelDebug); ok {
		out.log(msgHedgeSuppressed,
			slog.String(attrKey, s.Key),
			slog.String(attrPriority, s.Priority.String()),
			slog.String(attrReason, s.Reason.String()),
		)
	}
}

func (lg *Logger) refused(r policy.Refusal) {
	g := int(r.Gate)
	if g >= gates {
		g = 0
	}
	lg.count(r.Context, r.Key, countRefused+g)
	out, ok := lg.at(r.Context, slog.LevelDebug)
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
	out.log(msgRefused, attrs...)
}

func (lg *Logger) breakerTransition(b policy.BreakerTransition) {
	level, msg := slog.LevelInfo, msgBreakerClosed
	switch b.To {
	case policy.BreakerOpen:
		level, msg = slog.LevelWarn, msgBreakerOpened
	case policy.BreakerHalfOpen:
		msg = msgBreakerHalfOpen
	case policy.BreakerIsolated:
		level, msg = slog.LevelWarn, msgBreakerIsolated
	}
	if out, ok := lg.at(b.Context, level); ok {
		out.log(msg,
			slog.String(attrKey, b.Key),
			slog.String(attrFrom, b.From.String()),
			slog.String(attrTo, b.To.String()),
		)
	}
}

func (lg *Logger) limitTransition(l policy.LimitTransition) {
	if out, ok := lg.at(l.Context, slog.LevelDebug); ok {
		out.log(msgLimitChanged,
			slog.String(attrKey, l.Key),
			slog.Int(attrFrom, l.From),
			slog.Int(attrTo, l.To),
		)
	}
}

func (lg *Logger) storeTransition(s policy.StoreTransition) {
	level, msg := slog.LevelWarn, msgStoreFailing
	if s.To == policy.StoreUp {
		level, msg = slog.LevelInfo, msgStoreRecovered
	}
	out, ok := lg.at(s.Context, level)
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
	out.log(msg, attrs...)
}

func (lg *Logger) laneEjected(e policy.LaneEjection) {
	lg.lanes.eject(e.Key, policy.LaneName(e.Addr, e.Index), true)
	lg.lane(slog.LevelWarn, msgLaneEjected, e)
}

func (lg *Logger) laneReturned(e policy.LaneEjection) {
	lg.lanes.eject(e.Key, policy.LaneName(e.Addr, e.Index), false)
	lg.lane(slog.LevelInfo, msgLaneReturned, e)
}

func (lg *Logger) lane(level slog.Level, msg string, e policy.LaneEjection) {
	if out, ok := lg.at(e.Context, level); ok {
		out.log(msg,
			slog.String(attrKey, e.Key),
			slog.String(attrLane, policy.LaneName(e.Addr, e.Index)),
			slog.String(attrReason, e.Reason.String()),
			millis(attrFor, e.For),
		)
	}
}

func (lg *Logger) pushback(p policy.Pushback) {
	lg.count(p.Context, p.Key, countPushback)
	if out, ok := lg.at(p.Context, slog.LevelDebug); ok {
		out.log(msgPushback,
			slog.String(attrKey, p.Key),
			slog.Int(attrStatus, p.StatusCode),
			millis(attrRetryAfter, p.RetryAfter),
		)
	}
}

// malformedHeader logs the value as resilix gives it, at most its first 64
// bytes: a handler quotes it as it quotes any string.
func (lg *Logger) malformedHeader(m policy.MalformedHeader) {
	lg.count(m.Context, m.Key, countMalformed)
	if out, ok := lg.at(m.Context, slog.LevelDebug); ok {
		out.log(msgMalformedHeader,
			slog.String(attrKey, m.Key),
			slog.String(attrHeader, m.Header),
			slog.String(attrValue, m.Value),
		)
	}
}

// lanesChanged logs, at Info, a key's lanes after an answer of its
// Endpoints that changed them: the addresses added and removed, and how
// many lanes it has.
func (lg *Logger) lanesChanged(c policy.LaneSetChange) {
	lg.lanes.change(c)
	if out, ok := lg.at(c.Context, slog.LevelInfo); ok {
		out.log(msgLanesChanged,
			slog.String(attrKey, c.Key),
			slog.Any(attrAdded, c.Added),
			slog.Any(attrRemoved, c.Removed),
			slog.Int(attrLanes, c.Lanes),
		)
	}
}
