//go:build unix

package redisrate

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// BenchmarkCall is one call through a transport to an in-memory base: with
// no rate limit, with the local one, and with the shared one on a real
// Redis, so that the shared rate limit's cost per call is its ns/op less
// none's. allocs/call counts every allocation exactly, the asks' included
// (allocs/op rounds down); asks/call is the store's round trips per call
// and refused/call the calls that found no token. The limit is one the
// calls never reach, in a bucket emptied for each run.
//
// One goroutine calling in a loop is faster than any API quota: it spends
// a lease of 100 sooner than a round trip to Redis brings the next, so it
// waits for the store (one ask is in flight at a time per key). A lease
// of 10000 stays warm, and shows the cost per call of the lease itself.
func BenchmarkCall(b *testing.B) {
	s := startRedis(b)
	store := &countingStore{SharedLimiter: mustNew(b, newClient(b, s.addr), Limit{Rate: 1_000_000, Burst: 100_000_000})}
	for _, tc := range []struct {
		name string
		rl   *policy.RateLimit
	}{
		{"none", nil},
		{"local", &policy.RateLimit{PerSecond: 1e12}},
		{"shared/lease=100", &policy.RateLimit{PerSecond: 1e12, Shared: store, Lease: 100}},
		{"shared/lease=1000", &policy.RateLimit{PerSecond: 1e12, Shared: store, Lease: 1000}},
		{"shared/lease=10000", &policy.RateLimit{PerSecond: 1e12, Shared: store, Lease: 10000}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			if err := command(s.addr, "FLUSHALL", "+OK"); err != nil {
				b.Fatal(err)
			}
			tr, err := transport.New(transport.Config{Base: okBase{}, Policies: policy.Set{RateLimit: tc.rl}})
			if err != nil {
				b.Fatal(err)
			}
			roundTrip(tr) // the first lease
			time.Sleep(10 * time.Millisecond)
			asks0 := len(store.all())
			refused := 0
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.ReportAllocs()
			for b.Loop() {
				if ok, _, _ := roundTrip(tr); !ok {
					refused++
				}
			}
			runtime.ReadMemStats(&after)
			time.Sleep(2 * policy.DefaultStoreTimeout) // the last ask answers
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N), "allocs/call")
			b.ReportMetric(float64(len(store.all())-asks0)/float64(b.N), "asks/call")
			b.ReportMetric(float64(refused)/float64(b.N), "refused/call")
		})
	}
}

// BenchmarkTake is one ask to a real Redis on loopback: the round trip a
// lease saves all but one of its calls.
func BenchmarkTake(b *testing.B) {
	s := startRedis(b)
	l := mustNew(b, newClient(b, s.addr), Limit{Rate: 1_000_000, Burst: 1_000_000})
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := l.Take(b.Context(), "k", n); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
