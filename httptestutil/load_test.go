package httptestutil

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

func TestLoadRunsEveryCallAndMeasuresIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := NewUpstream(Options{
			Latency: Bimodal(10*time.Millisecond, 100*time.Millisecond, 0.1),
			Faults:  []Fault{{Probability: 0.2, Status: 503}},
			Seed:    7,
		})
		res := Load{Calls: 500, Workers: 5}.Run(&http.Client{Transport: u.RoundTripper()}, "http://up.test/")
		if len(res.Latencies) != 500 || res.OK+res.Failed != 500 || u.Stats().Requests != 500 {
			t.Fatalf("%d latencies, %d ok + %d failed, %d requests; want 500 each", len(res.Latencies), res.OK, res.Failed, u.Stats().Requests)
		}
		if res.Failed < 70 || res.Failed > 130 {
			t.Fatalf("%d failed, want about 100 (20%%)", res.Failed)
		}
		if p50, p99 := res.Quantile(0.5), res.Quantile(0.99); p50 != 10*time.Millisecond || p99 != 100*time.Millisecond {
			t.Fatalf("p50 %v p99 %v, want exactly 10ms and 100ms in virtual time", p50, p99)
		}
	})
}

func TestQuantileNearestRank(t *testing.T) {
	r := LoadResult{Latencies: []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}
	for q, want := range map[float64]time.Duration{0: 1, 0.1: 1, 0.5: 5, 0.9: 9, 0.95: 10, 1: 10} {
		if got := r.Quantile(q); got != want {
			t.Errorf("Quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if (LoadResult{}).Quantile(0.5) != 0 {
		t.Error("empty result")
	}
}
