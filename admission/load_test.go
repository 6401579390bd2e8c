package admission

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/internal/orca"
	"github.com/resilix/resilix/policy"
)

// report reads the load report of an answer's header, failing the test
// when it is not one.
func report(t *testing.T, h http.Header) orca.Report {
	t.Helper()
	r, st, v := orca.Parse(h)
	if st != orca.OK {
		t.Fatalf("load report %q: %v", v, st)
	}
	return r
}

// TestLoadReportOnEveryAnswer: with ReportAll, every answer carries the
// server's load as it stands when its headers go out: a status written,
// a body written with no status, nothing written at all; the request
// answered is in flight then. A report next wrote itself is kept.
func TestLoadReportOnEveryAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		next http.HandlerFunc
	}{
		{"WriteHeader", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }},
		{"Write", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("x")) }},
		{"WriteString", func(w http.ResponseWriter, r *http.Request) {
			w.(interface{ WriteString(string) (int, error) }).WriteString("x")
		}},
		{"Flush", func(w http.ResponseWriter, r *http.Request) { w.(http.Flusher).Flush() }},
		{"nothing", func(w http.ResponseWriter, r *http.Request) {}},
		{"after a 1xx", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusOK)
		}},
	} {
		h := mustHandler(t, tc.next, Config{LoadReports: ReportAll})
		w := serve(h, newRequest(context.Background()))
		r := report(t, w.Header())
		if r.InFlight != 1 || r.Limit != 20 || r.Queued != 0 || r.Application != 0.05 || r.Has&orca.FieldRPS == 0 {
			t.Errorf("%s: report %+v; want 1 in flight of 20, none queued, utilization 0.05", tc.name, r)
		}
	}

	own := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("endpoint-load-metrics", "TEXT cpu_utilization=0.9")
	})
	w := serve(mustHandler(t, own, Config{LoadReports: ReportAll}), newRequest(context.Background()))
	if got := w.Header().Values(orca.Header); len(got) != 1 || got[0] != "TEXT cpu_utilization=0.9" {
		t.Errorf("next's own report became %q", got)
	}
}

// TestLoadReportsToWhom: by default, only to the callers Trust trusts,
// Trust asked at most once a request; nobody's with no Trust; as
// LoadReports says otherwise.
func TestLoadReportsToWhom(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	var asked atomic.Int64
	trust := func(want bool) func(*http.Request) bool {
		return func(*http.Request) bool { asked.Add(1); return want }
	}
	for _, tc := range []struct {
		name    string
		cfg     Config
		kv      []string
		want    bool
		askedMe int64
	}{
		{"no Trust", Config{}, nil, false, 0},
		{"trusted", Config{Trust: trust(true)}, nil, true, 1},
		{"trusted, with a priority", Config{Trust: trust(true)}, []string{"Resilix-Priority", "bulk"}, true, 1},
		{"untrusted", Config{Trust: trust(false)}, []string{"Resilix-Tenant", "a"}, false, 1},
		{"ReportAll", Config{LoadReports: ReportAll}, nil, true, 0},
		{"ReportAll, untrusted", Config{LoadReports: ReportAll, Trust: trust(false)}, nil, true, 0},
		{"ReportNone", Config{LoadReports: ReportNone, Trust: trust(true)}, nil, false, 0},
	} {
		asked.Store(0)
		w := serve(mustHandler(t, ok, tc.cfg), newRequest(context.Background(), tc.kv...))
		if got := w.Header().Get(orca.Header) != ""; got != tc.want || asked.Load() != tc.askedMe {
			t.Errorf("%s: reported %v, Trust asked %d times; want %v, %d", tc.name, got, asked.Load(), tc.want, tc.askedMe)
		}
	}
	if _, err := Handler(ok, Config{LoadReports: 2}); err == nil || !strings.Contains(err.Error(), "admission: LoadReports must be") {
		t.Errorf("LoadReports 2: %v", err)
	}
}

// TestLoadReportOnRefusals: a 503 from a full queue and a 504 from a
// deadline tell a trusted caller the load too: the limit full, the queue
// full.
func TestLoadReportOnRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBlocker()
		h := mustHandler(t, b, Config{Trust: trustAll, Limiter: policy.Limiter{InitialLimit: 1, MaxLimit: 1, QueueFactor: 1}})
		_, first := inBackground(h, newRequest(context.Background()))
		_, second := inBackground(h, newRequest(context.Background())) // queued
		synctest.Wait()
		w := serve(h, newRequest(context.Background()))
		if r := report(t, w.Header()); w.Code != http.StatusServiceUnavailable || r.InFlight != 1 || r.Limit != 1 || r.Queued != 1 || r.Application != 1 {
			t.Errorf("503's report %+v", r)
		}
		w = serve(h, newRequest(context.Background(), "Resilix-Timeout-Ms", "0"))
		if r := report(t, w.Header()); w.Code != http.StatusGatewayTimeout || r.InFlight != 1 || r.Queued != 1 {
			t.Errorf("504's report %+v", r)
		}
		close(b.release)
		<-first
		<-second
	})
}

// TestLoadReportRate: rps_fractional is the requests next finished over
// the last second.
func TestLoadReportRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
		h := mustHandler(t, ok, Config{LoadReports: ReportAll})
		var w interface{ Header() http.Header }
		for range 50 { // 50 a second, for 3 s
			for range 5 {
				w = serve(h, newRequest(context.Background()))
			}
			time.Sleep(100 * time.Millisecond)
		}
		// The last answer counts the 49 before it, as its own is not
		// finished when its headers go out, give or take the window's
		// edge.
		if r := report(t, w.Header()); r.RPS < 45 || r.RPS > 55 {
			t.Errorf("rps_fractional %v, want about 50", r.RPS)
		}
		time.Sleep(3 * time.Second)
		w = serve(h, newRequest(context.Background()))
		if r := report(t, w.Header()); r.RPS != 0 {
			t.Errorf("rps_fractional %v after 3 s idle, want 0", r.RPS)
		}
	})
}

// TestRateMeter: the sliding window over fixed instants.
func TestRateMeter(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var empty rateMeter
	if got := empty.rate(t0); got != 0 {
		t.Errorf("empty: %v", got)
	}
	for _, tc := range []struct {
		ms   int
		want float64
	}{
		{999, 10},
		{1000, 10},   // the last window, whole
		{1500, 5},    // half of it
		{1999, 0.01}, // almost none
		{2000, 0},
	} {
		var m rateMeter
		for i := range 10 {
			m.add(at(i * 100)) // 10 over the first second
		}
		if got := m.rate(at(tc.ms)); got < tc.want-1e-9 || got > tc.want+1e-9 {
			t.Errorf("rate at %d ms = %v, want %v", tc.ms, got, tc.want)
		}
	}
}

// TestLoadReportAllocations: a report costs two allocations per answer.
func TestLoadReportAllocations(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	count := func(cfg Config) float64 {
		h := mustHandler(t, ok, cfg)
		r := newRequest(context.Background())
		w := &discard{h: http.Header{}}
		return testing.AllocsPerRun(200, func() {
			delete(w.h, orca.Header)
			h.ServeHTTP(w, r)
		})
	}
	off, on := count(Config{LoadReports: ReportNone}), count(Config{LoadReports: ReportAll})
	if on-off > 2 {
		t.Errorf("a report costs %v allocations, want at most 2 (%v without, %v with)", on-off, off, on)
	}
}
