package transport

import (
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// memoryKeys is how many scopes BenchmarkScopeMemory creates per case:
// enough that the registry's map and the allocator's rounding average out.
const memoryKeys = 100_000

// memorySets are the chains BenchmarkScopeMemory measures: each policy
// alone, and all of them together.
func memorySets() []struct {
	name string
	set  policy.Set
} {
	all := policy.Set{
		Retry:     &policy.Retry{},
		Hedge:     &policy.Hedge{},
		Throttler: &policy.Throttler{},
		Breaker:   &policy.Breaker{},
		Limiter:   &policy.Limiter{},
		Bulkhead:  &policy.Bulkhead{MaxConcurrent: 8},
		RateLimit: &policy.RateLimit{PerSecond: 100},
		Timeout:   &policy.Timeout{PerAttempt: time.Second},
	}
	return []struct {
		name string
		set  policy.Set
	}{
		{"none", policy.Set{}},
		{"retry", policy.Set{Retry: all.Retry}},
		{"hedge", policy.Set{Hedge: all.Hedge}},
		{"throttler", policy.Set{Throttler: all.Throttler}},
		{"breaker", policy.Set{Breaker: all.Breaker}},
		{"limiter", policy.Set{Limiter: all.Limiter}},
		{"bulkhead", policy.Set{Bulkhead: all.Bulkhead}},
		{"ratelimit", policy.Set{RateLimit: all.RateLimit}},
		{"timeout", policy.Set{Timeout: all.Timeout}},
		{"all", all},
	}
}

// scopeBytes returns the heap bytes one scope of set costs, on average
// over n keys created through the registry (each entered and left once,
// as a call with no tenant would), the registry's map entry and the key's
// copy included.
func scopeBytes(tb testing.TB, set policy.Set, n int) float64 {
	return scopeBytesOver(tb, okBase{}, set, n, nil)
}

// scopeBytesOver is scopeBytes over base, with then called on each scope
// just created and left (nil: nothing).
func scopeBytesOver(tb testing.TB, base http.RoundTripper, set policy.Set, n int, then func(s *scope, i int, now time.Time)) float64 {
	tb.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "host-" + strconv.Itoa(i) + ".example.com"
	}
	tr, err := New(Config{Base: base, Policies: set, MaxKeys: 2 * n})
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Unix(1e9, 0)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i, k := range keys {
		s := tr.scopes.enter(k, now)
		s.leave()
		if then != nil {
			then(s, i, now)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := tr.scopes.len(); got != n {
		tb.Fatalf("registry holds %d scopes, want %d", got, n)
	}
	runtime.KeepAlive(tr)
	runtime.KeepAlive(keys)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// BenchmarkScopeMemory reports the heap bytes per scope (B/scope) of each
// policy alone and of all together, over 100,000 keys with MaxKeys large
// enough that none is evicted. Time per op is not the point: run it with
// -benchtime=1x.
//
// The Replicas cases, over 10,000 keys and a base cloned from
// http.DefaultTransport, also report B/lane, what each lane adds to a
// scope without Replicas (its pool, a clone of the base with no
// connection, and its share of the key's lane.Set included), and B/pool,
// a bare clone of that base.
//
//	go test -run '^$' -bench ScopeMemory -benchtime=1x ./transport
func BenchmarkScopeMemory(b *testing.B) {
	for _, c := range memorySets() {
		b.Run(c.name, func(b *testing.B) {
			var per float64
			for range b.N {
				per = scopeBytes(b, c.set, memoryKeys)
			}
			b.ReportMetric(per, "B/scope")
		})
	}
	for _, c := range memoryLaneSets() {
		b.Run(c.name, func(b *testing.B) {
			var per, none float64
			for range b.N {
				none = scopeBytesOver(b, laneBase(), policy.Set{}, memoryLaneKeys, nil)
				per = scopeBytesOver(b, laneBase(), policy.Set{Replicas: &c.r}, memoryLaneKeys, c.then)
			}
			b.ReportMetric(per, "B/scope")
			b.ReportMetric((per-none)/float64(c.lanes), "B/lane")
			b.ReportMetric(poolBytes(laneBase(), memoryLaneKeys), "B/pool")
		})
	}
}

// memoryLaneKeys is how many scopes BenchmarkScopeMemory creates per
// case with Replicas: each holds its lanes' pools, some KB a scope.
const memoryLaneKeys = 10_000

// laneBase is the base of the Replicas cases: a clone of
// http.DefaultTransport, not yet used, as a program's own would be.
func laneBase() *http.Transport { return http.DefaultTransport.(*http.Transport).Clone() }

// endpointsAnswer gives scope s (the i-th) four Endpoints lanes, as the
// answer to its first refresh would: four addresses of its own, built
// here as a resolver builds them.
func endpointsAnswer(s *scope, i int, now time.Time) {
	addrs := make([]string, 4)
	for j := range addrs {
		addrs[j] = "10." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + "." + strconv.Itoa(j+1) + ":8443"
	}
	if !s.lanes.StartRefresh(now) {
		panic("no refresh due on a new key with Endpoints")
	}
	for _, l := range s.lanes.Update(now, addrs, nil).Drained {
		l.Pool.CloseIdleConnections() // the request's own address's lane, drained
	}
}

// memoryLaneSets are the Replicas cases of BenchmarkScopeMemory, Replicas
// alone: four connection lanes, and four lanes of Endpoints' addresses
// (then gives each scope its answer).
func memoryLaneSets() []struct {
	name  string
	r     policy.Replicas
	lanes int
	then  func(*scope, int, time.Time)
} {
	return []struct {
		name  string
		r     policy.Replicas
		lanes int
		then  func(*scope, int, time.Time)
	}{
		{"replicas-connections-4", policy.Replicas{Connections: 4}, 4, nil},
		{"replicas-endpoints-4", policy.Replicas{Endpoints: Static("127.0.0.1:1")}, 4, endpointsAnswer},
	}
}

// poolBytes returns the heap bytes of a clone of base, on average over n.
func poolBytes(base *http.Transport, n int) float64 {
	pools := make([]*http.Transport, n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range pools {
		pools[i] = base.Clone()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(pools)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// TestScopeMemoryBudget holds a scope to its memory budget: at most 8 KB
// with every policy on, 1 KB with retry alone, and 8 KB with four lanes
// (pools with no connection), calls naming no tenant (BenchmarkScopeMemory
// reports every case).
func TestScopeMemoryBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("creates tens of thousands of scopes")
	}
	budgets := map[string]float64{"all": 8 << 10, "retry": 1 << 10}
	for _, c := range memorySets() {
		budget, ok := budgets[c.name]
		if !ok {
			continue
		}
		if got := scopeBytes(t, c.set, 20_000); got > budget {
			t.Errorf("%s: %.0f B per scope, want at most %.0f", c.name, got, budget)
		} else {
			t.Logf("%s: %.0f B per scope (budget %.0f)", c.name, got, budget)
		}
	}
	for _, c := range memoryLaneSets() {
		const budget = 8 << 10
		if got := scopeBytesOver(t, laneBase(), policy.Set{Replicas: &c.r}, 2_000, c.then); got > budget {
			t.Errorf("%s: %.0f B per scope, want at most %d", c.name, got, budget)
		} else {
			t.Logf("%s: %.0f B per scope (budget %d)", c.name, got, budget)
		}
	}
}
