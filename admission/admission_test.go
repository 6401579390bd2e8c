package admission

import (
	"context"
	"errors"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/attempt"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/internal/orca"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/tenant"
)

// mustHandler builds a handler or fails the test.
func mustHandler(t testing.TB, next http.Handler, cfg Config) *server {
	t.Helper()
	h, err := Handler(next, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h.(*server)
}

// trustAll trusts every caller.
func trustAll(*http.Request) bool { return true }

// seen is what next found in its request's context.
type seen struct {
	called                       int
	prio                         shedding.Priority
	hasPrio                      bool
	tenant                       string
	hasTenant                    bool
	attempt                      int
	hasAttempt                   bool
	deadline                     time.Time
	hasDeadline                  bool
	prioHeader, tenantHeaderSeen string // the headers next still sees
}

// probe is a next that records what it sees and answers 200.
func probe(s *seen) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		s.called++
		s.prio, s.hasPrio = shedding.PriorityFrom(ctx)
		s.tenant, s.hasTenant = tenant.From(ctx)
		s.attempt, s.hasAttempt = attempt.From(ctx)
		s.deadline, s.hasDeadline = ctx.Deadline()
		s.prioHeader = r.Header.Get("Resilix-Priority")
		s.tenantHeaderSeen = r.Header.Get("Resilix-Tenant")
	})
}

// newRequest returns a GET with the given header pairs.
func newRequest(ctx context.Context, kv ...string) *http.Request {
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "http://svc.test/", nil)
	for i := 0; i+1 < len(kv); i += 2 {
		r.Header.Add(kv[i], kv[i+1])
	}
	return r
}

// serve runs one request through h and returns the recorded response.
func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// events records what an Observer hears.
type events struct {
	mu        sync.Mutex
	refusals  []policy.Refusal
	malformed []policy.MalformedHeader
	limits    []policy.LimitTransition
	sources   []policy.StateSource
}

func (e *events) observer() *policy.Observer {
	return &policy.Observer{
		Refused: func(r policy.Refusal) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.refusals = append(e.refusals, r)
		},
		MalformedHeader: func(m policy.MalformedHeader) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.malformed = append(e.malformed, m)
		},
		LimitTransition: func(l policy.LimitTransition) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.limits = append(e.limits, l)
		},
		Attach: func(s policy.StateSource) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.sources = append(e.sources, s)
		},
	}
}

func (e *events) refused() []policy.Refusal {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]policy.Refusal(nil), e.refusals...)
}

// TestHandlerValidates: every invalid field is named, all at once; the
// zero Config is valid.
func TestHandlerValidates(t *testing.T) {
	ok := http.NotFoundHandler()
	if _, err := Handler(ok, Config{}); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	for _, tc := range []struct {
		name string
		next http.Handler
		cfg  Config
		want []string
	}{
		{"nil next", nil, Config{}, []string{"admission: next is nil"}},
		{"header names", ok, Config{PriorityHeader: "a b", TenantHeader: "x:y", TimeoutHeader: "é", AttemptHeader: "(a)"}, []string{
			`admission: PriorityHeader "a b" is not a valid header name`,
			`admission: TenantHeader "x:y" is not a valid header name`,
			`admission: TimeoutHeader "é" is not a valid header name`,
			`admission: AttemptHeader "(a)" is not a valid header name`,
		}},
		{"one header twice", ok, Config{TimeoutHeader: "x-same", AttemptHeader: "X-Same"}, []string{
			`admission: TimeoutHeader and AttemptHeader are both the header "X-Same"`,
		}},
		{"a default taken", ok, Config{TenantHeader: "resilix-priority"}, []string{
			`admission: PriorityHeader and TenantHeader are both the header "Resilix-Priority"`,
		}},
		{"priority", ok, Config{DefaultPriority: 9}, []string{
			"admission: DefaultPriority must be one of critical, degraded, best_effort or bulk, got priority(9)",
		}},
		{"min timeout", ok, Config{MinTimeout: -time.Second}, []string{"admission: MinTimeout must be >= 0, got -1s"}},
		{"limiter", ok, Config{Limiter: policy.Limiter{MinLimit: -1, QueueFactor: math.NaN()}}, []string{
			"admission: policy: Limiter.MinLimit must be >= 0, got -1",
			"admission: policy: Limiter.QueueFactor must be a number <= 100, got NaN",
		}},
		{"all at once", nil, Config{PriorityHeader: "a b", DefaultPriority: 4, MinTimeout: -1, Limiter: policy.Limiter{MaxLimit: -2}}, []string{
			"admission: next is nil",
			`admission: PriorityHeader "a b" is not a valid header name`,
			"admission: DefaultPriority must be one of critical, degraded, best_effort or bulk, got priority(4)",
			"admission: MinTimeout must be >= 0, got -1ns",
			"admission: policy: Limiter.MaxLimit must be >= 0, got -2",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := Handler(tc.next, tc.cfg)
			if err == nil || h != nil {
				t.Fatalf("Handler = %v, %v; want nil and an error", h, err)
			}
			if diff := cmp.Diff(tc.want, strings.Split(err.Error(), "\n")); diff != "" {
				t.Errorf("error lines (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHandlerCopiesItsConfig: editing the Config, or the Observer it
// points to, after Handler changes nothing.
func TestHandlerCopiesItsConfig(t *testing.T) {
	var e events
	obs := e.observer()
	cfg := Config{Observer: obs, Trust: trustAll}
	var s seen
	h := mustHandler(t, probe(&s), cfg)
	cfg.Trust, cfg.DefaultPriority = nil, shedding.Bulk
	obs.MalformedHeader = nil
	serve(h, newRequest(context.Background(), "Resilix-Priority", "degraded", "Resilix-Attempt", "zero"))
	if s.prio != shedding.Degraded {
		t.Errorf("priority %v, want degraded: the trust set at construction", s.prio)
	}
	if len(e.malformed) != 1 {
		t.Errorf("%d malformed headers reported, want 1 by the Observer as it was", len(e.malformed))
	}
}

// TestPriorityIsTrustedOrDefault: a caller's priority is honoured only when
// Trust says so; the others, and trusted callers with none, get
// DefaultPriority; a priority already in the context wins. The priority is
// always in next's context.
func TestPriorityIsTrustedOrDefault(t *testing.T) {
	trustNone := func(*http.Request) bool { return false }
	for _, tc := range []struct {
		name   string
		trust  func(*http.Request) bool
		def    shedding.Priority
		ctx    context.Context
		header string // "" for none
		want   shedding.Priority
		trusts int // calls to Trust
	}{
		{"zero config, no header", nil, 0, nil, "", shedding.Critical, 0},
		{"untrusted critical demoted (nil Trust)", nil, shedding.Bulk, nil, "critical", shedding.Bulk, 0},
		{"untrusted critical demoted", trustNone, shedding.Bulk, nil, "critical", shedding.Bulk, 1},
		{"trusted critical kept", trustAll, shedding.Bulk, nil, "critical", shedding.Critical, 1},
		{"trusted bulk kept", trustAll, shedding.Critical, nil, "BULK", shedding.Bulk, 1},
		{"trusted without a priority", trustAll, shedding.BestEffort, nil, "", shedding.BestEffort, 0},
		{"trusted malformed", trustAll, shedding.Degraded, nil, "urgent", shedding.Degraded, 1},
		{"context wins", trustAll, shedding.Bulk, shedding.WithPriority(context.Background(), shedding.Degraded), "critical", shedding.Degraded, 0},
		{"invalid context priority ignored", trustAll, shedding.Bulk, shedding.WithPriority(context.Background(), 9), "critical", shedding.Critical, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var trusts int
			trust := tc.trust
			if trust != nil {
				trust = func(r *http.Request) bool { trusts++; return tc.trust(r) }
			}
			var s seen
			// No load reports: Trust is counted for the priority alone.
			h := mustHandler(t, probe(&s), Config{Trust: trust, DefaultPriority: tc.def, LoadReports: ReportNone})
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			var kv []string
			if tc.header != "" {
				kv = []string{"Resilix-Priority", tc.header}
			}
			if w := serve(h, newRequest(ctx, kv...)); w.Code != http.StatusOK {
				t.Fatalf("status %d", w.Code)
			}
			if !s.hasPrio || s.prio != tc.want {
				t.Errorf("next's priority %v (%v), want %v", s.prio, s.hasPrio, tc.want)
			}
			if trusts != tc.trusts {
				t.Errorf("Trust called %d times, want %d", trusts, tc.trusts)
			}
		})
	}
}

// TestTenantIsTrustedOrNone: a tenant header is honoured only from a
// trusted caller; an untrusted caller's is replaced by an empty tenant in
// the context, which a transport inside next reads, and removed from the
// request next gets, so that no transport forwards it; a tenant already in
// the context wins, and the header goes too.
func TestTenantIsTrustedOrNone(t *testing.T) {
	for _, tc := range []struct {
		name      string
		trust     func(*http.Request) bool
		ctx       context.Context
		header    string
		want      string
		hasTenant bool
		seen      string // the header next sees
	}{
		{"trusted", trustAll, nil, "acme", "acme", true, "acme"},
		{"untrusted", nil, nil, "acme", "", true, ""},
		{"none sent", trustAll, nil, "", "", false, ""},
		{"context wins", nil, tenant.With(context.Background(), "initech"), "acme", "initech", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s seen
			h := mustHandler(t, probe(&s), Config{Trust: tc.trust})
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			var kv []string
			if tc.header != "" {
				kv = []string{"Resilix-Tenant", tc.header}
			}
			serve(h, newRequest(ctx, kv...))
			if s.tenant != tc.want || s.hasTenant != tc.hasTenant {
				t.Errorf("next's tenant %q (%v), want %q (%v)", s.tenant, s.hasTenant, tc.want, tc.hasTenant)
			}
			if s.tenantHeaderSeen != tc.seen {
				t.Errorf("next sees the header %q, want %q", s.tenantHeaderSeen, tc.seen)
			}
		})
	}
}

// TestAttemptIntoContext: the attempt number travels into the context, from
// any caller; none sent is none in the context.
func TestAttemptIntoContext(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   int
		has    bool
	}{
		{"", 0, false},
		{"1", 1, true},
		{"2", 2, true},
		{" 3 ", 3, true},
		{"2147483647", math.MaxInt32, true},
	} {
		var s seen
		h := mustHandler(t, probe(&s), Config{})
		var kv []string
		if tc.header != "" {
			kv = []string{"Resilix-Attempt", tc.header}
		}
		serve(h, newRequest(context.Background(), kv...))
		if s.attempt != tc.want || s.hasAttempt != tc.has {
			t.Errorf("header %q: next's attempt %d (%v), want %d (%v)", tc.header, s.attempt, s.hasAttempt, tc.want, tc.has)
		}
	}
}

// TestCustomHeaderNames: configured names are read, in any case.
func TestCustomHeaderNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s seen
		h := mustHandler(t, probe(&s), Config{Trust: trustAll,
			PriorityHeader: "x-prio", TenantHeader: "X-TENANT", TimeoutHeader: "x-deadline-ms", AttemptHeader: "x-try"})
		serve(h, newRequest(context.Background(), "X-Prio", "bulk", "X-Tenant", "acme", "X-Deadline-Ms", "1500", "X-Try", "2",
			"Resilix-Priority", "critical"))
		want := seen{called: 1, prio: shedding.Bulk, hasPrio: true, tenant: "acme", hasTenant: true, attempt: 2, hasAttempt: true,
			deadline: time.Now().Add(1500 * time.Millisecond), hasDeadline: true, prioHeader: "critical"}
		if diff := cmp.Diff(want, s, cmp.AllowUnexported(seen{})); diff != "" {
			t.Errorf("next saw (-want +got):\n%s", diff)
		}
	})
}

// TestDeadlineFromHeader: the time left becomes next's deadline, counted
// from arrival, unless the context's own is earlier; next's context ends
// at it.
func TestDeadlineFromHeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s seen
		h := mustHandler(t, probe(&s), Config{})
		arrival := time.Now()
		serve(h, newRequest(context.Background(), "Resilix-Timeout-Ms", "250"))
		if want := arrival.Add(250 * time.Millisecond); !s.hasDeadline || !s.deadline.Equal(want) {
			t.Errorf("deadline %v (%v), want arrival + 250ms", s.deadline.Sub(arrival), s.hasDeadline)
		}

		earlier, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		serve(h, newRequest(earlier, "Resilix-Timeout-Ms", "250"))
		if d, _ := earlier.Deadline(); !s.deadline.Equal(d) {
			t.Errorf("deadline arrival + %v, want the context's own, earlier one", s.deadline.Sub(arrival))
		}
		later, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		serve(h, newRequest(later, "Resilix-Timeout-Ms", "250"))
		if want := arrival.Add(250 * time.Millisecond); !s.deadline.Equal(want) {
			t.Errorf("deadline arrival + %v, want the header's, earlier than the context's", s.deadline.Sub(arrival))
		}
		serve(h, newRequest(context.Background()))
		if s.hasDeadline {
			t.Error("a deadline without a header or one on the context")
		}

		// next's context ends at the deadline; the slow sample is a
		// failure the limiter learns (not asserted here: see TestOutcome).
		var ended time.Duration
		slow := mustHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			<-r.Context().Done()
			ended = time.Since(start)
			if !errors.Is(r.Context().Err(), context.DeadlineExceeded) {
				t.Errorf("next's context ended with %v", r.Context().Err())
			}
		}), Config{})
		serve(slow, newRequest(context.Background(), "Resilix-Timeout-Ms", "40"))
		if ended != 40*time.Millisecond {
			t.Errorf("next's context ended after %v, want 40ms", ended)
		}
		if slow.limiter.InFlight() != 0 {
			t.Error("permit not released")
		}
	})
}

// TestLateRequestsNeverReachNext: a request whose time has run out, or is
// below MinTimeout, is answered 504 without calling next, and reported as
// refused by GateDeadline.
func TestLateRequestsNeverReachNext(t *testing.T) {
	background := func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }
	past := func() (context.Context, context.CancelFunc) {
		return context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	}
	soon := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 5*time.Millisecond)
	}
	for _, tc := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		min     time.Duration
		timeout string
		late    bool
	}{
		{"no time left", background, 0, "0", true},
		{"context expired", past, 0, "", true},
		{"context expired, header later", past, 0, "5000", true},
		{"below MinTimeout", background, 10 * time.Millisecond, "9", true},
		{"context below MinTimeout", soon, 10 * time.Millisecond, "", true},
		{"at MinTimeout", background, 10 * time.Millisecond, "10", false},
		{"one millisecond", background, 0, "1", false},
		{"no deadline, MinTimeout set", background, time.Second, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var e events
				var s seen
				h := mustHandler(t, probe(&s), Config{MinTimeout: tc.min, Observer: e.observer(), Trust: trustAll})
				var kv []string
				if tc.timeout != "" {
					kv = []string{"Resilix-Timeout-Ms", tc.timeout}
				}
				kv = append(kv, "Resilix-Priority", "degraded", "Resilix-Attempt", "2")
				ctx, cancel := tc.ctx()
				defer cancel()
				w := serve(h, newRequest(ctx, kv...))
				if !tc.late {
					if s.called != 1 || w.Code != http.StatusOK {
						t.Fatalf("next called %d times, status %d; want once, 200", s.called, w.Code)
					}
					return
				}
				if s.called != 0 {
					t.Fatal("next was called")
				}
				if w.Code != http.StatusGatewayTimeout || w.Header().Get("Retry-After") != "" || w.Body.String() != bodyLate {
					t.Errorf("answer %d, Retry-After %q, body %q; want 504, none, %q", w.Code, w.Header().Get("Retry-After"), w.Body, bodyLate)
				}
				rs := e.refused()
				if len(rs) != 1 {
					t.Fatalf("%d refusals reported, want 1", len(rs))
				}
				r := rs[0]
				if r.Gate != policy.GateDeadline || r.Key != DefaultName || r.Priority != shedding.Degraded || r.Kind != policy.AttemptRetry ||
					!errors.Is(r.Err, policy.ErrRejected) || !errors.Is(r.Err, context.DeadlineExceeded) || r.Err.RetryAfter != 0 {
					t.Errorf("refusal %+v, err %v", r, r.Err)
				}
				if h.limiter.InFlight() != 0 {
					t.Error("a permit is held")
				}
			})
		})
	}
}

// blocker is a next that holds each request until released, counting
// those it started.
type blocker struct {
	started atomic.Int64
	release chan struct{}
}

func newBlocker() *blocker { return &blocker{release: make(chan struct{})} }

func (b *blocker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.started.Add(1)
	select {
	case <-b.release:
	case <-r.Context().Done():
	}
}

// inBackground serves r in a goroutine and waits until it blocks (inside
// next or in the queue); its recorder is ready once done is closed.
func inBackground(h http.Handler, r *http.Request) (w *httptest.ResponseRecorder, done chan struct{}) {
	w, done = httptest.NewRecorder(), make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(w, r)
	}()
	synctest.Wait()
	return w, done
}

// TestTimeRunsOutInTheQueue: a request whose deadline passes while it
// waits for a slot is refused as late, and one admitted from the queue
// with less than MinTimeout left is refused rather than started.
func TestTimeRunsOutInTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var e events
		b := newBlocker()
		h := mustHandler(t, b, Config{
			Limiter: policy.Limiter{InitialLimit: 1, MaxLimit: 1, QueueFactor: 1}, MinTimeout: 50 * time.Millisecond, Observer: e.observer(),
		})
		_, first := inBackground(h, newRequest(context.Background()))
		start := time.Now()
		// Below MinTimeout at arrival: refused at once, without queueing.
		if w := serve(h, newRequest(context.Background(), "Resilix-Timeout-Ms", "49")); w.Code != http.StatusGatewayTimeout || time.Since(start) != 0 {
			t.Errorf("a request below MinTimeout at arrival: %d after %v, want 504 at once", w.Code, time.Since(start))
		}
		late := serve(h, newRequest(context.Background(), "Resilix-Timeout-Ms", "100"))
		if late.Code != http.StatusGatewayTimeout || time.Since(start) != 100*time.Millisecond {
			t.Errorf("a request queued past its deadline: %d after %v, want 504 at the deadline", late.Code, time.Since(start))
		}
		// Admitted after 100ms of its 120: less than MinTimeout left.
		w, second := inBackground(h, newRequest(context.Background(), "Resilix-Timeout-Ms", "120"))
		time.Sleep(100 * time.Millisecond)
		b.release <- struct{}{}
		<-first
		<-second
		if w.Code != http.StatusGatewayTimeout {
			t.Errorf("admitted with 20ms left of a 50ms minimum: %d, want 504", w.Code)
		}
		if n := b.started.Load(); n != 1 {
			t.Errorf("next started %d requests, want 1", n)
		}
		if rs := e.refused(); len(rs) != 3 || rs[0].Gate != policy.GateDeadline || rs[1].Gate != policy.GateDeadline || rs[2].Gate != policy.GateDeadline {
			t.Errorf("refusals %+v, want three by the deadline gate", rs)
		}
		if h.limiter.InFlight() != 0 || h.limiter.Queued() != 0 {
			t.Errorf("in flight %d, queued %d at the end", h.limiter.InFlight(), h.limiter.Queued())
		}
	})
}

// TestRefusalIs503WithRetryAfter: at the limit with a full queue, a request
// is refused with 503, a Retry-After from the queue's state and a body
// naming the reason, reported as GateAdmission.
func TestRefusalIs503WithRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var e events
		b := newBlocker()
		slowFirst := true
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if slowFirst {
				time.Sleep(3 * time.Second)
				return
			}
			b.ServeHTTP(w, r)
		})
		h := mustHandler(t, next, Config{
			Name: "svc", Limiter: policy.Limiter{InitialLimit: 1, MaxLimit: 1, QueueFactor: 1}, Observer: e.observer(),
		})
		refuse := func(want string) {
			t.Helper()
			_, first := inBackground(h, newRequest(context.Background()))
			_, second := inBackground(h, newRequest(context.Background())) // queued
			w := serve(h, newRequest(context.Background()))
			if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != want || w.Body.String() != bodyFull {
				t.Errorf("answer %d, Retry-After %q, body %q; want 503, %q, %q", w.Code, w.Header().Get("Retry-After"), w.Body, want, bodyFull)
			}
			close(b.release)
			<-first
			<-second
			b.release = make(chan struct{})
		}
		slowFirst = false
		refuse("1") // no baseline yet: the least HTTP can say

		// A round of 20 requests at 3s each teaches the baseline: one slot
		// frees every 3s, and the refused request would be second in line.
		slowFirst = true
		for range 20 {
			serve(h, newRequest(context.Background()))
		}
		slowFirst = false
		refuse("6")

		rs := e.refused()
		if len(rs) != 2 {
			t.Fatalf("%d refusals, want 2", len(rs))
		}
		r := rs[1]
		if r.Gate != policy.GateAdmission || r.Key != "svc" || r.Kind != policy.AttemptFirst || r.HeavyTenant ||
			!errors.Is(r.Err, policy.ErrShed) || !errors.Is(r.Err, policy.ErrRejected) || r.Err.RetryAfter != 6*time.Second {
			t.Errorf("refusal %+v, err %v", r, r.Err)
		}
	})
}

// TestHeavyTenantGets429: a tenant above its fair share is refused with
// 429 while a lighter tenant is admitted: here, evicted from a full queue
// by the lighter one, and refused on arrival at the full queue.
func TestHeavyTenantGets429(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var e events
		b := newBlocker()
		quick := true
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !quick {
				b.ServeHTTP(w, r)
			}
		})
		h := mustHandler(t, next, Config{
			Trust: trustAll, Limiter: policy.Limiter{InitialLimit: 1, MaxLimit: 1, QueueFactor: 1}, Observer: e.observer(),
		})
		as := func(id string) *http.Request { return newRequest(context.Background(), "Resilix-Tenant", id) }
		for i := range 10 { // acme makes 9 of the last 10 requests
			id := "acme"
			if i == 0 {
				id = "globex"
			}
			serve(h, as(id))
		}
		quick = false
		_, blocked := inBackground(h, newRequest(context.Background())) // no tenant
		heavy, queued := inBackground(h, as("acme"))
		light, admitted := inBackground(h, as("globex")) // evicts acme's
		<-queued
		again := serve(h, as("acme")) // the queue is full of a lighter tenant
		close(b.release)
		<-blocked
		<-admitted
		for _, w := range []*httptest.ResponseRecorder{heavy, again} {
			if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || w.Body.String() != bodyTenant {
				t.Errorf("heavy tenant: %d, Retry-After %q, body %q; want 429 with Retry-After, %q", w.Code, w.Header().Get("Retry-After"), w.Body, bodyTenant)
			}
		}
		if light.Code != http.StatusOK {
			t.Errorf("light tenant: %d, want 200", light.Code)
		}
		for _, r := range e.refused() {
			if r.Gate != policy.GateAdmission || !r.HeavyTenant || !errors.Is(r.Err, policy.ErrShed) {
				t.Errorf("refusal %+v", r)
			}
		}
		if n := len(e.refused()); n != 2 {
			t.Errorf("%d refusals, want 2", n)
		}
	})
}

// TestPanicReleasesThePermit: a panic in next, http.ErrAbortHandler
// included, releases the permit and goes on with its own value.
func TestPanicReleasesThePermit(t *testing.T) {
	for _, v := range []any{"boom", http.ErrAbortHandler} {
		var panics atomic.Bool
		panics.Store(true)
		h := mustHandler(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			if panics.Load() {
				panic(v)
			}
		}), Config{Limiter: policy.Limiter{InitialLimit: 1, MaxLimit: 1, QueueFactor: -1}})
		func() {
			defer func() {
				if got := recover(); got != v {
					t.Errorf("recovered %v, want %v", got, v)
				}
			}()
			serve(h, newRequest(context.Background()))
		}()
		if n := h.limiter.InFlight(); n != 0 {
			t.Errorf("after a panic of %v: %d in flight, want 0", v, n)
		}
		panics.Store(false)
		if w := serve(h, newRequest(context.Background())); w.Code != http.StatusOK {
			t.Errorf("after a panic of %v: %d, want 200 (the only slot is free)", v, w.Code)
		}
	}
}

// TestOutcome: what next's end teaches the limiter.
func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    writer
		err  error
		want policy.Outcome
	}{
		{"nothing written", writer{returned: true}, nil, policy.Success},
		{"200", writer{returned: true, status: 200}, nil, policy.Success},
		{"404", writer{returned: true, status: 404}, nil, policy.Success},
		{"501", writer{returned: true, status: 501}, nil, policy.Success},
		{"500", writer{returned: true, status: 500}, nil, policy.Failure},
		{"503", writer{returned: true, status: 503}, nil, policy.Failure},
		{"429", writer{returned: true, status: 429}, nil, policy.Failure},
		{"deadline", writer{returned: true, status: 200}, context.DeadlineExceeded, policy.Failure},
		{"client gone", writer{returned: true, status: 200}, context.Canceled, policy.Canceled},
		{"panicked", writer{status: 200}, nil, policy.Canceled},
		{"hijacked", writer{returned: true, hijacked: true}, nil, policy.Canceled},
	} {
		if got := outcome(&tc.w, tc.err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestWriterRecordsStatus: the status next sends, however it sends it.
func TestWriterRecordsStatus(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter)
		want  int
	}{
		{"nothing", func(http.ResponseWriter) {}, 0},
		{"WriteHeader", func(w http.ResponseWriter) { w.WriteHeader(503); w.WriteHeader(200) }, 503},
		{"1xx first", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(500) }, 500},
		{"Write", func(w http.ResponseWriter) { w.Write([]byte("x")) }, 200},
		{"WriteString", func(w http.ResponseWriter) { w.(interface{ WriteString(string) (int, error) }).WriteString("x") }, 200},
		{"Flush", func(w http.ResponseWriter) { w.(http.Flusher).Flush() }, 200},
	} {
		rec := httptest.NewRecorder()
		w := &writer{ResponseWriter: rec}
		tc.write(w)
		if w.status != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, w.status, tc.want)
		}
	}
	rec := httptest.NewRecorder()
	w := &writer{ResponseWriter: rec}
	if n, err := w.ReadFrom(strings.NewReader("body")); n != 4 || err != nil || w.status != 200 || rec.Body.String() != "body" {
		t.Errorf("ReadFrom: %d, %v, status %d, body %q", n, err, w.status, rec.Body)
	}
	if !rec.Flushed {
		if w.Flush(); !rec.Flushed {
			t.Error("Flush did not reach the recorder")
		}
	}
	if _, _, err := w.Hijack(); !errors.Is(err, http.ErrNotSupported) || w.hijacked {
		t.Errorf("Hijack on a recorder: %v, hijacked %v; want ErrNotSupported", err, w.hijacked)
	}
	if err := http.NewResponseController(w).SetWriteDeadline(time.Now()); !errors.Is(err, http.ErrNotSupported) {
		t.Errorf("SetWriteDeadline through Unwrap: %v, want the recorder's ErrNotSupported", err)
	}
}

// TestMalformedHeadersAreAbsent: a value that cannot be read is treated as
// absent and reported, with its canonical header name and at most 64 bytes
// of its value.
func TestMalformedHeadersAreAbsent(t *testing.T) {
	long := strings.Repeat("é", 40) // 80 bytes; cut at a rune
	for _, tc := range []struct {
		header, value, reported string
	}{
		{"Resilix-Priority", "urgent", "urgent"},
		{"Resilix-Priority", "", ""},
		{"Resilix-Priority", "best-effort" + strings.Repeat("_", 30), "best-effort" + strings.Repeat("_", 30)},
		{"Resilix-Timeout-Ms", "abc", "abc"},
		{"Resilix-Timeout-Ms", "-5", "-5"},
		{"Resilix-Timeout-Ms", "+5", "+5"},
		{"Resilix-Timeout-Ms", "1.5", "1.5"},
		{"Resilix-Timeout-Ms", "1e3", "1e3"},
		{"Resilix-Timeout-Ms", "86400001", "86400001"}, // a day and a millisecond
		{"Resilix-Timeout-Ms", "99999999999999999999999", "99999999999999999999999"},
		{"Resilix-Timeout-Ms", "", ""},
		{"Resilix-Attempt", "0", "0"},
		{"Resilix-Attempt", "-1", "-1"},
		{"Resilix-Attempt", "two", "two"},
		{"Resilix-Attempt", "2147483648", "2147483648"},
		{"Resilix-Attempt", long, strings.Repeat("é", 32)},
	} {
		var e events
		var s seen
		h := mustHandler(t, probe(&s), Config{Trust: trustAll, DefaultPriority: shedding.BestEffort, Observer: e.observer()})
		w := serve(h, newRequest(context.Background(), tc.header, tc.value))
		if w.Code != http.StatusOK || s.called != 1 {
			t.Errorf("%s: %q: status %d, next called %d times; want 200, once", tc.header, tc.value, w.Code, s.called)
		}
		if s.prio != shedding.BestEffort || s.hasDeadline || s.hasAttempt {
			t.Errorf("%s: %q: next saw priority %v, deadline %v, attempt %v; want the default and none", tc.header, tc.value, s.prio, s.hasDeadline, s.hasAttempt)
		}
		want := []policy.MalformedHeader{{Key: DefaultName, Header: tc.header, Value: tc.reported}}
		if diff := cmp.Diff(want, e.malformed, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Context" }, cmp.Ignore())); diff != "" {
			t.Errorf("%s: %q: reported (-want +got):\n%s", tc.header, tc.value, diff)
		}
		if got := h.snapshot().MalformedHeaders; got != 1 {
			t.Errorf("%s: %q: Snapshot.MalformedHeaders = %d, want 1", tc.header, tc.value, got)
		}
	}
	// Timeouts up to a day are honoured.
	synctest.Test(t, func(t *testing.T) {
		var s seen
		h := mustHandler(t, probe(&s), Config{})
		serve(h, newRequest(context.Background(), "Resilix-Timeout-Ms", "086400000"))
		if want := time.Now().Add(24 * time.Hour); !s.deadline.Equal(want) {
			t.Errorf("a day's timeout: deadline in %v", time.Until(s.deadline))
		}
	})
}

// discard is a ResponseWriter that keeps nothing, for measuring the handler
// alone.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// TestHugeHeadersCostNoMemory: header values of 1 MB, malformed or not,
// trusted or not, are read without copying them: the memory a request
// allocates does not grow with them, and nothing is kept once it ends.
func TestHugeHeadersCostNoMemory(t *testing.T) {
	const mb = 1 << 20
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	values := map[string]string{
		"digits": strings.Repeat("9", mb),
		"zeros":  strings.Repeat("0", mb-1) + "5",
		"spaces": strings.Repeat(" ", mb),
		"text":   strings.Repeat("x", mb),
	}
	var reportedLen atomic.Int64
	obs := &policy.Observer{MalformedHeader: func(m policy.MalformedHeader) { reportedLen.Store(max(reportedLen.Load(), int64(len(m.Value)))) }}
	h := mustHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), Config{Trust: trustAll, Observer: obs})
	var reqs []*http.Request
	for _, v := range values {
		reqs = append(reqs, newRequest(context.Background(),
			"Resilix-Priority", v, "Resilix-Tenant", v, "Resilix-Timeout-Ms", v, "Resilix-Attempt", v))
	}
	small := newRequest(context.Background(),
		"Resilix-Priority", "bulk", "Resilix-Tenant", "acme", "Resilix-Timeout-Ms", "5000", "Resilix-Attempt", "2")
	w := &discard{h: http.Header{}}
	perRequest := func(rs []*http.Request) float64 {
		const rounds = 20
		for _, r := range rs { // warm: the tenant tracker, the mix
			h.ServeHTTP(w, r)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range rounds {
			for _, r := range rs {
				h.ServeHTTP(w, r)
			}
		}
		runtime.ReadMemStats(&after)
		return float64(after.TotalAlloc-before.TotalAlloc) / float64(rounds*len(rs))
	}
	huge, base := perRequest(reqs), perRequest([]*http.Request{small})
	t.Logf("bytes allocated per request: %.0f with 1 MB headers, %.0f with small ones", huge, base)
	if huge > base+1024 {
		t.Errorf("a request with 1 MB headers allocates %.0f bytes, one with small headers %.0f: the values are copied", huge, base)
	}
	if n := reportedLen.Load(); n == 0 || n > httpx.MaxReported {
		t.Errorf("the longest value reported was %d bytes, want 1 to %d", n, httpx.MaxReported)
	}
	// Nothing is kept: the heap after the requests, with their values
	// dropped, is what it was before.
	reqs, values = nil, nil
	if after := heap(); after > before+mb/2 {
		t.Errorf("the heap grew by %d bytes once the 1 MB headers were dropped: something keeps them", after-before)
	}
	runtime.KeepAlive(h)
}

// TestAllocations holds the handler to its allocation budget: the
// priority's context, the request copy and the writer; one more for each
// of the attempt number and the tenant's context, one for the tenant's
// boxed string; and the deadline's context and timer.
func TestAllocations(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	trusting := mustHandler(t, ok, Config{Trust: trustAll, LoadReports: ReportNone})
	reporting := mustHandler(t, ok, Config{Trust: trustAll})
	untrusting := mustHandler(t, ok, Config{})
	headers := []string{"Resilix-Priority", "bulk", "Resilix-Tenant", "acme", "Resilix-Attempt", "2"}
	for _, tc := range []struct {
		name string
		h    *server
		kv   []string
		max  float64
	}{
		{"no header", trusting, nil, 3},
		{"priority, tenant, attempt", trusting, headers, 6},
		{"and a timeout", trusting, append(headers, "Resilix-Timeout-Ms", "5000"), 10},
		// A trusted caller is told the load: its value and its slice.
		{"no header, a load report", reporting, nil, 5},
		// The three, the empty tenant's context and the attempt's, and
		// the Header's copy without the priority and the tenant: its map
		// (with its buckets) and its values.
		{"untrusted: priority, tenant, attempt", untrusting, headers, 8},
	} {
		r := newRequest(context.Background(), tc.kv...)
		w := &discard{h: http.Header{}}
		h := tc.h
		if n := testing.AllocsPerRun(100, func() {
			delete(w.h, orca.Header) // a fresh answer's header
			h.ServeHTTP(w, r)
		}); n > tc.max {
			t.Errorf("%s: %v allocations per request, want at most %v", tc.name, n, tc.max)
		}
	}
}

// TestAttachReportsTheServer: Observer.Attach gets a source that reports
// the server's limiter under Config.Name, and that does not keep the
// handler alive.
func TestAttachReportsTheServer(t *testing.T) {
	var e events
	func() {
		h := mustHandler(t, http.NotFoundHandler(), Config{Name: "svc", Observer: e.observer(),
			Limiter: policy.Limiter{InitialLimit: 7, QueueFactor: -1}})
		serve(h, newRequest(context.Background(), "Resilix-Attempt", "x"))
		var got []string
		var snap policy.Snapshot
		if len(e.sources) != 1 || !e.sources[0].States(func(key string, s policy.Snapshot) { got, snap = append(got, key), s }) {
			t.Fatalf("%d sources, or a dead one", len(e.sources))
		}
		want := policy.Snapshot{Known: true, HasLimiter: true, LimiterLimit: 7, MalformedHeaders: 1}
		if diff := cmp.Diff([]string{"svc"}, got); diff != "" {
			t.Errorf("keys (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(want, snap); diff != "" {
			t.Errorf("snapshot (-want +got):\n%s", diff)
		}
	}()
	runtime.GC()
	runtime.GC()
	if e.sources[0].States(func(string, policy.Snapshot) { t.Error("a dropped handler reported a state") }) {
		t.Error("the source of a dropped handler is still alive")
	}
}

// TestManyTenantsBoundedMemory: a trusted caller naming a new tenant on
// every request, 100,000 of them, grows the server's memory by no more
// than the tenant tracker's fixed size.
func TestManyTenantsBoundedMemory(t *testing.T) {
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	h := mustHandler(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), Config{Trust: trustAll})
	r := newRequest(context.Background())
	w := &discard{h: http.Header{}}
	id := func(i int) string { return "tenant-" + strconv.Itoa(i) + strings.Repeat("x", i%100) }
	r.Header.Set("Resilix-Tenant", id(0))
	h.ServeHTTP(w, r) // the tracker
	before := heap()
	for i := 1; i <= 100_000; i++ {
		r.Header["Resilix-Tenant"][0] = id(i)
		h.ServeHTTP(w, r)
	}
	r.Header["Resilix-Tenant"][0] = ""
	if after := heap(); after > before+64<<10 {
		t.Errorf("100,000 tenant ids grew the heap by %d bytes", after-before)
	}
	runtime.KeepAlive(h)
}

// TestNextGetsOnlyTheHeadersAdmissionTook: of the four headers, the
// request next gets carries only those whose value admission took, so
// that a transport behind it (a reverse proxy's) cannot forward the rest:
// a priority or tenant from an untrusted caller, or that the context
// overrides, a malformed priority, timeout or attempt number, and an
// attempt number the context overrides are removed, with all their
// values. Every other header passes, and the caller's request keeps its
// own.
func TestNextGetsOnlyTheHeadersAdmissionTook(t *testing.T) {
	all := []string{"Resilix-Priority", "bulk", "Resilix-Tenant", "acme", "Resilix-Timeout-Ms", "5000", "Resilix-Attempt", "2", "X-Other", "1"}
	middleware := attempt.With(tenant.With(shedding.WithPriority(context.Background(), shedding.Degraded), "initech"), 1)
	for _, tc := range []struct {
		name  string
		cfg   Config
		ctx   context.Context
		kv    []string
		wants []string // the headers next sees, sorted
	}{
		{"trusted", Config{Trust: trustAll}, nil, all,
			[]string{"Resilix-Attempt", "Resilix-Priority", "Resilix-Tenant", "Resilix-Timeout-Ms", "X-Other"}},
		{"untrusted", Config{}, nil, all,
			[]string{"Resilix-Attempt", "Resilix-Timeout-Ms", "X-Other"}},
		{"untrusted, every value", Config{}, nil,
			[]string{"Resilix-Tenant", "a", "Resilix-Tenant", "b", "Resilix-Priority", "critical", "Resilix-Priority", "bulk"},
			nil},
		{"malformed", Config{Trust: trustAll}, nil,
			[]string{"Resilix-Priority", "urgent", "Resilix-Tenant", "acme", "Resilix-Timeout-Ms", "soon", "Resilix-Attempt", "0"},
			[]string{"Resilix-Tenant"}},
		{"the context overrides", Config{Trust: trustAll}, middleware, all,
			[]string{"Resilix-Timeout-Ms", "X-Other"}},
		{"configured names", Config{PriorityHeader: "x-prio", TenantHeader: "x-tenant"}, nil,
			[]string{"X-Prio", "bulk", "X-Tenant", "acme", "Resilix-Priority", "bulk", "Resilix-Tenant", "acme"},
			[]string{"Resilix-Priority", "Resilix-Tenant"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got = slices.Sorted(maps.Keys(r.Header))
			})
			h := mustHandler(t, next, tc.cfg)
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			r := newRequest(ctx, tc.kv...)
			before := r.Header.Clone()
			if w := serve(h, r); w.Code != http.StatusOK {
				t.Fatalf("status %d", w.Code)
			}
			if diff := cmp.Diff(tc.wants, got); diff != "" {
				t.Errorf("next's headers (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, r.Header); diff != "" {
				t.Errorf("the caller's request was modified (-before +after):\n%s", diff)
			}
		})
	}
}

// TestAnySpellingIsTheHeader: a request built in-process may hold one of
// the four headers under any spelling (h["resilix-tenant"]; Go's server
// canonicalizes what it reads off the wire). Admission reads it as the
// header, the canonical spelling's value first, and removes every
// spelling of a header whose value it does not take, so that an
// untrusted tenant or priority cannot reach next, or a transport behind
// it, in lower case.
func TestAnySpellingIsTheHeader(t *testing.T) {
	spelled := func(kv ...string) *http.Request {
		r := newRequest(context.Background())
		for i := 0; i+1 < len(kv); i += 2 {
			r.Header[kv[i]] = append(r.Header[kv[i]], kv[i+1])
		}
		return r
	}
	odd := []string{"resilix-priority", "bulk", "RESILIX-TENANT", "victim", "resilix-timeout-ms", "250", "resilix-Attempt", "2", "x-other", "1"}
	for _, tc := range []struct {
		name    string
		cfg     Config
		kv      []string
		prio    shedding.Priority
		tenant  string
		headers []string // the keys next sees, sorted
	}{
		{"trusted", Config{Trust: trustAll}, odd, shedding.Bulk, "victim",
			[]string{"RESILIX-TENANT", "resilix-Attempt", "resilix-priority", "resilix-timeout-ms", "x-other"}},
		{"untrusted", Config{}, odd, shedding.Critical, "",
			[]string{"resilix-Attempt", "resilix-timeout-ms", "x-other"}},
		{"untrusted, both spellings", Config{}, []string{"Resilix-Tenant", "acme", "resilix-tenant", "victim", "resilix-priority", "critical"}, shedding.Critical, "",
			nil},
		{"the canonical spelling first", Config{Trust: trustAll}, []string{"resilix-tenant", "victim", "Resilix-Tenant", "acme", "resilix-priority", "bulk", "Resilix-Priority", "degraded"}, shedding.Degraded, "acme",
			[]string{"Resilix-Priority", "Resilix-Tenant", "resilix-priority", "resilix-tenant"}},
		{"malformed in any spelling", Config{Trust: trustAll}, []string{"resilix-priority", "urgent", "resilix-timeout-ms", "soon", "RESILIX-ATTEMPT", "0"}, shedding.Critical, "",
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var s seen
				var keys []string
				next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					probe(&s).ServeHTTP(w, r)
					keys = slices.Sorted(maps.Keys(r.Header))
				})
				h := mustHandler(t, next, tc.cfg)
				r := spelled(tc.kv...)
				before := r.Header.Clone()
				arrival := time.Now()
				if w := serve(h, r); w.Code != http.StatusOK {
					t.Fatalf("status %d", w.Code)
				}
				if s.prio != tc.prio || s.tenant != tc.tenant {
					t.Errorf("next's priority %v and tenant %q, want %v and %q", s.prio, s.tenant, tc.prio, tc.tenant)
				}
				if slices.Contains(tc.kv, "250") && (!s.hasDeadline || !s.deadline.Equal(arrival.Add(250*time.Millisecond))) {
					t.Errorf("next's deadline %v after arrival (%v), want 250ms", s.deadline.Sub(arrival), s.hasDeadline)
				}
				if slices.Contains(tc.kv, "resilix-Attempt") && s.attempt != 2 {
					t.Errorf("next's attempt %d, want 2", s.attempt)
				}
				if diff := cmp.Diff(tc.headers, keys); diff != "" {
					t.Errorf("next's headers (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(before, r.Header); diff != "" {
					t.Errorf("the caller's request was modified (-before +after):\n%s", diff)
				}
			})
		})
	}
}
