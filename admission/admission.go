package admission

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
	"weak"

	"github.com/resilix/resilix/attempt"
	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/tenant"
)

// Config configures Handler. The zero Config is valid: a server that
// trusts no caller's priority or tenant (every request is Critical), honours
// propagated deadlines and attempt numbers, and admits through a limiter
// with policy.Limiter's defaults.
type Config struct {
	// Name is the key the server's events carry to the Observer
	// (Refusal.Key, MalformedHeader.Key, LimitTransition.Key) and the key
	// its state is reported under by Observer.Attach's source: the
	// attribute key in otelmetrics. If empty, "admission" is used.
	Name string

	// Limiter configures the adaptive concurrency limiter requests are
	// admitted through; see policy.Limiter. Its zero value is the
	// recommended setting: an initial limit of 20 within [1, 1000] and a
	// queue of half the limit. A negative QueueFactor makes nothing wait.
	Limiter policy.Limiter

	// Trust reports whether the caller of r may set its request's
	// priority and name its tenant, and, with LoadReports at its default,
	// is told the server's load: another of your services, say, told by
	// its network address or its client certificate. It is called at
	// most once per request, and only for a request that carries a
	// priority or a tenant header its context does not override, or that
	// would be answered with a load report if trusted. If nil,
	// no caller is trusted: every request gets DefaultPriority and no
	// tenant, whatever its headers say (and next's request goes without
	// them; see the package doc), which is the safe choice for a server
	// reachable from outside.
	Trust func(r *http.Request) bool

	// LoadReports says to whom the server reports its load, on each
	// response, in ORCA's endpoint-load-metrics header (see the package
	// doc). If zero (ReportTrusted), to the callers Trust trusts, and so
	// to nobody while Trust is nil: the load says how close the server is
	// to refusing, which helps a picker choose among replicas and an
	// attacker time a flood to the moment the queue is full, so it is
	// given, as priorities are taken, only where Trust says so.
	LoadReports Reporting

	// NoTies turns off the signal of tied requests: a request marked as
	// tied (the Resilix-Tie header, which a resilix transport writes on
	// the legs of a tied round) is then served as any other, and its
	// caller's transport, hearing nothing, hedges as usual. By default
	// every such request is told when next takes it, whoever its caller:
	// see the package doc's "Tied requests".
	NoTies bool

	// DefaultPriority is the priority of a request from an untrusted
	// caller, or from a trusted one that sends none (or one that cannot be
	// parsed). Its zero value is shedding.Critical, Google's default
	// criticality: a server that trusts nobody then runs a classic,
	// priority-blind limiter. It must be one of the four priorities.
	DefaultPriority shedding.Priority

	// MinTimeout is the least time a request must have left for next to
	// be called: one whose propagated deadline (or its context's own)
	// leaves less, at arrival or once admitted from the queue, is refused
	// with 504. If zero, only a request whose time has run out is refused.
	// It must not be negative. A request with no deadline is never refused
	// for time.
	MinTimeout time.Duration

	// Observer receives the server's refusals, malformed headers and
	// limit moves, and a source of its state (Observer.Attach). It is
	// copied. If nil, nothing is reported and nothing is paid.
	Observer *policy.Observer

	// PriorityHeader is the header a priority is read from. If empty,
	// "Resilix-Priority" is used, as in transport.Config.
	PriorityHeader string
	// TenantHeader is the header a tenant id is read from. If empty,
	// "Resilix-Tenant" is used.
	TenantHeader string
	// TimeoutHeader is the header the caller's time left is read from, in
	// whole milliseconds. If empty, "Resilix-Timeout-Ms" is used.
	TimeoutHeader string
	// AttemptHeader is the header the caller's attempt number is read
	// from. If empty, "Resilix-Attempt" is used.
	AttemptHeader string
}

// Reporting says to whom a server reports its load (Config.LoadReports).
type Reporting int8

const (
	// ReportTrusted reports to the callers Config.Trust trusts.
	ReportTrusted Reporting = 0
	// ReportAll reports to every caller: for a server only your own
	// services reach.
	ReportAll Reporting = 1
	// ReportNone reports to nobody.
	ReportNone Reporting = -1
)

// DefaultName is the Name used when Config.Name is empty.
const DefaultName = "admission"

// Handler returns a handler that admits requests to next as the package
// doc describes, or an error that names every invalid field of cfg, one per
// line (an errors.Join):
//
//	admission: MinTimeout must be >= 0, got -1s
//	admission: policy: Limiter.QueueFactor must be a number <= 100, got 200
//
// Handler copies what it keeps; editing cfg afterwards changes nothing.
//
// The ResponseWriter next gets records the status next sends and passes
// everything through. It implements http.Flusher, http.Hijacker,
// io.ReaderFrom and io.StringWriter, each passed on through
// http.ResponseController (so Hijack returns its error where the server's
// writer cannot hijack, as under HTTP/2), and unwraps to the server's
// writer for the rest of what http.ResponseController offers.
func Handler(next http.Handler, cfg Config) (http.Handler, error) {
	var errs []error
	if next == nil {
		errs = append(errs, errors.New("admission: next is nil"))
	}
	names, herrs := httpx.Headers{cfg.PriorityHeader, cfg.TenantHeader, cfg.TimeoutHeader, cfg.AttemptHeader}.Canonical("admission")
	errs = append(errs, herrs...)
	if !cfg.DefaultPriority.Valid() {
		errs = append(errs, fmt.Errorf("admission: DefaultPriority must be one of critical, degraded, best_effort or bulk, got %v", cfg.DefaultPriority))
	}
	if cfg.MinTimeout < 0 {
		errs = append(errs, fmt.Errorf("admission: MinTimeout must be >= 0, got %v", cfg.MinTimeout))
	}
	if r := cfg.LoadReports; r != ReportTrusted && r != ReportAll && r != ReportNone {
		errs = append(errs, fmt.Errorf("admission: LoadReports must be ReportTrusted, ReportAll or ReportNone, got %d", r))
	}
	lim := cfg.Limiter
	if err := (&policy.Set{Limiter: &lim}).Validate(); err != nil {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				errs = append(errs, fmt.Errorf("admission: %w", e))
			}
		} else {
			errs = append(errs, fmt.Errorf("admission: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	s := &server{
		next:       next,
		name:       cfg.Name,
		trust:      cfg.Trust,
		def:        cfg.DefaultPriority,
		minTimeout: cfg.MinTimeout,
		prioHeader: names[0],
		tenHeader:  names[1],
		timeHeader: names[2],
		attHeader:  names[3],
		limiter:    gate.NewLimiter(lim.WithDefaults(), time.Now(), new(gate.Tenants)),
		reports:    cfg.LoadReports,
		ties:       !cfg.NoTies,
	}
	if s.reports == ReportTrusted && s.trust == nil {
		s.reports = ReportNone
	}
	if s.name == "" {
		s.name = DefaultName
	}
	if cfg.Observer != nil {
		// A copy: the funcs are called concurrently, so a later edit of
		// the caller's struct would be a data race.
		o := *cfg.Observer
		s.obs = &o
		if o.Attach != nil {
			o.Attach(source{weak.Make(s)})
		}
	}
	return s, nil
}

// server is the handler Handler returns.
type server struct {
	next       http.Handler
	name       string
	trust      func(*http.Request) bool
	def        shedding.Priority
	minTimeout time.Duration
	obs        *policy.Observer
	prioHeader string // canonical
	tenHeader  string
	timeHeader string
	attHeader  string
	limiter    *gate.Limiter
	malformed  atomic.Uint64
	reports    Reporting // ReportNone when Trust is nil and would decide
	served     rateMeter // requests next finished, for rps_fractional
	ties       bool      // tied requests are told when they start
}

// request is what the server knows of one request before admitting it.
type request struct {
	ctx      context.Context // the request's, with priority, tenant and attempt
	prio     shedding.Priority
	tenant   string
	attempt  int // 0: none
	deadline time.Time
	expires  bool // deadline is set
	// propagated: deadline came from the timeout header and is earlier
	// than the context's own, so next's context needs it.
	propagated bool
	// drop names the headers next's request goes without: those whose
	// value admission did not take (see read).
	drop dropped
	// trust is what Trust said of the caller, once asked.
	trust trustAnswer
}

// trustAnswer is what Config.Trust said of a request's caller: asked at
// most once a request.
type trustAnswer uint8

const (
	trustUnasked trustAnswer = iota
	trustYes
	trustNo
)

// trusted reports whether Trust trusts r's caller, asking it at most once
// for q. It is false with no Trust.
func (s *server) trusted(r *http.Request, q *request) bool {
	if q.trust == trustUnasked {
		q.trust = trustNo
		if s.trust != nil && s.trust(r) {
			q.trust = trustYes
		}
	}
	return q.trust == trustYes
}

// reportsTo reports whether the answer to r carries a load report.
func (s *server) reportsTo(r *http.Request, q *request) bool {
	switch s.reports {
	case ReportAll:
		return true
	case ReportTrusted:
		return s.trusted(r, q)
	}
	return false
}

// dropped is a set of the four headers admission reads, one bit each.
type dropped uint8

const (
	dropPriority dropped = 1 << iota
	dropTenant
	dropTimeout
	dropAttempt
)

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrival := time.Now()
	q := s.read(r, arrival)
	if q.expires && s.tooLate(q.deadline, arrival) {
		s.refuseLate(w, r, &q)
		return
	}
	ctx := q.ctx
	if q.propagated {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, q.deadline)
		defer cancel()
	}
	p, d := s.limiter.Acquire(ctx, arrival, q.prio, q.tenant)
	if !d.OK {
		switch {
		case d.Reason != gate.LimiterCanceled:
			s.refuseBusy(w, r, &q, d)
		case q.expires && (errors.Is(ctx.Err(), context.DeadlineExceeded) || !time.Now().Before(q.deadline)):
			s.refuseLate(w, r, &q)
		default:
			// The client went away while it waited: not a refusal.
			w.WriteHeader(statusClientClosed)
		}
		return
	}
	start := arrival
	if d.Waited() {
		start = time.Now()
		if q.expires && s.tooLate(q.deadline, start) {
			s.release(ctx, p, start, 0, policy.Canceled)
			s.refuseLate(w, r, &q)
			return
		}
	}
	if s.ties {
		s.tellStarted(w, r)
	}
	report := s.reportsTo(r, &q)
	if ctx != r.Context() || q.drop != 0 {
		r = r.WithContext(ctx)
		if q.drop != 0 {
			r.Header = s.without(r.Header, q.drop)
		}
	}
	ww := &writer{ResponseWriter: w}
	if report {
		ww.report = s
	}
	s.serve(ww, r, p, start)
}

// tieStarted is the tie header's value on the 103 that says a tied
// request started: one slice for every such answer, since the header
// leaves the map before anything else can see it.
var tieStarted = []string{httpx.TieStarted}

// tellStarted tells the caller of a tied request that next is taking it,
// with a 103 (Early Hints) that carries the tie header: the caller's
// transport then cancels the request's twins still waiting at other
// replicas. The header is taken out of w's map again at once, since
// net/http keeps a 1xx's headers for the final answer (RFC 8297 lets
// it). A malformed mark is counted and ignored, and a client of
// HTTP/1.0, which cannot be sent a 1xx, is told nothing.
func (s *server) tellStarted(w http.ResponseWriter, r *http.Request) {
	v, ok := httpx.First(r.Header, httpx.TieHeader)
	switch {
	case !ok:
		return
	case v != tieMark:
		s.malformedHeader(r.Context(), httpx.TieHeader, v)
		return
	case !r.ProtoAtLeast(1, 1):
		return
	}
	h := w.Header()
	h[httpx.TieHeader] = tieStarted
	w.WriteHeader(http.StatusEarlyHints)
	delete(h, httpx.TieHeader)
}

// tieMark is the tie header's value on a tied request.
const tieMark = "1"

// statusClientClosed answers a request whose client went away while it
// waited: nginx's 499, "client closed request", for the access logs.
const statusClientClosed = 499

// tooLate reports whether a request with deadline has too little time left
// at now to be started.
func (s *server) tooLate(deadline, now time.Time) bool {
	left := deadline.Sub(now)
	return left <= 0 || left < s.minTimeout
}

// serve runs next and releases the permit p however next ends: returning,
// or panicking, in which case the panic goes on once the permit is back.
func (s *server) serve(w *writer, r *http.Request, p gate.LimiterPermit, start time.Time) {
	defer s.done(w, r.Context(), p, start)
	s.next.ServeHTTP(w, r)
	w.returned = true
	if w.status == 0 && !w.hijacked && w.report != nil {
		// net/http sends the 200 of a handler that wrote nothing once it
		// returns, with the header as it is now.
		w.report.writeLoad(w.Header())
	}
}

// done releases the permit of a request next has finished with, with its
// latency and what it says about the handler.
func (s *server) done(w *writer, ctx context.Context, p gate.LimiterPermit, start time.Time) {
	now := time.Now()
	if s.reports != ReportNone {
		s.served.add(now)
	}
	s.release(ctx, p, now, now.Sub(start), outcome(w, ctx.Err()))
}

// outcome classifies a request next has finished with, given its context's
// error at that moment; see the package doc.
func outcome(w *writer, ctxErr error) policy.Outcome {
	switch {
	case !w.returned || w.hijacked:
		return policy.Canceled
	case ctxErr == nil:
		status := w.status
		if status == 0 {
			status = http.StatusOK
		}
		resp := http.Response{StatusCode: status}
		return policy.DefaultClassify(&resp, nil)
	case errors.Is(ctxErr, context.DeadlineExceeded):
		return policy.Failure
	}
	return policy.Canceled
}

func (s *server) release(ctx context.Context, p gate.LimiterPermit, now time.Time, latency time.Duration, o policy.Outcome) {
	ch := s.limiter.Release(p, now, latency, o)
	if !ch.Changed() {
		return
	}
	if obs := s.obs; obs != nil && obs.LimitTransition != nil {
		obs.LimitTransition(policy.LimitTransition{Context: ctx, Key: s.name, From: ch.From, To: ch.To})
	}
}

// without returns a copy of h without the headers in drop, under every
// spelling of their names, for next's request: h is the caller's, and is
// not modified.
func (s *server) without(h http.Header, drop dropped) http.Header {
	h = h.Clone()
	names := [...]string{s.prioHeader, s.tenHeader, s.timeHeader, s.attHeader}
	for k := range h {
		for i, name := range names {
			if drop&(1<<i) != 0 && (k == name || httpx.Spells(k, name)) {
				delete(h, k)
				break
			}
		}
	}
	return h
}

// read reads what r says about itself, as of arrival, into a request: the
// context's values, else the headers' (priority and tenant only from a
// trusted caller), reporting malformed values. Each header whose value it
// does not take goes in q.drop: a priority or a tenant the context
// overrides, or from an untrusted caller, a malformed priority, a
// malformed timeout, and an attempt number the context overrides or that
// is malformed.
func (s *server) read(r *http.Request, arrival time.Time) request {
	ctx := r.Context()
	q := request{ctx: ctx, prio: s.def}
	h := r.Header
	prio, hasPrio := shedding.PriorityFrom(ctx)
	hasPrio = hasPrio && prio.Valid()
	id, hasTenant := tenant.From(ctx)
	pv, sentPrio := httpx.First(h, s.prioHeader)
	tv, sentTenant := httpx.First(h, s.tenHeader)
	trusted := false
	if (sentPrio && !hasPrio) || (sentTenant && !hasTenant) {
		trusted = s.trusted(r, &q)
	}

	if sentPrio {
		q.drop |= dropPriority
	}
	switch {
	case hasPrio:
		q.prio = prio
	case sentPrio && trusted:
		if p, ok := parsePriority(pv); ok {
			q.prio = p
			q.drop &^= dropPriority
		} else {
			s.malformedHeader(ctx, s.prioHeader, pv)
		}
		fallthrough
	default:
		q.ctx = shedding.WithPriority(q.ctx, q.prio)
	}

	switch {
	case hasTenant:
		q.tenant = id
		if sentTenant {
			q.drop |= dropTenant
		}
	case sentTenant && trusted:
		q.tenant = tv
		q.ctx = tenant.With(q.ctx, tv)
	case sentTenant:
		q.ctx = tenant.With(q.ctx, "") // what a transport inside next reads
		q.drop |= dropTenant
	}

	if n, ok := attempt.From(ctx); ok {
		q.attempt = n
		if httpx.Has(h, s.attHeader) {
			q.drop |= dropAttempt
		}
	} else if v, sent := httpx.First(h, s.attHeader); sent {
		if n, ok := parseAttempt(v); ok {
			q.attempt = n
			q.ctx = attempt.With(q.ctx, n)
		} else {
			s.malformedHeader(ctx, s.attHeader, v)
			q.drop |= dropAttempt
		}
	}

	q.deadline, q.expires = ctx.Deadline()
	if v, sent := httpx.First(h, s.timeHeader); sent {
		if ms, ok := parseMillis(v); !ok {
			s.malformedHeader(ctx, s.timeHeader, v)
			q.drop |= dropTimeout
		} else if dl := arrival.Add(time.Duration(ms) * time.Millisecond); !q.expires || dl.Before(q.deadline) {
			q.deadline, q.expires, q.propagated = dl, true, true
		}
	}
	return q
}

func (s *server) malformedHeader(ctx context.Context, header, value string) {
	s.malformed.Add(1)
	if o := s.obs; o != nil && o.MalformedHeader != nil {
		o.MalformedHeader(policy.MalformedHeader{Context: ctx, Key: s.name, Header: header, Value: httpx.Reported(value)})
	}
}

// The bodies of refusals, one line each.
const (
	bodyLate     = "resilix: deadline exceeded: the caller's time ran out or is too short to start the request\n"
	bodyFull     = "resilix: overloaded: the server is at its concurrency limit and its queue is full\n"
	bodyShed     = "resilix: overloaded: shed by priority\n"
	bodyEvicted  = "resilix: overloaded: evicted from the queue by a request of higher priority\n"
	bodyTenant   = "resilix: too many requests: the tenant is above its fair share\n"
	contentType  = "text/plain; charset=utf-8"
	headerRetry  = "Retry-After"
	headerType   = "Content-Type"
	headerSniff  = "X-Content-Type-Options"
	valueNoSniff = "nosniff"
)

// refuseLate refuses a request r whose time ran out, or is below
// MinTimeout.
func (s *server) refuseLate(w http.ResponseWriter, r *http.Request, q *request) {
	s.refused(q, policy.GateDeadline, context.DeadlineExceeded, 0, false)
	if s.reportsTo(r, q) {
		s.writeLoad(w.Header())
	}
	answer(w, http.StatusGatewayTimeout, 0, 0, bodyLate)
}

// refuseBusy refuses a request r the limiter did not admit, as d says.
func (s *server) refuseBusy(w http.ResponseWriter, r *http.Request, q *request, d gate.LimiterDecision) {
	wait := s.limiter.RetryAfter()
	secs := retryAfterSeconds(wait)
	s.refused(q, policy.GateAdmission, policy.ErrShed, time.Duration(secs)*time.Second, d.HeavyTenant)
	status, body := http.StatusServiceUnavailable, bodyFull
	switch {
	case d.HeavyTenant:
		status, body = http.StatusTooManyRequests, bodyTenant
	case d.Reason == gate.LimiterShed:
		status, body = http.StatusTooManyRequests, bodyShed
	case d.Reason == gate.LimiterEvicted:
		status, body = http.StatusTooManyRequests, bodyEvicted
	}
	if s.reportsTo(r, q) {
		s.writeLoad(w.Header())
	}
	answer(w, status, secs, retryAfterMillis(wait), body)
}

// retryAfterSeconds returns a Retry-After for an estimated wait d: whole
// seconds rounded up, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

// retryAfterMillis returns the Resilix-Retry-After-Ms for an estimated
// wait d: whole milliseconds rounded up, at least 1; 0 (no header) when
// there is no estimate yet.
func retryAfterMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return max(1, int64((d+time.Millisecond-1)/time.Millisecond))
}

func (s *server) refused(q *request, g policy.Gate, sentinel error, retryAfter time.Duration, heavy bool) {
	o := s.obs
	if o == nil || o.Refused == nil {
		return
	}
	kind := policy.AttemptFirst
	if q.attempt > 1 {
		kind = policy.AttemptRetry
	}
	err := &policy.RejectedError{Gate: g, Err: sentinel, Key: s.name, Priority: q.prio, RetryAfter: retryAfter}
	o.Refused(policy.Refusal{Context: q.ctx, Key: s.name, Kind: kind, Gate: g, Priority: q.prio, HeavyTenant: heavy, Err: err})
}

// answer writes a refusal: status, Retry-After when retryAfter > 0 (in
// seconds), Resilix-Retry-After-Ms when ms > 0, and a one-line text body.
func answer(w http.ResponseWriter, status int, retryAfter, ms int64, body string) {
	h := w.Header()
	h.Set(headerType, contentType)
	h.Set(headerSniff, valueNoSniff)
	if retryAfter > 0 {
		h.Set(headerRetry, strconv.FormatInt(retryAfter, 10))
	}
	if ms > 0 {
		h[httpx.HoldHeader] = []string{strconv.FormatInt(ms, 10)}
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// source is the policy.StateSource a server gives Observer.Attach. It
// holds the server weakly.
type source struct{ s weak.Pointer[server] }

func (src source) States(f func(key string, s policy.Snapshot)) (alive bool) {
	s := src.s.Value()
	if s == nil {
		return false
	}
	f(s.name, s.snapshot())
	return true
}

// snapshot reads the server's state. It allocates nothing.
func (s *server) snapshot() policy.Snapshot {
	return policy.Snapshot{
		Known:            true,
		HasLimiter:       true,
		LimiterLimit:     s.limiter.Limit(),
		LimiterInFlight:  s.limiter.InFlight(),
		LimiterQueued:    s.limiter.Queued(),
		Pressure:         s.limiter.Pressure(),
		MalformedHeaders: s.malformed.Load(),
	}
}
