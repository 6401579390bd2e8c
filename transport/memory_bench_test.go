package transport

import (
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
	tb.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "host-" + strconv.Itoa(i) + ".example.com"
	}
	tr, err := New(Config{Base: okBase{}, Policies: set, MaxKeys: 2 * n})
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Unix(1e9, 0)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, k := range keys {
		tr.scopes.enter(k, now).leave()
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
}

// TestScopeMemoryBudget holds a scope to its memory budget: at most 8 KB
// with every policy on and 1 KB with retry alone, calls naming no tenant
// (BenchmarkScopeMemory reports every case).
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
}
