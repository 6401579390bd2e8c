package transport_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// TestHedgeRecovery measures, over real loopback sockets, how soon the
// default hedged transport's threshold comes back down after a brownout,
// and checks it against the target: the p99 of the calls that start
// between 3s and 8s after the brownout ends at most 1.5 times the calm p99
// before it, with the brownout's extra wire calls near 1 − Quantile (at
// most 1.5 times it). It runs only when RESILIX_HEDGE_RECOVERY is set, to
// 1 (an 8s brownout) or to the brownout's length:
//
//	RESILIX_HEDGE_RECOVERY=1 go test -count=1 -run '^TestHedgeRecovery$' -v ./transport
//
// No -race: the figures are latencies, and the race detector's slowdown
// of every call would be what they measure.
//
// The upstream's calm is 4ms with 3% of calls at 100ms, the tail hedging
// is for: with the threshold at the calm's p95, a slow call is hedged
// after about 4ms and answered by its hedge about 4ms later, so the calm
// p99 is about two fast calls; with the threshold still at the brownout's
// (45ms) it is that threshold plus a fast call. A calm with no tail would
// have the same p99 whatever the threshold, and would show nothing. The
// brownout makes every call 35-45ms. Calls are paced, 250 a second, each
// on its own goroutine (an open loop: a slow call does not slow the
// next), with a 5s deadline.
func TestHedgeRecovery(t *testing.T) {
	brownout := optIn(t, "RESILIX_HEDGE_RECOVERY", 8*time.Second, "a loopback measurement of the hedge threshold after a brownout; set RESILIX_HEDGE_RECOVERY=1 (or the brownout's length) to run it")
	const (
		rate   = 250
		calm   = 10 * time.Second // before the brownout
		after  = 8 * time.Second  // after it
		target = 1.5              // post-brownout p99 / calm p99, at most
		// maxExtra is the brownout's extra wire calls, in % of its calls,
		// at most: 1.5 × (1 − Quantile). Its first second or two run
		// against the calm's threshold, until Window's quantile has risen
		// (held to 10% of calls by the Budget's hedge allowance), and the
		// window's quantile, over calm and brownout samples, is below the
		// brownout's own for a while after.
		maxExtra = 7.5
	)
	calmLatency := httptestutil.Bimodal(4*time.Millisecond, 100*time.Millisecond, 0.03)
	brownoutLatency := httptestutil.Uniform(35*time.Millisecond, 45*time.Millisecond)
	up := httptestutil.NewUpstream(httptestutil.Options{Latency: calmLatency})
	srv := httptest.NewServer(up)
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 256}
	defer base.CloseIdleConnections()
	var wire [phases]atomic.Int64
	tr, err := transport.New(transport.Config{
		Base:     phaseCounted{base, &wire},
		Policies: policy.Set{Hedge: &policy.Hedge{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: tr}
	key := strings.TrimPrefix(srv.URL, "http://")

	type result struct {
		start time.Duration // since the load began
		d     time.Duration
		err   error
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	begin := time.Now()
	end := calm + brownout // of the brownout, since begin
	var thresholds []time.Duration
	phase := phaseCalm
	for i := 0; ; i++ {
		at := time.Duration(i) * time.Second / rate
		if at >= end+after {
			break
		}
		time.Sleep(time.Until(begin.Add(at)))
		if ph := phaseOf(at, calm, end); ph != phase {
			phase = ph
			up.SetLatency(map[int]httptestutil.Latency{phaseBrownout: brownoutLatency, phaseAfter: calmLatency}[ph])
		}
		if at >= end && (at-end)%(500*time.Millisecond) < time.Second/rate {
			thresholds = append(thresholds, tr.Measured(key).HedgeThreshold)
		}
		ph := phase
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), phaseKey{}, ph), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			t0 := time.Now()
			resp, err := c.Do(req)
			d := time.Since(t0)
			if err == nil {
				resp.Body.Close()
			}
			mu.Lock()
			results = append(results, result{at, d, err})
			mu.Unlock()
		})
	}
	wg.Wait()

	var calmD, downD, postD []time.Duration
	var calls [phases]int
	failed := 0
	for _, r := range results {
		if r.err != nil {
			failed++
			continue
		}
		calls[phaseOf(r.start, calm, end)]++
		switch {
		case r.start >= 2*time.Second && r.start < calm:
			calmD = append(calmD, r.d)
		case r.start >= end && r.start < end+3*time.Second:
			downD = append(downD, r.d)
		case r.start >= end+3*time.Second:
			postD = append(postD, r.d)
		}
	}
	calmP99, downP99, postP99 := p99(calmD), p99(downD), p99(postD)
	ratio := float64(postP99) / float64(calmP99)
	extra := func(p int) float64 { return 100 * float64(wire[p].Load()-int64(calls[p])) / float64(calls[p]) }
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }
	t.Logf("%d calls at %d/s: %v calm, a %v brownout (35-45ms), %v calm; %d failed", len(results), rate, calm, brownout, after, failed)
	t.Logf("%-34s %10s", "calm p99 (2s to the brownout)", ms(calmP99))
	t.Logf("%-34s %10s", "p99, 0-3s after the brownout", ms(downP99))
	t.Logf("%-34s %10s", "p99, 3-8s after the brownout", ms(postP99))
	t.Logf("%-34s %10.2f   (target <= %v)", "ratio, 3-8s after / calm", ratio, target)
	t.Logf("%-34s %9.2f%%   (target <= %v%%)", "extra wire calls, brownout", extra(phaseBrownout), maxExtra)
	t.Logf("%-34s %9.2f%%", "extra wire calls, calm before", extra(phaseCalm))
	t.Logf("%-34s %9.2f%%", "extra wire calls, calm after", extra(phaseAfter))
	var line strings.Builder
	for i, d := range thresholds {
		fmt.Fprintf(&line, " %.1fs:%s", float64(i)/2, ms(d))
	}
	t.Logf("threshold after the brownout:%s", line.String())
	if failed > 0 {
		t.Errorf("%d calls failed, want none", failed)
	}
	if ratio > target {
		t.Errorf("p99 3-8s after the brownout is %.2f× the calm's, want at most %v×", ratio, target)
	}
	if e := extra(phaseBrownout); e > maxExtra {
		t.Errorf("the brownout cost %.2f%% extra wire calls, want at most %v%%", e, maxExtra)
	}
}

// The phases of TestHedgeRecovery, by when a call starts.
const (
	phaseCalm = iota
	phaseBrownout
	phaseAfter
	phases
)

func phaseOf(at, calm, end time.Duration) int {
	switch {
	case at < calm:
		return phaseCalm
	case at < end:
		return phaseBrownout
	}
	return phaseAfter
}

type phaseKey struct{}

// phaseCounted counts the round trips that reach rt by the phase their
// call started in.
type phaseCounted struct {
	rt   http.RoundTripper
	wire *[phases]atomic.Int64
}

func (p phaseCounted) RoundTrip(r *http.Request) (*http.Response, error) {
	if ph, ok := r.Context().Value(phaseKey{}).(int); ok {
		p.wire[ph].Add(1)
	}
	return p.rt.RoundTrip(r)
}

// p99 returns the 99th percentile of ds (sorting it), 0 if empty.
func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[(len(ds)*99+99)/100-1]
}
