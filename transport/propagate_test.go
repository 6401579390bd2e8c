package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/attempt"
	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/tenant"
)

// The propagated headers under their default names.
const (
	hPriority = "Resilix-Priority"
	hTenant   = "Resilix-Tenant"
	hTimeout  = "Resilix-Timeout-Ms"
	hAttempt  = "Resilix-Attempt"
)

// wire is what one wire attempt looked like as the base received it.
type wire struct {
	req      *http.Request
	header   http.Header // a copy, taken on arrival
	at       time.Time
	deadline time.Time // the attempt context's; zero: none
}

// wireLog is a base that records each wire attempt, then has next answer
// it.
type wireLog struct {
	next  http.RoundTripper
	mu    sync.Mutex
	wires []wire
}

func (r *wireLog) RoundTrip(req *http.Request) (*http.Response, error) {
	w := wire{req: req, header: req.Header.Clone(), at: time.Now()}
	w.deadline, _ = req.Context().Deadline()
	r.mu.Lock()
	r.wires = append(r.wires, w)
	r.mu.Unlock()
	return r.next.RoundTrip(req)
}

func (r *wireLog) sent() []wire {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.wires)
}

var ok200 = fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })

// ours returns the propagated headers h carries, by name, each with its
// first value.
func ours(h http.Header) map[string]string {
	m := map[string]string{}
	for _, k := range []string{hPriority, hTenant, hTimeout, hAttempt} {
		if vs := h[k]; len(vs) > 0 {
			m[k] = vs[0]
		}
	}
	return m
}

// TestPropagateWritesOnlyWhereOnAndOnlyWithValues: a key with Propagate on
// gets the context's priority and tenant (else the request's own, as the
// transport reads them), the time left and the attempt number, each only
// when there is one, and never a value the transport did not derive; a key
// without it gets nothing resilix added, and the request's own headers as
// they are.
func TestPropagateWritesOnlyWhereOnAndOnlyWithValues(t *testing.T) {
	type ctxf = func(context.Context) context.Context
	for _, tc := range []struct {
		name     string
		ctx      ctxf
		deadline time.Duration     // the caller's; 0: none
		own      map[string]string // the request's own headers
		timeout  time.Duration     // Timeout.PerAttempt of the propagating key
		want     map[string]string // on the propagating key
		bad      uint64            // MalformedHeaders on the propagating key
	}{
		{
			name: "nothing named",
			want: map[string]string{hAttempt: "1"},
		},
		{
			name: "all in the context",
			ctx: func(ctx context.Context) context.Context {
				ctx = shedding.WithPriority(ctx, shedding.BestEffort)
				return tenant.With(ctx, "acme")
			},
			deadline: 2 * time.Second,
			want:     map[string]string{hPriority: "best_effort", hTenant: "acme", hTimeout: "1995", hAttempt: "1"},
		},
		{
			name: "the request's own headers, as the transport reads them",
			own:  map[string]string{hPriority: "Degraded", hTenant: "beta"},
			want: map[string]string{hPriority: "degraded", hTenant: "beta", hAttempt: "1"},
		},
		{
			name: "the context wins over the request's headers",
			ctx: func(ctx context.Context) context.Context {
				return tenant.With(shedding.WithPriority(ctx, shedding.Critical), "acme")
			},
			own:  map[string]string{hPriority: "bulk", hTenant: "beta", hAttempt: "7", hTimeout: "99999"},
			want: map[string]string{hPriority: "critical", hTenant: "acme", hAttempt: "1"},
		},
		{
			name:     "the request's own timeout is the time left",
			deadline: 2 * time.Second,
			own:      map[string]string{hTimeout: "99999"},
			want:     map[string]string{hTimeout: "1995", hAttempt: "1"},
		},
		{
			name: "an empty tenant in the context removes the request's",
			ctx:  func(ctx context.Context) context.Context { return tenant.With(ctx, "") },
			own:  map[string]string{hTenant: "evil"},
			want: map[string]string{hAttempt: "1"},
		},
		{
			name: "a malformed priority is removed",
			own:  map[string]string{hPriority: "urgent"},
			want: map[string]string{hAttempt: "1"},
			bad:  1,
		},
		{
			name: "a request's tenant that cannot be a header value is counted, not written",
			own:  map[string]string{hTenant: "a\x00b"},
			want: map[string]string{hAttempt: "1"},
			bad:  1,
		},
		{
			name:    "a per-attempt timeout and no deadline",
			timeout: 1500 * time.Millisecond,
			want:    map[string]string{hTimeout: "1495", hAttempt: "1"},
		},
		{
			name: "an empty tenant and an invalid priority are no values",
			ctx: func(ctx context.Context) context.Context {
				return tenant.With(shedding.WithPriority(ctx, shedding.Priority(9)), "")
			},
			want: map[string]string{hAttempt: "1"},
		},
		{
			name: "a tenant that cannot be a header value is counted, not written",
			ctx:  func(ctx context.Context) context.Context { return tenant.With(ctx, "a\r\nX-Evil: 1") },
			want: map[string]string{hAttempt: "1"},
			bad:  1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &wireLog{next: ok200}
				in := policy.Set{Propagate: true}
				if tc.timeout > 0 {
					in.Timeout = &policy.Timeout{PerAttempt: tc.timeout}
				}
				tr := mustNew(t, Config{Base: rec, PerKey: map[string]policy.Set{"in.test": in}})
				ctx := t.Context()
				if tc.ctx != nil {
					ctx = tc.ctx(ctx)
				}
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				for _, host := range []string{"in.test", "out.test"} {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/", nil)
					for k, v := range tc.own {
						req.Header.Set(k, v)
					}
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
				w := rec.sent()
				if diff := cmp.Diff(tc.want, ours(w[0].header)); diff != "" {
					t.Errorf("propagating key's headers (-want +got):\n%s", diff)
				}
				own := tc.own
				if own == nil {
					own = map[string]string{}
				}
				if diff := cmp.Diff(own, ours(w[1].header)); diff != "" {
					t.Errorf("other key's headers, want the request's own (-want +got):\n%s", diff)
				}
				if got := tr.Measured("in.test").MalformedHeaders; got != tc.bad {
					t.Errorf("MalformedHeaders = %d, want %d", got, tc.bad)
				}
			})
		})
	}
}

// TestAnUnwritableTenantIsReportedOncePerCall: a tenant id that cannot be
// a header value goes on no attempt, and is reported once for the call,
// however many attempts it makes.
func TestAnUnwritableTenantIsReportedOncePerCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &wireLog{next: &script{codes: []int{503, 502, 200}}}
		var reported []policy.MalformedHeader
		set := retrySet()
		set.Propagate = true
		tr := mustNew(t, Config{Base: rec, Policies: set, Observer: &policy.Observer{
			MalformedHeader: func(m policy.MalformedHeader) { reported = append(reported, m) },
		}})
		if code, err := do(t, tenant.With(t.Context(), "acme\x00"), tr); err != nil || code != 200 {
			t.Fatalf("got %d, %v", code, err)
		}
		for _, w := range rec.sent() {
			if vs, has := w.header[hTenant]; has {
				t.Errorf("attempt %s carries %s %q", w.header.Get(hAttempt), hTenant, vs)
			}
		}
		if len(reported) != 1 || reported[0].Header != hTenant || reported[0].Value != "acme\x00" ||
			tr.Measured("up.test").MalformedHeaders != 1 {
			t.Errorf("reported %+v, counted %d; want the tenant once", reported, tr.Measured("up.test").MalformedHeaders)
		}
		if n := len(rec.sent()); n != 3 {
			t.Errorf("%d wire attempts, want 3", n)
		}
	})
}

// TestValidHeaderValueAgreesWithNetHTTP: the tenant ids stamp refuses to
// write are exactly those net/http's transport would refuse to send, byte
// by byte. The transport dials nothing: its dialer fails, after the check.
func TestValidHeaderValueAgreesWithNetHTTP(t *testing.T) {
	errDial := errors.New("no dialing here")
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return nil, errDial }}
	defer tr.CloseIdleConnections()
	for b := range 256 {
		v := "a" + string([]byte{byte(b)}) + "b"
		req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
		req.Header["X-Tenant"] = []string{v}
		_, err := tr.RoundTrip(req)
		refused := err != nil && !errors.Is(err, errDial)
		if refused == validHeaderValue(v) {
			t.Errorf("byte %#02x: net/http refuses it %v, validHeaderValue %v (%v)", b, refused, validHeaderValue(v), err)
		}
	}
}

// FuzzPropagate writes whatever a caller may put in its context, a tenant
// id, a priority, a deadline, and any per-attempt timeout: nothing may
// panic, the tenant header carries the id exactly when net/http can send
// it, the timeout header never promises more than the caller has left,
// and the caller's Header is never written to.
func FuzzPropagate(f *testing.F) {
	f.Add("acme", uint8(1), int64(time.Second), int64(0))
	f.Add("a\r\nb", uint8(9), int64(-1), int64(time.Millisecond))
	f.Add("", uint8(3), int64(500*time.Microsecond), int64(time.Hour))
	f.Fuzz(func(t *testing.T, id string, prio uint8, deadline, perAttempt int64) {
		synctest.Test(t, func(t *testing.T) {
			rec := &wireLog{next: ok200}
			set := policy.Set{Propagate: true}
			if perAttempt > 0 {
				set.Timeout = &policy.Timeout{PerAttempt: time.Duration(perAttempt)}
			}
			tr := mustNew(t, Config{Base: rec, Policies: set})
			ctx := tenant.With(shedding.WithPriority(t.Context(), shedding.Priority(prio)), id)
			if deadline != 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Duration(deadline)))
				defer cancel()
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://a.test/", nil)
			resp, err := tr.RoundTrip(req)
			if deadline < 0 {
				// Past before the call: answered at once, sending nothing.
				if resp != nil || err != context.DeadlineExceeded || len(rec.sent()) != 0 {
					t.Fatalf("past deadline: got %v, %v after %d wire calls; want DeadlineExceeded and none", resp, err, len(rec.sent()))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if len(req.Header) != 0 {
				t.Fatalf("the caller's Header was written to: %v", req.Header)
			}
			w := rec.sent()[0]
			got, has := w.header[hTenant]
			if want := id != "" && validHeaderValue(id); has != want || has && got[0] != id {
				t.Errorf("tenant %q: header %q, want written %v", id, got, want)
			}
			if p := shedding.Priority(prio); w.header.Get(hPriority) != map[bool]string{true: p.String()}[p.Valid()] {
				t.Errorf("priority %d: header %q", prio, w.header.Get(hPriority))
			}
			checkLeft(t, w, max(time.Duration(perAttempt), 0))
		})
	})
}

// TestPropagateUsesTheConfiguredNames: the four headers go under the
// names Config gives, in canonical form.
func TestPropagateUsesTheConfiguredNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &wireLog{next: ok200}
		tr := mustNew(t, Config{
			Base:           rec,
			Policies:       policy.Set{Propagate: true},
			PriorityHeader: "x-crit", TenantHeader: "X-Customer",
			TimeoutHeader: "x-deadline-ms", AttemptHeader: "X-TRY",
		})
		ctx, cancel := context.WithTimeout(tenant.With(shedding.WithPriority(t.Context(), shedding.Bulk), "acme"), time.Second)
		defer cancel()
		resp, err := get(t, ctx, tr, "http://a.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.Header{"X-Crit": {"bulk"}, "X-Customer": {"acme"}, "X-Deadline-Ms": {"995"}, "X-Try": {"1"}}
		if diff := cmp.Diff(want, rec.sent()[0].header); diff != "" {
			t.Errorf("headers (-want +got):\n%s", diff)
		}
	})
}

// TestNewValidatesThePropagationHeaders: the new names are checked as
// PriorityHeader is, and no two of the four may name one header.
func TestNewValidatesThePropagationHeaders(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{TimeoutHeader: "Time Left"}, `transport: TimeoutHeader "Time Left" is not a valid header name`},
		{Config{AttemptHeader: "a:b"}, `transport: AttemptHeader "a:b" is not a valid header name`},
		{Config{TimeoutHeader: "resilix-priority"}, `transport: PriorityHeader and TimeoutHeader are both the header "Resilix-Priority"`},
		{Config{TenantHeader: "X-A", AttemptHeader: "x-a"}, `transport: TenantHeader and AttemptHeader are both the header "X-A"`},
	} {
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) error = %v, want it to contain %q", tc.cfg, err, tc.want)
		}
	}
}

// checkLeft checks a wire attempt's timeout header against its own
// arrival: whole milliseconds, rounded down, of the time left before the
// caller's deadline or of the per-attempt timeout, whichever is smaller,
// less the transit margin.
// The attempt context's deadline is the caller's (a per-attempt timeout
// is a timer, not a deadline), and synctest's clock does not move between
// the header being written and the base receiving it.
func checkLeft(t *testing.T, w wire, perAttempt time.Duration) {
	t.Helper()
	left, bounded := perAttempt, perAttempt > 0
	if !w.deadline.IsZero() {
		if d := w.deadline.Sub(w.at); !bounded || d < left {
			left = d
		}
		bounded = true
	}
	got, has := w.header[hTimeout]
	if !bounded {
		if has {
			t.Errorf("attempt %s: %s %q with no deadline and no per-attempt timeout", w.header.Get(hAttempt), hTimeout, got)
		}
		return
	}
	ms, err := strconv.ParseInt(w.header.Get(hTimeout), 10, 64)
	if err != nil {
		t.Fatalf("attempt %s: %s %q: %v", w.header.Get(hAttempt), hTimeout, got, err)
	}
	if want := int64(max(left-transitMargin, 0) / time.Millisecond); ms != want {
		t.Errorf("attempt %s: %s = %d, want %d (%v left)", w.header.Get(hAttempt), hTimeout, ms, want, left)
	}
	if !w.deadline.IsZero() && time.Duration(ms)*time.Millisecond > max(w.deadline.Sub(w.at), 0) {
		t.Errorf("attempt %s: %s = %d, more than the caller's %v", w.header.Get(hAttempt), hTimeout, ms, w.deadline.Sub(w.at))
	}
}

// TestPropagatedTimeoutNeverExceedsTheCallersTime: the timeout header is
// the time left before the caller's deadline, or the per-attempt timeout
// when that is shorter, less the transit margin (1ms), rounded down to
// the millisecond; a retry after a slow attempt and a backoff carries
// what is left then.
func TestPropagatedTimeoutNeverExceedsTheCallersTime(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration // 0: none
		set      time.Duration // Timeout.PerAttempt; 0: no Timeout
		override time.Duration // Override.PerAttempt
		want     string        // "": no header
	}{
		{"no deadline, no timeout", 0, 0, 0, ""},
		{"deadline", 1500 * time.Millisecond, 0, 0, "1495"},
		{"deadline rounded down", 1500*time.Millisecond + 999*time.Microsecond, 0, 0, "1495"},
		{"a millisecond and more", 1500*time.Millisecond + time.Millisecond, 0, 0, "1496"},
		{"less than a millisecond left", 400 * time.Microsecond, 0, 0, "0"},
		{"per-attempt shorter", 1500 * time.Millisecond, 300 * time.Millisecond, 0, "295"},
		{"deadline shorter", 250 * time.Millisecond, time.Second, 0, "245"},
		{"override shorter", time.Second, 2 * time.Second, 200 * time.Millisecond, "195"},
		{"per-attempt, no deadline", 0, 2 * time.Second, 0, "1995"},
		{"no more than the margin left", transitMargin + 999*time.Microsecond, 0, 0, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &wireLog{next: ok200}
				set := policy.Set{Propagate: true}
				if tc.set > 0 {
					set.Timeout = &policy.Timeout{PerAttempt: tc.set}
				}
				tr := mustNew(t, Config{Base: rec, Policies: set})
				ctx := WithOverride(t.Context(), Override{PerAttempt: tc.override})
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				resp, err := get(t, ctx, tr, "http://a.test/")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				got, has := rec.sent()[0].header[hTimeout]
				switch {
				case tc.want == "" && has:
					t.Errorf("%s = %q, want none", hTimeout, got)
				case tc.want != "" && (len(got) != 1 || got[0] != tc.want):
					t.Errorf("%s = %q, want %q", hTimeout, got, tc.want)
				}
			})
		})
	}

	t.Run("a retry carries what is left", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var n int
			slow503 := fakeRT(func(r *http.Request) (*http.Response, error) {
				n++
				if n == 1 {
					time.Sleep(50 * time.Millisecond)
					return respond(r, 503), nil
				}
				return respond(r, 200), nil
			})
			rec := &wireLog{next: slow503}
			tr := mustNew(t, Config{Base: rec, Policies: policy.Set{
				Propagate: true,
				Retry:     &policy.Retry{Delay: func(int) time.Duration { return 100 * time.Millisecond }},
			}})
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			resp, err := get(t, ctx, tr, "http://a.test/")
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("got %v, %v", resp, err)
			}
			resp.Body.Close()
			var got []string
			for _, w := range rec.sent() {
				got = append(got, w.header.Get(hTimeout))
			}
			// 1s, then 1s less the first attempt's 50ms and the 100ms backoff,
			// each less the transit margin.
			if want := []string{"995", "845"}; !slices.Equal(got, want) {
				t.Errorf("%s = %q, want %q", hTimeout, got, want)
			}
		})
	})
}

// TestPropagateNumbersEachAttempt: each wire attempt carries its own
// number, retries and hedge legs alike, and a timeout header no larger
// than what the caller has left when it is sent.
func TestPropagateNumbersEachAttempt(t *testing.T) {
	numbers := func(ws []wire) []string {
		var ns []string
		for _, w := range ws {
			ns = append(ns, w.header.Get(hAttempt))
		}
		return ns
	}

	t.Run("retries", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rec := &wireLog{next: &script{codes: []int{503, 502, 200}}}
			set := retrySet()
			set.Propagate = true
			tr := mustNew(t, Config{Base: rec, Policies: set})
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			if code, err := do(t, ctx, tr); err != nil || code != 200 {
				t.Fatalf("got %d, %v", code, err)
			}
			ws := rec.sent()
			if got, want := numbers(ws), []string{"1", "2", "3"}; !slices.Equal(got, want) {
				t.Errorf("attempt numbers %q, want %q", got, want)
			}
			for _, w := range ws {
				checkLeft(t, w, 0)
			}
		})
	})

	t.Run("a hedge", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &slowRT{latency: steady(10 * time.Millisecond)}
			rec := &wireLog{next: base}
			ev := &hedgeEvents{}
			tr := mustNew(t, Config{Base: rec, Policies: policy.Set{Propagate: true, Hedge: &policy.Hedge{},
				Timeout: &policy.Timeout{PerAttempt: 500 * time.Millisecond}}, Observer: ev.observer()})
			warm(t, tr, 30)
			base.slowOnce(time.Second)
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			if code, err := do(t, ctx, tr); err != nil || code != 200 {
				t.Fatalf("got %d, %v", code, err)
			}
			synctest.Wait() // the winning hedge's goroutine reports after the caller has its answer
			if started, won := ev.counts(); started != 1 || won != 1 {
				t.Fatalf("%d hedges started, %d won; want 1, 1", started, won)
			}
			ws := rec.sent()[30:]
			if got, want := numbers(ws), []string{"1", "2"}; !slices.Equal(got, want) {
				t.Errorf("attempt numbers %q, want %q", got, want)
			}
			for _, w := range ws {
				checkLeft(t, w, 500*time.Millisecond)
			}
			if ws[1].header.Get(hTimeout) == "300" {
				t.Errorf("the hedge leg, sent after the threshold, claims the whole 300ms")
			}
		})
	})

	t.Run("retries of hedged rounds", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rec := &wireLog{next: &slowRT{latency: warmThenFailSlowly}}
			tr := mustNew(t, Config{Base: rec, Policies: policy.Set{Propagate: true, Attempts: 4,
				Retry: &policy.Retry{}, Hedge: &policy.Hedge{}}})
			warm(t, tr, 30)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if code, err := do(t, ctx, tr); err != nil || code != 503 {
				t.Fatalf("got %d, %v", code, err)
			}
			ws := rec.sent()[30:]
			got := numbers(ws)
			slices.Sort(got)
			if want := []string{"1", "2", "3", "4"}; !slices.Equal(got, want) {
				t.Errorf("attempt numbers %q, want each of %q once", got, want)
			}
			for _, w := range ws {
				checkLeft(t, w, 0)
			}
		})
	})
}

// requestView is what a caller can see of its request after RoundTrip.
type requestView struct {
	Method        string
	URL           url.URL
	Host          string
	Header        http.Header
	Trailer       http.Header
	ContentLength int64
	Close         bool
}

func viewOf(r *http.Request) requestView {
	return requestView{r.Method, *r.URL, r.Host, r.Header.Clone(), r.Trailer.Clone(), r.ContentLength, r.Close}
}

// TestPropagateLeavesTheCallersRequestAlone: the headers go on each
// attempt's own copy: the caller's request, its Header map included, is
// as it was, whether the attempt is the caller's request itself, a
// shallow copy with its own context, a retry, or a hedge leg; and the
// copy keeps what the caller's Header says, a suppressed header (a nil
// value) included.
func TestPropagateLeavesTheCallersRequestAlone(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  policy.Set
		base func() http.RoundTripper
		warm int
	}{
		{"one attempt", policy.Set{}, func() http.RoundTripper { return ok200 }, 0},
		{"a per-attempt timeout", policy.Set{Timeout: &policy.Timeout{PerAttempt: time.Second}}, func() http.RoundTripper { return ok200 }, 0},
		{"a retry", retrySet(), func() http.RoundTripper { return &script{codes: []int{503, 200}} }, 0},
		{"a hedge", policy.Set{Hedge: &policy.Hedge{}}, func() http.RoundTripper {
			base := &slowRT{latency: func(i int64, _ *http.Request) (time.Duration, int) {
				if i == 30 {
					return time.Second, 200
				}
				return 10 * time.Millisecond, 200
			}}
			return base
		}, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &wireLog{next: tc.base()}
				set := tc.set
				set.Propagate = true
				tr := mustNew(t, Config{Base: rec, Policies: set})
				warm(t, tr, tc.warm)
				var perAttempt time.Duration
				if set.Timeout != nil {
					perAttempt = set.Timeout.PerAttempt
				}

				ctx, cancel := context.WithTimeout(tenant.With(shedding.WithPriority(t.Context(), shedding.Degraded), "acme"), 5*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://up.test/x?y=1", nil)
				req.Header = http.Header{
					hPriority:    {"bulk"},
					"X-Other":    {"a", "b"},
					"User-Agent": nil, // suppressed: net/http sends none
				}
				headerBefore := req.Header
				before := viewOf(req)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				synctest.Wait() // a losing leg has ended

				if diff := cmp.Diff(before, viewOf(req)); diff != "" {
					t.Errorf("the caller's request changed (-before +after):\n%s", diff)
				}
				if req.Context() != ctx {
					t.Error("the caller's request has another context")
				}
				if req.Header["User-Agent"] != nil || headerBefore[hAttempt] != nil {
					t.Error("the caller's Header map was written to")
				}
				ws := rec.sent()[tc.warm:]
				if len(ws) < 2 && tc.name != "one attempt" && tc.name != "a per-attempt timeout" {
					t.Fatalf("%d wire attempts, want more than one", len(ws))
				}
				for i, w := range ws {
					if w.req == req {
						t.Errorf("attempt %d sent the caller's own request", i+1)
					}
					want := http.Header{
						hPriority: {"degraded"}, hTenant: {"acme"}, hAttempt: {strconv.Itoa(i + 1)},
						hTimeout: w.header[hTimeout], "X-Other": {"a", "b"}, "User-Agent": nil,
					}
					if diff := cmp.Diff(want, w.header); diff != "" {
						t.Errorf("attempt %d's headers (-want +got):\n%s", i+1, diff)
					}
					checkLeft(t, w, perAttempt)
				}
			})
		})
	}
}

// TestPropagateCarriesExactlyWhatItDerives: on a propagating key the four
// headers on the wire are exactly what the transport derives, on every
// attempt, the first, a retry and a hedge leg alike: a value the request
// carried is replaced, with all its values, or removed when the transport
// has none (the empty tenant admission puts in the context of an untrusted
// caller's request, say); and the caller's request keeps its own.
func TestPropagateCarriesExactlyWhatItDerives(t *testing.T) {
	legs := []struct {
		name string
		set  policy.Set
		base func() http.RoundTripper
		warm int
	}{
		{"one attempt", policy.Set{}, func() http.RoundTripper { return ok200 }, 0},
		{"a retry", retrySet(), func() http.RoundTripper { return &script{codes: []int{503, 200}} }, 0},
		{"a hedge", policy.Set{Hedge: &policy.Hedge{}}, func() http.RoundTripper {
			return &slowRT{latency: func(i int64, _ *http.Request) (time.Duration, int) {
				if i == 30 {
					return time.Second, 200
				}
				return 10 * time.Millisecond, 200
			}}
		}, 30},
	}
	cases := []struct {
		name     string
		ctx      func(context.Context) context.Context
		deadline bool        // 5s
		own      http.Header // the request's
		want     http.Header // on each attempt, but the attempt number and the time left
	}{
		{
			name: "the context's values replace the request's",
			ctx: func(ctx context.Context) context.Context {
				return tenant.With(shedding.WithPriority(ctx, shedding.Degraded), "acme")
			},
			deadline: true,
			own:      http.Header{hPriority: {"bulk", "critical"}, hTenant: {"evil", "x"}, hTimeout: {"99999", "1"}, hAttempt: {"7", "8"}},
			want:     http.Header{hPriority: {"degraded"}, hTenant: {"acme"}},
		},
		{
			name: "none derived, none sent",
			ctx:  func(ctx context.Context) context.Context { return tenant.With(ctx, "") },
			own:  http.Header{hPriority: {"urgent"}, hTenant: {"evil"}, hTimeout: {"99999"}, hAttempt: {"7"}},
			want: http.Header{},
		},
		{
			name: "the request's first values, as the transport reads them",
			own:  http.Header{hPriority: {"Best-Effort", "bulk"}, hTenant: {"beta", "x"}},
			want: http.Header{hPriority: {"best_effort"}, hTenant: {"beta"}},
		},
		{
			// A Header built in-process may spell a name in any case;
			// net/http writes each spelling as it is, and the next tier
			// reads them all as one header.
			name: "any spelling is the header",
			own:  http.Header{"resilix-priority": {"degraded"}, "RESILIX-TENANT": {"beta"}, "resilix-timeout-ms": {"99999"}, "Resilix-attempt": {"7"}},
			want: http.Header{hPriority: {"degraded"}, hTenant: {"beta"}},
		},
		{
			name: "none derived, none sent, in any spelling",
			ctx:  func(ctx context.Context) context.Context { return tenant.With(ctx, "") },
			own:  http.Header{"resilix-priority": {"urgent"}, "resilix-tenant": {"victim"}, hTenant: {"evil"}, "RESILIX-TIMEOUT-MS": {"99999"}, "resilix-Attempt": {"7"}},
			want: http.Header{},
		},
		{
			name: "the canonical spelling's value first",
			own:  http.Header{"resilix-tenant": {"victim"}, hTenant: {"beta"}, "resilix-priority": {"bulk"}, hPriority: {"degraded"}},
			want: http.Header{hPriority: {"degraded"}, hTenant: {"beta"}},
		},
	}
	for _, leg := range legs {
		for _, tc := range cases {
			t.Run(leg.name+"/"+tc.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					rec := &wireLog{next: leg.base()}
					set := leg.set
					set.Propagate = true
					tr := mustNew(t, Config{Base: rec, Policies: set})
					warm(t, tr, leg.warm)
					ctx := t.Context()
					if tc.ctx != nil {
						ctx = tc.ctx(ctx)
					}
					if tc.deadline {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
						defer cancel()
					}
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://up.test/", nil)
					req.Header = tc.own.Clone()
					req.Header.Set("X-Other", "1")
					before := req.Header.Clone()
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					synctest.Wait() // a losing leg has ended

					if diff := cmp.Diff(before, req.Header); diff != "" {
						t.Errorf("the caller's Header changed (-before +after):\n%s", diff)
					}
					ws := rec.sent()[leg.warm:]
					if len(ws) < 2 && leg.name != "one attempt" {
						t.Fatalf("%d wire attempts, want more than one", len(ws))
					}
					for i, w := range ws {
						want := tc.want.Clone()
						want.Set("X-Other", "1")
						want.Set(hAttempt, strconv.Itoa(i+1))
						if tc.deadline {
							want[hTimeout] = w.header[hTimeout]
							checkLeft(t, w, 0)
						}
						if diff := cmp.Diff(want, w.header); diff != "" {
							t.Errorf("attempt %d's headers (-want +got):\n%s", i+1, diff)
						}
					}
				})
			})
		}
	}
}

// TestARepeatIsSentOnce: a call made while serving a request that was
// itself a retry or a hedge (attempt.Repeated) goes on the wire once
// against a failing upstream whose set would retry and hedge it, leaves
// the budget as it was, and is counted; a first attempt, marked or not,
// is retried and hedged as usual. The rule holds whether or not the key
// propagates.
func TestARepeatIsSentOnce(t *testing.T) {
	for _, propagate := range []bool{false, true} {
		t.Run("Propagate "+strconv.FormatBool(propagate), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &wireLog{next: &slowRT{latency: warmThenFailSlowly}}
				ev := &hedgeEvents{}
				var skipped int
				obs := ev.observer()
				obs.RetrySkipped = func(policy.RetrySkip) { skipped++ }
				tr := mustNew(t, Config{Base: rec, Observer: obs, Policies: policy.Set{
					Propagate: propagate,
					Attempts:  4, // the first and three more
					Retry:     &policy.Retry{},
					Hedge:     &policy.Hedge{},
					// No floor, so that the balance moves only with calls.
					Budget: policy.Budget{MinPerSecond: -1},
				}})
				warm(t, tr, 30)
				balance := func() float64 { return tr.Measured("up.test").BudgetBalance }
				call := func(ctx context.Context) (wires int, spent float64) {
					t.Helper()
					n, b := len(rec.sent()), balance()
					if code, err := do(t, ctx, tr); err != nil || code != 503 {
						t.Fatalf("got %d, %v", code, err)
					}
					synctest.Wait()
					return len(rec.sent()) - n, b - balance()
				}

				// A first attempt: hedged and retried, spending the budget.
				if wires, spent := call(t.Context()); wires != 4 || spent <= 0 {
					t.Fatalf("a first attempt: %d wire calls, %v tokens spent; want 4, and some", wires, spent)
				}
				started, _ := ev.counts()
				quiet := suppressions(ev)

				// A retry arriving: sent once, the budget untouched.
				wires, spent := call(attempt.With(t.Context(), 2))
				if wires != 1 || spent != 0 {
					t.Errorf("a request that is a retry: %d wire calls, %v tokens moved; want 1 and none", wires, spent)
				}
				if s, _ := ev.counts(); s != started || suppressions(ev) != quiet || skipped != 0 {
					t.Errorf("a request that is a retry: hedges started %d, suppressed %d, retries skipped %d; want none reported",
						s-started, suppressions(ev)-quiet, skipped)
				}
				if got := tr.Measured("up.test").RepeatsSentOnce; got != 1 {
					t.Errorf("RepeatsSentOnce = %d, want 1", got)
				}
				if propagate {
					if got := rec.sent()[len(rec.sent())-1].header.Get(hAttempt); got != "1" {
						t.Errorf("the call sent once carries %s %q, want its own number, 1", hAttempt, got)
					}
				}

				// A hedge arriving, too.
				if wires, spent := call(attempt.With(t.Context(), 3)); wires != 1 || spent != 0 {
					t.Errorf("a request that is a hedge: %d wire calls, %v tokens moved; want 1 and none", wires, spent)
				}

				// A first attempt marked as one: as usual.
				if wires, spent := call(attempt.With(t.Context(), 1)); wires < 2 || spent <= 0 {
					t.Errorf("a request that is a first attempt: %d wire calls, %v tokens spent; want retries and hedges", wires, spent)
				}
				if got := tr.Measured("up.test").RepeatsSentOnce; got != 2 {
					t.Errorf("RepeatsSentOnce = %d, want 2", got)
				}
			})
		})
	}
}

// TestARepeatAllocatesNothingOfItsOwn: the attempt rule is a context
// lookup and a counter.
func TestARepeatAllocatesNothingOfItsOwn(t *testing.T) {
	resp := &http.Response{StatusCode: 200, Body: http.NoBody}
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return resp, nil })
	tr := mustNew(t, Config{Base: base, Policies: retrySet()})
	req, _ := http.NewRequestWithContext(attempt.With(context.Background(), 2), http.MethodGet, "http://a.test/", nil)
	if n := testing.AllocsPerRun(1000, func() { _, _ = tr.RoundTrip(req) }); n != 0 {
		t.Errorf("%v allocations per call, want 0", n)
	}
	if got := tr.Measured("a.test").RepeatsSentOnce; got < 1000 {
		t.Errorf("RepeatsSentOnce = %d, want every call", got)
	}
}

// BenchmarkRoundTripPropagate is BenchmarkRoundTrip's retry chain with
// Propagate on: "off" is the same chain without it, for comparison in
// one run; "bare" writes the attempt number alone; "named" writes all
// four headers, the priority, tenant and deadline coming from the
// context; "timeout" adds a per-attempt timeout, so that the attempt
// already has a request of its own.
func BenchmarkRoundTripPropagate(b *testing.B) {
	named, cancel := context.WithTimeout(tenant.With(shedding.WithPriority(context.Background(), shedding.Degraded), "acme"), time.Hour)
	defer cancel()
	on := retrySet()
	on.Propagate = true
	onTimeout := on
	onTimeout.Timeout = &policy.Timeout{PerAttempt: time.Second}
	for _, bc := range []struct {
		name string
		set  policy.Set
		ctx  context.Context
	}{
		{"off", retrySet(), context.Background()},
		{"bare", on, context.Background()},
		{"named", on, named},
		{"timeout", onTimeout, named},
	} {
		b.Run(bc.name, func(b *testing.B) {
			tr := mustNew(b, Config{Base: okBase{}, Policies: bc.set})
			req, _ := http.NewRequestWithContext(bc.ctx, http.MethodGet, "http://a.test/", nil)
			req.Header.Set("Accept", "application/json")
			b.ReportAllocs()
			for b.Loop() {
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}

// TestPropagatedDeadlineIsNeverLater: the next tier's deadline, its
// arrival plus the milliseconds announced, is never later than the
// caller's, on the same clock, when the request takes up to the transit
// margin to arrive: for deadlines at every tenth of a millisecond's
// fraction, and for a hedge leg whose start an observer held up (the time
// left is measured as the request is handed to the base, not when the leg
// was prepared).
func TestPropagatedDeadlineIsNeverLater(t *testing.T) {
	// arrive has the request take the transit margin to arrive, and
	// returns by how much the deadline it announces is later than dl.
	arrive := func(r *http.Request, dl time.Time) time.Duration {
		time.Sleep(transitMargin)
		ms, err := strconv.ParseInt(r.Header.Get(hTimeout), 10, 64)
		if err != nil {
			panic(err)
		}
		return time.Now().Add(time.Duration(ms) * time.Millisecond).Sub(dl)
	}
	t.Run("every fraction", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var late time.Duration
			var dl time.Time
			base := fakeRT(func(r *http.Request) (*http.Response, error) {
				late = arrive(r, dl)
				return respond(r, 200), nil
			})
			tr := mustNew(t, Config{Base: base, Policies: policy.Set{Propagate: true}})
			for i := range 30 {
				left := 100*time.Millisecond + time.Duration(i)*100*time.Microsecond
				dl = time.Now().Add(left)
				ctx, cancel := context.WithDeadline(t.Context(), dl)
				if _, err := do(t, ctx, tr); err != nil {
					t.Fatal(err)
				}
				cancel()
				if late > 0 {
					t.Errorf("%v left: the next tier's deadline is %v later than the caller's", left, late)
				}
			}
		})
	})
	t.Run("a hedge held up", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var mu sync.Mutex
			var lates []time.Duration
			var dl time.Time
			base := &slowRT{latency: func(i int64, r *http.Request) (time.Duration, int) {
				if i >= 30 {
					late := arrive(r, dl)
					mu.Lock()
					lates = append(lates, late)
					mu.Unlock()
				}
				return 10 * time.Millisecond, 200
			}}
			tr := mustNew(t, Config{Base: base, Policies: policy.Set{Propagate: true, Hedge: &policy.Hedge{MaxConcurrent: 2}},
				Observer: &policy.Observer{HedgeStarted: func(policy.HedgeInfo) { time.Sleep(5 * time.Millisecond) }}})
			warm(t, tr, 30)
			base.slowOnce(time.Second)
			dl = time.Now().Add(300 * time.Millisecond)
			ctx, cancel := context.WithDeadline(t.Context(), dl)
			defer cancel()
			if _, err := do(t, ctx, tr); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			if len(lates) != 2 {
				t.Fatalf("%d legs measured, want the first and its hedge", len(lates))
			}
			for i, late := range lates {
				if late > 0 {
					t.Errorf("leg %d's next tier has a deadline %v later than the caller's", i+1, late)
				}
			}
		})
	})
}

// TestPropagatedDeadlineLeavesTheDialOut: over an *http.Transport, the
// time left is written again once the connection is obtained, so that a
// connection dialled for the request (a TLS handshake over a network, 30ms
// here) is not time the next tier has: its deadline, arrival plus the
// milliseconds announced, is not later than the caller's, nor than the end
// of the attempt's own timeout, on a new connection and on a kept one.
func TestPropagatedDeadlineLeavesTheDialOut(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration // the caller's; 0: none
		set      time.Duration // Timeout.PerAttempt; 0: no Timeout
	}{
		{"the caller's deadline", 300 * time.Millisecond, 0},
		{"a per-attempt timeout", 0, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var nw httptestutil.Network
				var end time.Time // the caller's deadline, or the attempt's
				var late []time.Duration
				nw.Listen("a.test:80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					ms, err := strconv.ParseInt(r.Header.Get(hTimeout), 10, 64)
					if err != nil {
						t.Errorf("%s = %q", hTimeout, r.Header.Get(hTimeout))
					}
					late = append(late, time.Now().Add(time.Duration(ms)*time.Millisecond).Sub(end))
				}))
				defer nw.Close()
				base := nw.Transport()
				dial := base.DialContext
				base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
					time.Sleep(30 * time.Millisecond) // the handshake
					return dial(ctx, network, addr)
				}
				defer base.CloseIdleConnections()
				set := policy.Set{Propagate: true}
				if tc.set > 0 {
					set.Timeout = &policy.Timeout{PerAttempt: tc.set}
				}
				tr := mustNew(t, Config{Base: base, Policies: set})
				for range 2 { // a new connection, then the kept one
					ctx, cancel := t.Context(), context.CancelFunc(func() {})
					end = time.Now().Add(tc.set)
					if tc.deadline > 0 {
						end = time.Now().Add(tc.deadline)
						ctx, cancel = context.WithDeadline(ctx, end)
					}
					resp, err := get(t, ctx, tr, "http://a.test/")
					if err != nil {
						t.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					cancel()
				}
				if len(late) != 2 {
					t.Fatalf("%d requests arrived, want 2", len(late))
				}
				for i, d := range late {
					if d > 0 {
						t.Errorf("request %d: the next tier's deadline is %v later than the caller's", i+1, d)
					}
				}
			})
		})
	}
}

// TestPropagatedDeadlineLeavesTheWaitForAConnectionOut: over an
// *http.Transport, a request that waits for a connection another request
// holds (HTTP/1.1 with MaxConnsPerHost 1: the pooled connection; HTTP/2
// with StrictMaxConcurrentRequests against a server's one stream a
// connection: a stream on the connection it was given) announces the
// time left as of when it is written: the next tier's deadline, arrival
// plus the milliseconds announced, is not later than the caller's, the
// wait (135ms) being left out.
func TestPropagatedDeadlineLeavesTheWaitForAConnectionOut(t *testing.T) {
	for _, major := range []int{1, 2} {
		t.Run(fmt.Sprintf("HTTP_%d", major), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const hold = 135 * time.Millisecond
				var dl time.Time // the waiting request's caller's deadline
				var late []time.Duration
				holding := make(chan struct{})
				srv := &http.Server{
					Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						if r.URL.Path == "/hold" {
							close(holding)
							time.Sleep(hold)
							return
						}
						ms, err := strconv.ParseInt(r.Header.Get(hTimeout), 10, 64)
						if err != nil {
							t.Errorf("%s = %q", hTimeout, r.Header.Get(hTimeout))
						}
						late = append(late, time.Now().Add(time.Duration(ms)*time.Millisecond).Sub(dl))
					}),
					Protocols: new(http.Protocols),
					HTTP2:     &http.HTTP2Config{MaxConcurrentStreams: 1},
				}
				srv.Protocols.SetHTTP1(true)
				srv.Protocols.SetUnencryptedHTTP2(true)
				l := newPipeListener()
				go srv.Serve(l)
				defer srv.Close()

				base := &http.Transport{DialContext: l.dial, Protocols: new(http.Protocols)}
				if major == 1 {
					base.MaxConnsPerHost = 1
					base.Protocols.SetHTTP1(true)
				} else {
					base.Protocols.SetUnencryptedHTTP2(true)
					base.HTTP2 = &http.HTTP2Config{StrictMaxConcurrentRequests: true}
				}
				defer base.CloseIdleConnections()
				tr := mustNew(t, Config{Base: base, Policies: policy.Set{Propagate: true}})
				held := make(chan error, 1)
				go func() {
					resp, err := get(t, t.Context(), tr, "http://a.test/hold")
					if err == nil {
						_, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
					held <- err
				}()
				<-holding
				synctest.Wait() // the connection, and the server's settings, are in
				dl = time.Now().Add(300 * time.Millisecond)
				ctx, cancel := context.WithDeadline(t.Context(), dl)
				defer cancel()
				resp, err := get(t, ctx, tr, "http://a.test/")
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.ProtoMajor != major {
					t.Fatalf("answered over %s, want HTTP/%d", resp.Proto, major)
				}
				if err := <-held; err != nil {
					t.Fatal(err)
				}
				if len(late) != 1 {
					t.Fatalf("%d requests measured, want 1", len(late))
				}
				if late[0] > 0 {
					t.Errorf("the next tier's deadline is %v later than the caller's", late[0])
				}
			})
		})
	}
}

// pipeListener is a net.Listener whose connections are net.Pipes made
// by its dial, for a server inside a synctest bubble.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }
