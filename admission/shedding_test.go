package admission

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
)

// tally counts what one class of callers got.
type tally struct {
	ok, unavailable, tooMany, other atomic.Int64
}

func (t *tally) total() int64 {
	return t.ok.Load() + t.unavailable.Load() + t.tooMany.Load() + t.other.Load()
}

func (t *tally) availability() float64 { return float64(t.ok.Load()) / float64(max(t.total(), 1)) }

// flood runs workers callers of c until stop, each sending the header
// pairs kv and counting answers in tl. A refused caller pauses as long as
// the service time before it calls again, as a real client's next request
// would come later: refusals that take no time would otherwise spin, and
// the bubble's clock with them.
func flood(wg *sync.WaitGroup, c *http.Client, workers int, stop time.Time, tl *tally, kv ...string) {
	for range workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://svc.test/", nil)
				for i := 0; i+1 < len(kv); i += 2 {
					req.Header.Set(kv[i], kv[i+1])
				}
				resp, err := c.Do(req)
				switch {
				case err != nil:
					tl.other.Add(1)
				case resp.StatusCode == http.StatusOK:
					tl.ok.Add(1)
				case resp.StatusCode == http.StatusServiceUnavailable:
					tl.unavailable.Add(1)
					time.Sleep(5 * time.Millisecond)
				case resp.StatusCode == http.StatusTooManyRequests:
					tl.tooMany.Add(1)
					time.Sleep(5 * time.Millisecond)
				default:
					tl.other.Add(1)
				}
				if resp != nil {
					resp.Body.Close()
				}
				cancel()
			}
		})
	}
}

// fixedCapacity returns a client of a server of 8 workers at 5 ms a
// request, queueing beyond that, behind admission with cfg (trusting every
// caller). Call it inside a bubble.
func fixedCapacity(t *testing.T, cfg Config) (*server, *http.Client) {
	up := httptestutil.NewUpstream(httptestutil.Options{
		Latency: httptestutil.Constant(5 * time.Millisecond), Capacity: 8, Queue: true,
	})
	cfg.Trust = trustAll
	h := mustHandler(t, up, cfg)
	return h, &http.Client{Transport: httptestutil.InMemory(h)}
}

// TestCriticalSurvivesABulkFlood: Netflix's incident on the server. A Bulk
// flood of 48 callers, far above what 8 workers at 5 ms can serve, beside
// 4 Critical callers: the limiter learns the capacity from the handler's
// latency and sheds bottom-up, Bulk first, with 429 and Retry-After: the
// server still admits Critical, so the refusal says Bulk is over what it
// can have, not that the server takes nothing.
func TestCriticalSurvivesABulkFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var e events
		h, c := fixedCapacity(t, Config{Observer: e.observer()})
		var warmup, critical, bulk tally
		var wg sync.WaitGroup
		flood(&wg, c, 4, time.Now().Add(300*time.Millisecond), &warmup) // the calm latency
		wg.Wait()
		stop := time.Now().Add(2 * time.Second)
		flood(&wg, c, 4, stop, &critical, "Resilix-Priority", "critical")
		flood(&wg, c, 48, stop, &bulk, "Resilix-Priority", "bulk")
		wg.Wait()
		// A client has its answer as the handler writes it, before the
		// handler returns and admission releases its permit: let the
		// server side finish before counting what it still holds.
		synctest.Wait()

		m := h.snapshot()
		t.Logf("critical %d/%d ok; bulk %d ok, %d 429, %d 503, %d other; limit %d, %d limit moves",
			critical.ok.Load(), critical.total(), bulk.ok.Load(), bulk.tooMany.Load(), bulk.unavailable.Load(), bulk.other.Load(), m.LimiterLimit, len(e.limits))
		if a := critical.availability(); a < 0.99 {
			t.Errorf("Critical availability %.3f, want >= 0.99", a)
		}
		if refused := bulk.tooMany.Load() + bulk.unavailable.Load(); refused*2 < bulk.total() {
			t.Errorf("Bulk: %d of %d refused, want most", refused, bulk.total())
		}
		// A Bulk request shed while Critical is admitted is a 429; a 503
		// is one that found the queue full (of other Bulk requests, by
		// then), which the race detector's scheduling makes more common:
		// 6 to 12 429s for each 503 in runs with and without it.
		if bulk.tooMany.Load() < 3*bulk.unavailable.Load() {
			t.Errorf("Bulk: %d 429s and %d 503s, want most refusals 429s", bulk.tooMany.Load(), bulk.unavailable.Load())
		}
		if n := critical.unavailable.Load() + critical.tooMany.Load() + critical.other.Load() + bulk.other.Load(); n > critical.total()/100 {
			t.Errorf("%d answers other than 200 and Bulk's refusals", n)
		}
		if len(e.limits) == 0 || e.limits[0].Key != DefaultName {
			t.Errorf("limit moves reported: %d, the first %+v", len(e.limits), e.limits)
		}
		for _, r := range e.refused() {
			if r.Gate != policy.GateAdmission {
				t.Fatalf("refusal %+v", r)
			}
		}
		if m.LimiterInFlight != 0 || m.LimiterQueued != 0 {
			t.Errorf("in flight %d, queued %d at the end", m.LimiterInFlight, m.LimiterQueued)
		}
	})
}

// TestHeavyTenantShedBeforeLight: two tenants at one priority, one with
// ten times the callers of the other. The light one keeps its requests;
// the heavy one is refused, with 429.
func TestHeavyTenantShedBeforeLight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, c := fixedCapacity(t, Config{})
		var warmup, heavy, light tally
		var wg sync.WaitGroup
		flood(&wg, c, 4, time.Now().Add(300*time.Millisecond), &warmup) // no tenant: not tracked
		wg.Wait()
		stop := time.Now().Add(2 * time.Second)
		flood(&wg, c, 40, stop, &heavy, "Resilix-Priority", "best_effort", "Resilix-Tenant", "heavy")
		flood(&wg, c, 4, stop, &light, "Resilix-Priority", "best_effort", "Resilix-Tenant", "light")
		wg.Wait()
		t.Logf("light %d/%d ok; heavy %d/%d ok, %d 429, %d 503", light.ok.Load(), light.total(),
			heavy.ok.Load(), heavy.total(), heavy.tooMany.Load(), heavy.unavailable.Load())
		if a := light.availability(); a < 0.95 {
			t.Errorf("light tenant availability %.3f, want >= 0.95", a)
		}
		if heavy.tooMany.Load()*2 < heavy.total() {
			t.Errorf("heavy tenant: %d of %d answered 429, want most", heavy.tooMany.Load(), heavy.total())
		}
	})
}
