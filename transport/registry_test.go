package transport

import (
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
)

// everyPolicy returns a fresh Set with every policy on, so that two calls
// share nothing.
func everyPolicy() policy.Set {
	return policy.Set{
		Attempts:  3,
		Budget:    policy.Budget{Ratio: 0.2},
		Retry:     &policy.Retry{BaseDelay: time.Millisecond},
		Hedge:     &policy.Hedge{Quantile: 0.9, WinRate: &policy.WinRate{Floor: 0.2}},
		Throttler: &policy.Throttler{K: 3},
		Breaker:   &policy.Breaker{ConsecutiveFailures: 7},
		Limiter:   &policy.Limiter{InitialLimit: 30},
		Bulkhead:  &policy.Bulkhead{MaxConcurrent: 4},
		RateLimit: &policy.RateLimit{PerSecond: 1000},
		Timeout:   &policy.Timeout{PerAttempt: time.Second},
	}
}

// scribble sets every number reachable from v through pointers, structs
// and maps to -1, as a caller reusing its config after New would.
func scribble(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			scribble(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			scribble(v.Field(i))
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			scribble(it.Value())
		}
	case reflect.Int, reflect.Int64:
		if v.CanSet() {
			v.SetInt(-1)
		}
	case reflect.Float64:
		if v.CanSet() {
			v.SetFloat(-1)
		}
	}
}

// chainsEqual compares compiled chains field by field, following their
// pointers; funcs compare equal when both are set or both nil.
var chainsEqual = []cmp.Option{
	cmp.AllowUnexported(compiledSet{}),
	cmp.Comparer(func(a, b policy.Classify) bool { return (a == nil) == (b == nil) }),
	cmp.Comparer(func(a, b func(*http.Response, error) bool) bool { return (a == nil) == (b == nil) }),
}

// TestEditingTheConfigAfterNewChangesNothing fails on a Transport that
// keeps a pointer into its Config: scopes are built lazily, from the chain,
// so an edit would reach every scope created after it, unvalidated.
func TestEditingTheConfigAfterNewChangesNothing(t *testing.T) {
	config := func() Config {
		return Config{
			Policies: everyPolicy(),
			PerKey:   map[string]policy.Set{"p.test": everyPolicy()},
		}
	}
	want := mustNew(t, config())

	cfg := config()
	cfg.Base = fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	tr := mustNew(t, cfg)
	scribble(reflect.ValueOf(&cfg))
	cfg.PerKey["q.test"] = policy.Set{}
	delete(cfg.PerKey, "p.test")

	if diff := cmp.Diff(want.def, tr.def, chainsEqual...); diff != "" {
		t.Errorf("Policies changed after New (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(want.perKey, tr.perKey, chainsEqual...); diff != "" {
		t.Errorf("PerKey changed after New (-before +after):\n%s", diff)
	}
	// And what the chains build: new scopes after the edit still work.
	for _, host := range []string{"fresh.test", "p.test", "q.test"} {
		resp, err := get(t, t.Context(), tr, "http://"+host+"/")
		if err != nil {
			t.Fatalf("%s after the edit: %v", host, err)
		}
		resp.Body.Close()
	}
}

// TestEditingBulkheadAndRateLimitAfterNew is the report's repro: with the
// Bulkhead and RateLimit kept by pointer, PerSecond = 0 after New refused
// every call to a new host ("retry after 2562047h"), and MaxConcurrent = 1
// narrowed the bulkhead of every new host.
func TestEditingBulkheadAndRateLimitAfterNew(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	bh := &policy.Bulkhead{MaxConcurrent: 2}
	rl := &policy.RateLimit{PerSecond: 100}
	tr := mustNew(t, Config{Base: base, Policies: policy.Set{Bulkhead: bh, RateLimit: rl}})
	bh.MaxConcurrent = 1
	rl.PerSecond = 0

	first, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	second, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatalf("second call with one slot of two held: %v", err)
	}
	second.Body.Close()
}

// TestEditingTheObserverAfterNewChangesNothing: the Observer is a struct of
// funcs the transport calls concurrently; keeping the caller's pointer
// would make an edit after New a data race and change what is reported.
func TestEditingTheObserverAfterNewChangesNothing(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	var calls int
	obs := &policy.Observer{CallDone: func(policy.CallInfo) { calls++ }}
	tr := mustNew(t, Config{Base: base, Observer: obs})
	obs.CallDone = nil
	resp, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if calls != 1 {
		t.Fatalf("CallDone called %d times, want 1", calls)
	}
}

// TestNilURLIsAnError is the report's repro: a request without a URL
// panicked in the default Key and left its body open.
func TestNilURLIsAnError(t *testing.T) {
	var sent atomic.Int32
	base := fakeRT(func(r *http.Request) (*http.Response, error) { sent.Add(1); return respond(r, 200), nil })
	for name, cfg := range map[string]Config{
		"default key": {Base: base, Policies: everyPolicy()},
		"custom key":  {Base: base, Key: func(r *http.Request) string { return r.URL.Path }},
	} {
		tr := mustNew(t, cfg)
		b := &body{Reader: strings.NewReader("payload")}
		resp, err := tr.RoundTrip(&http.Request{Method: "POST", Header: http.Header{}, Body: b})
		if resp != nil || err == nil || err.Error() != "resilix: nil Request.URL" {
			t.Errorf("%s: got %v, %v; want the error resilix: nil Request.URL", name, resp, err)
		}
		if !b.closed.Load() {
			t.Errorf("%s: the body was not closed", name)
		}
	}
	if n := sent.Load(); n != 0 {
		t.Errorf("%d requests reached the base", n)
	}
}

// TestNilRequestIsAnError: http.Client never sends a nil request, but the
// Transport never panics on anything a caller sends.
func TestNilRequestIsAnError(t *testing.T) {
	tr := mustNew(t, Config{Base: fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })})
	if resp, err := tr.RoundTrip(nil); resp != nil || err == nil || err.Error() != "resilix: nil Request" {
		t.Fatalf("got %v, %v; want the error resilix: nil Request", resp, err)
	}
}

// TestNilHeaderIsEmpty: a nil Header is read as empty on every path that
// reads one (priority, tenant, the idempotency rule), and the base gets a
// copy of the request with an empty Header, as http.Client.Do would give
// it; the caller's request keeps its nil Header.
func TestNilHeaderIsEmpty(t *testing.T) {
	var headers []http.Header
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		headers = append(headers, r.Header)
		if len(headers) == 2 {
			return respond(r, 200), nil // the GET's retry
		}
		return respond(r, 503), nil
	})
	set := everyPolicy()
	set.Hedge = nil // one wire call at a time, so the base's log needs no lock
	set.Retry = &policy.Retry{BaseDelay: time.Nanosecond, MaxDelay: time.Nanosecond}
	set.Timeout = nil
	set.Throttler = nil // it would refuse the retry after a 503 (the limiter reads the tenant too)
	tr := mustNew(t, Config{Base: base, Policies: set})
	for _, method := range []string{"GET", "POST"} {
		u, _ := url.Parse("http://a.test/")
		req := &http.Request{Method: method, URL: u}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		resp.Body.Close()
		if req.Header != nil {
			t.Fatalf("%s: the caller's request was given a Header", method)
		}
	}
	if len(headers) != 3 { // GET retried once, a plain POST not retried
		t.Fatalf("%d wire calls, want 3", len(headers))
	}
	for i, h := range headers {
		if h == nil {
			t.Fatalf("wire call %d had a nil Header", i)
		}
	}
}

// heapInUse returns the live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestKeysDoNotPinTheirURLs is the report's repro: url.Parse returns
// URL.Host as a substring of the whole URL, and a scope that kept it as its
// key kept the whole URL alive. 64 hosts called with 1 MiB query strings
// retained 66 MB.
func TestKeysDoNotPinTheirURLs(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
	})
	for name, key := range map[string]func(*http.Request) string{
		"default key": nil,
		"custom key":  func(r *http.Request) string { return r.URL.Host },
	} {
		tr := mustNew(t, Config{Base: base, Key: key})
		before := heapInUse()
		for i := range 64 {
			// Each URL its own string, as each request's would be.
			u := "http://h" + strconv.Itoa(i) + ".test/?q=" + strings.Repeat("q", 1<<20)
			req, err := http.NewRequest(http.MethodGet, u, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		retained := heapInUse() - before
		if n := tr.scopes.len(); n != 64 {
			t.Fatalf("%s: %d scopes, want 64", name, n)
		}
		runtime.KeepAlive(tr)
		t.Logf("%s: 64 keys retain %d bytes", name, retained)
		if retained > 8<<20 {
			t.Errorf("%s: 64 keys retain %.1f MB, want under 8 MB", name, float64(retained)/(1<<20))
		}
	}
}

// TestDefaultKeyIsTheCanonicalAuthority: one upstream, however its URL
// spells it, is one key. Before, "h", "H", "h:80" and "h." (http) were four
// scopes, with four breakers and four budgets for one host.
func TestDefaultKeyIsTheCanonicalAuthority(t *testing.T) {
	for _, tc := range []struct {
		want string
		urls []string
	}{
		{"h", []string{"http://h/", "http://H/", "http://h:80/", "http://h./", "HTTP://H.:80/", "http://h:/", "http://h:080/",
			"https://h/", "https://h:443/", "ws://h:80/", "wss://h.:443/"}},
		{"h:443", []string{"http://h:443/", "ws://H:443/"}},
		{"h:80", []string{"https://h:80/", "wss://h.:80/"}},
		{"h:8080", []string{"http://h:8080/", "https://H.:8080/"}},
		{"api.example.com", []string{"https://API.Example.COM./v1?q=1"}},
		{"[::1]", []string{"http://[::1]/", "http://[::1]:80/", "https://[::1]:443/"}},
		{"[::1]:8080", []string{"http://[::1]:8080/"}},
		{"[fe80::1%En0]:8080", []string{"http://[FE80::1%25En0]:8080/"}},
		{"10.0.0.1", []string{"http://10.0.0.1:80/"}},
	} {
		base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
		tr := mustNew(t, Config{Base: base})
		for _, u := range tc.urls {
			resp, err := get(t, t.Context(), tr, u)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		var keys []string
		tr.scopes.each(func(s *scope) { keys = append(keys, s.key) })
		if len(keys) != 1 || keys[0] != tc.want {
			t.Errorf("%q: keys %q, want [%q]", tc.urls, keys, tc.want)
		}
	}
}

// TestCanonicalKeyAllocatesOnlyToChangeCase: the default key is computed on
// every call, so an authority that only needs trimming is cut from the
// URL's own string.
func TestCanonicalKeyAllocatesOnlyToChangeCase(t *testing.T) {
	for _, tc := range []struct{ scheme, authority string }{
		{"http", "a.test"}, {"http", "a.test:80"}, {"https", "a.test:443"}, {"http", "a.test.:80"},
		{"http", "a.test:8080"}, {"http", "[::1]:80"}, {"HTTPS", "a.test:443"},
	} {
		if n := testing.AllocsPerRun(100, func() { _ = canonicalKey(tc.scheme, tc.authority) }); n != 0 {
			t.Errorf("canonicalKey(%q, %q): %v allocations", tc.scheme, tc.authority, n)
		}
	}
}

// TestPerKeyIsCanonicalized: a PerKey entry names its host as a request's
// default key would, so it matches however the requests spell the host.
// PerKey has no scheme: an entry's port 80 or 443 is dropped like the
// default port of the request's scheme, so "h:443" and "h" name one key.
func TestPerKeyIsCanonicalized(t *testing.T) {
	base := &script{codes: []int{503}}
	noRetry := policy.Set{}
	tr := mustNew(t, Config{Base: base, Policies: retrySet(), PerKey: map[string]policy.Set{
		"API.Example.com.": noRetry,
		"h:443":            noRetry,
		"w:80":             noRetry,
		"[::1]:8080":       noRetry,
		"::2":              noRetry,
		"p:08080":          noRetry,
	}})
	for _, u := range []string{
		"https://api.example.com/", "http://API.EXAMPLE.COM:80/",
		"https://h/", "http://h/", "https://h.:443/",
		"ws://W/", "https://w/",
		"http://[::1]:8080/", "http://[::2]/", "http://p:8080/",
	} {
		n := base.n()
		resp, err := get(t, t.Context(), tr, u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if calls := base.n() - n; calls != 1 {
			t.Errorf("%s: %d wire calls, want 1 (its PerKey entry does not retry)", u, calls)
		}
	}
	// Ports other than 80 and 443 are the key's own.
	n := base.n()
	resp, err := get(t, t.Context(), tr, "http://api.example.com:8443/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if calls := base.n() - n; calls != 3 {
		t.Errorf("api.example.com:8443: %d wire calls, want 3 (Policies retries)", calls)
	}
}

// TestPerKeyMustNameAHost: a PerKey entry that is not a host[:port] could
// never match a request's default key; New says so, naming it.
func TestPerKeyMustNameAHost(t *testing.T) {
	for _, tc := range []struct {
		perKey []string
		want   string
	}{
		{[]string{"https://api.example.com"}, `transport: PerKey["https://api.example.com"]: not a host[:port]`},
		{[]string{"api.example.com/v1"}, `transport: PerKey["api.example.com/v1"]: not a host[:port]`},
		{[]string{"/v1"}, `transport: PerKey["/v1"]: not a host[:port]`},
		{[]string{""}, `transport: PerKey[""]: not a host[:port]`},
		{[]string{"."}, `transport: PerKey["."]: not a host[:port]`},
		{[]string{":8080"}, `transport: PerKey[":8080"]: not a host[:port]`},
		{[]string{"user@h"}, `transport: PerKey["user@h"]: not a host[:port]`},
		{[]string{"h?x"}, `transport: PerKey["h?x"]: not a host[:port]`},
		{[]string{"a b"}, `transport: PerKey["a b"]: not a host[:port]`},
		{[]string{"h:abc"}, `transport: PerKey["h:abc"]: not a host[:port]`},
		{[]string{"h:99999"}, `transport: PerKey["h:99999"]: not a host[:port]: port out of range`},
		{[]string{"h:0"}, `transport: PerKey["h:0"]: not a host[:port]: port out of range`},
		{[]string{"[::1"}, `transport: PerKey["[::1"]: not a host[:port]`},
		{[]string{"1:2:3"}, `transport: PerKey["1:2:3"]: not a host[:port]`},
		{[]string{"H", "h."}, `transport: PerKey["H"] and PerKey["h."] are both the key "h"`},
		{[]string{"h:443", "h:80"}, `transport: PerKey["h:443"] and PerKey["h:80"] are both the key "h"`},
	} {
		perKey := map[string]policy.Set{}
		for _, k := range tc.perKey {
			perKey[k] = policy.Set{}
		}
		_, err := New(Config{PerKey: perKey})
		if err == nil || err.Error() != tc.want {
			t.Errorf("PerKey %q: error %v, want %s", tc.perKey, err, tc.want)
		}
	}
}

// TestPerKeyWithACustomKey: with Config.Key set, keys are whatever it
// returns, and PerKey names them as they are.
func TestPerKeyWithACustomKey(t *testing.T) {
	base := &script{codes: []int{503}}
	tr := mustNew(t, Config{
		Base:     base,
		Key:      func(r *http.Request) string { return r.Header.Get("Service") },
		Policies: retrySet(),
		PerKey:   map[string]policy.Set{"Payments/EU": {}, "": {}},
	})
	for _, svc := range []string{"Payments/EU", ""} {
		req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
		req.Header.Set("Service", svc)
		n := base.n()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if calls := base.n() - n; calls != 1 {
			t.Errorf("service %q: %d wire calls, want 1 (its PerKey entry does not retry)", svc, calls)
		}
	}
}

// holdingBase is a base whose first call to each of the hosts in hold blocks
// until release is closed; entered receives each held call as it arrives.
// Later calls answer at once, so that a test of a refusal does not hang
// when the call is let through.
type holdingBase struct {
	mu      sync.Mutex
	hold    map[string]bool
	entered chan string
	release chan struct{}
}

func newHoldingBase(hosts ...string) *holdingBase {
	g := &holdingBase{hold: map[string]bool{}, entered: make(chan string, len(hosts)), release: make(chan struct{})}
	for _, h := range hosts {
		g.hold[h] = true
	}
	return g
}

func (g *holdingBase) RoundTrip(r *http.Request) (*http.Response, error) {
	g.mu.Lock()
	hold := g.hold[r.URL.Host]
	delete(g.hold, r.URL.Host)
	g.mu.Unlock()
	if hold {
		g.entered <- r.URL.Host
		<-g.release
	}
	return respond(r, 200), nil
}

// getClose makes a GET and closes what comes back.
func getClose(t *testing.T, tr *Transport, url string) error {
	t.Helper()
	resp, err := get(t, t.Context(), tr, url)
	if err == nil {
		resp.Body.Close()
	}
	return err
}

// TestEvictionSparesACallInFlight is the report's repro: with MaxKeys 2 and
// a bulkhead of 1, calls to b and c while a call to a was in flight evicted
// a's scope, and the next call to a found a fresh bulkhead: two in flight.
func TestEvictionSparesACallInFlight(t *testing.T) {
	base := newHoldingBase("a.test")
	tr := mustNew(t, Config{Base: base, MaxKeys: 2, Policies: policy.Set{Bulkhead: &policy.Bulkhead{MaxConcurrent: 1}}})
	done := make(chan error)
	go func() { done <- getClose(t, tr, "http://a.test/") }()
	<-base.entered
	for _, h := range []string{"b.test", "c.test"} {
		if err := getClose(t, tr, "http://"+h+"/"); err != nil {
			t.Fatal(err)
		}
	}
	if err := getClose(t, tr, "http://a.test/"); !errors.Is(err, policy.ErrBulkheadFull) {
		t.Errorf("second call to a while one is in flight: %v, want ErrBulkheadFull", err)
	}
	close(base.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := tr.scopes.len(); n != 2 {
		t.Errorf("%d scopes, want MaxKeys = 2", n)
	}
}

// TestEvictionSparesAnOpenBody: a bulkhead slot is held until the response
// body is closed, after RoundTrip has returned, and the scope is busy until
// then.
func TestEvictionSparesAnOpenBody(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 200), nil })
	tr := mustNew(t, Config{Base: base, MaxKeys: 2, Policies: policy.Set{Bulkhead: &policy.Bulkhead{MaxConcurrent: 1}}})
	open, err := get(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"b.test", "c.test", "d.test"} {
		if err := getClose(t, tr, "http://"+h+"/"); err != nil {
			t.Fatal(err)
		}
	}
	if err := getClose(t, tr, "http://a.test/"); !errors.Is(err, policy.ErrBulkheadFull) {
		t.Errorf("a call to a while its body is open: %v, want ErrBulkheadFull", err)
	}
	open.Body.Close()
}

// TestEvictionSparesACallWithNoGate: a call is in flight from the start of
// RoundTrip until it returns, whatever gates hold; its scope (here, only
// its bookkeeping) stays.
func TestEvictionSparesACallWithNoGate(t *testing.T) {
	base := newHoldingBase("a.test")
	tr := mustNew(t, Config{Base: base, MaxKeys: 2})
	done := make(chan error)
	go func() { done <- getClose(t, tr, "http://a.test/") }()
	<-base.entered
	for _, h := range []string{"b.test", "c.test", "d.test"} {
		if err := getClose(t, tr, "http://"+h+"/"); err != nil {
			t.Fatal(err)
		}
	}
	if !tr.Measured("a.test").Known {
		t.Error("the scope of a call in flight was forgotten")
	}
	close(base.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestEvictionSparesAnOpenBreaker is the report's repro: a breaker opened
// for a minute was forgotten once 8 other hosts had been called, and
// traffic flowed to the dead host again.
func TestEvictionSparesAnOpenBreaker(t *testing.T) {
	var dead atomic.Int32
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		if r.URL.Host == "dead.test" {
			dead.Add(1)
			return respond(r, 503), nil
		}
		return respond(r, 200), nil
	})
	tr := mustNew(t, Config{Base: base, MaxKeys: 8, Policies: policy.Set{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1, OpenFor: time.Minute},
	}})
	_ = getClose(t, tr, "http://dead.test/")
	if st := tr.Measured("dead.test").BreakerState; st != policy.BreakerOpen {
		t.Fatalf("breaker %v after a failure, want open", st)
	}
	for i := range 50 {
		if err := getClose(t, tr, "http://h"+strconv.Itoa(i)+".test/"); err != nil {
			t.Fatal(err)
		}
	}
	if err := getClose(t, tr, "http://dead.test/"); !errors.Is(err, policy.ErrCircuitOpen) || dead.Load() != 1 {
		t.Errorf("after 50 other hosts: %v, %d calls reached the dead host; want ErrCircuitOpen and 1", err, dead.Load())
	}
	if n := tr.scopes.len(); n != 8 {
		t.Errorf("%d scopes, want MaxKeys = 8", n)
	}
}

// TestOpenBreakersDoNotGrowTheRegistry: a breaker that is not closed is
// kept before a quiet scope, not beyond MaxKeys; among scopes that are all
// tripped, the least recently used goes.
func TestOpenBreakersDoNotGrowTheRegistry(t *testing.T) {
	base := fakeRT(func(r *http.Request) (*http.Response, error) { return respond(r, 503), nil })
	tr := mustNew(t, Config{Base: base, MaxKeys: 4, Policies: policy.Set{
		Breaker: &policy.Breaker{ConsecutiveFailures: 1, OpenFor: time.Minute},
	}})
	for i := range 20 {
		_ = getClose(t, tr, "http://h"+strconv.Itoa(i)+".test/")
	}
	if n := tr.scopes.len(); n != 4 {
		t.Errorf("%d scopes, want MaxKeys = 4", n)
	}
	for i := 16; i < 20; i++ {
		if m := tr.Measured("h" + strconv.Itoa(i) + ".test"); m.BreakerState != policy.BreakerOpen {
			t.Errorf("h%d: %+v, want the four most recent breakers kept, open", i, m)
		}
	}
}

// TestRegistryGrowsOnlyForCallsInFlight: when every scope is busy, a new
// key is let in beyond MaxKeys rather than evict one, and the registry
// shrinks back to MaxKeys at the first new key after they are done.
func TestRegistryGrowsOnlyForCallsInFlight(t *testing.T) {
	hosts := []string{"a.test", "b.test", "c.test", "d.test", "e.test"}
	base := newHoldingBase(hosts...)
	tr := mustNew(t, Config{Base: base, MaxKeys: 2})
	done := make(chan error)
	for _, h := range hosts {
		go func() { done <- getClose(t, tr, "http://"+h+"/") }()
		<-base.entered
	}
	if n := tr.scopes.len(); n != len(hosts) {
		t.Errorf("%d scopes with %d calls in flight to %d hosts, want %d", n, len(hosts), len(hosts), len(hosts))
	}
	for _, h := range hosts {
		if !tr.Measured(h).Known {
			t.Errorf("%s, in flight, was forgotten", h)
		}
	}
	close(base.release)
	for range hosts {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := getClose(t, tr, "http://z.test/"); err != nil {
		t.Fatal(err)
	}
	if n := tr.scopes.len(); n != 2 {
		t.Errorf("%d scopes once the calls are done, want MaxKeys = 2", n)
	}
	if !tr.Measured("z.test").Known {
		t.Error("the new key is not held")
	}
}

// FuzzCanonicalKey: canonicalKey never panics and is idempotent, and a
// PerKey entry that New accepts names a key that is canonical for http and
// https requests, and names itself.
func FuzzCanonicalKey(f *testing.F) {
	for _, seed := range []string{
		"h", "H.:80", "h:080", "h..", "[::1]:443", "::1", "[FE80::1%En0]:8080", "[", "[]:", "h.:8080:",
		"api.example.com:443", "1.2.3.4:65535", ":80", "é.TEST.:0443",
	} {
		f.Add("http", seed)
	}
	f.Fuzz(func(t *testing.T, scheme, authority string) {
		k := canonicalKey(scheme, authority)
		if again := canonicalKey(scheme, k); again != k {
			t.Fatalf("canonicalKey(%q, %q) = %q, then %q", scheme, authority, k, again)
		}
		key, err := perKeyName(authority)
		if err != nil {
			return
		}
		for _, s := range []string{"http", "https"} {
			if c := canonicalKey(s, key); c != key {
				t.Fatalf("PerKey %q names %q, which a %s request's key would spell %q", authority, key, s, c)
			}
		}
		if again, err := perKeyName(key); err != nil || again != key {
			t.Fatalf("PerKey %q names %q, and PerKey %q names %q (%v)", authority, key, key, again, err)
		}
	})
}
