package transport

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/tenant"
)

// tally counts the outcomes of one class of callers.
type tally struct {
	ok, shed, other atomic.Int64
}

func (t *tally) total() int64 { return t.ok.Load() + t.shed.Load() + t.other.Load() }

func (t *tally) availability() float64 { return float64(t.ok.Load()) / float64(max(t.total(), 1)) }

// flood runs workers callers until stop, each making calls with ctx
// decorated by decorate and counting outcomes in tl. A caller that is shed
// pauses as long as the upstream's service time before its next call, as
// a real client's next request would come later: without it, refusals
// that take no time would spin in place, a bubble's clock with them (or,
// over loopback, starve the machine rather than the upstream).
func flood(wg *sync.WaitGroup, c *http.Client, url string, workers int, stop time.Time,
	decorate func(context.Context) context.Context, tl *tally) {
	for range workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(decorate(context.Background()), 5*time.Second)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				resp, err := c.Do(req)
				switch {
				case err == nil && resp.StatusCode == 200:
					tl.ok.Add(1)
				case errors.Is(err, policy.ErrShed):
					tl.shed.Add(1)
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

// limitedUpstream is a fixed-capacity upstream in memory, 8 workers at 5ms
// a call with a queue beyond that, and a client whose transport runs the
// adaptive limiter in front of it. Call it inside a bubble.
func limitedUpstream(t *testing.T) (*Transport, *http.Client, string) {
	up := httptestutil.NewUpstream(httptestutil.Options{
		Latency: httptestutil.Constant(5 * time.Millisecond), Capacity: 8, Queue: true,
	})
	tr := mustNew(t, Config{Base: up.RoundTripper(), Policies: policy.Set{Limiter: &policy.Limiter{}}})
	return tr, &http.Client{Transport: tr}, "http://up.test/"
}

// TestCriticalSurvivesABulkFlood is Netflix's incident in miniature: a Bulk
// flood far above what a fixed-capacity upstream can serve (8 workers, 5ms
// a call, queueing beyond that), beside a steady Critical load. The limiter
// learns the capacity from latency and sheds the flood, Bulk first.
func TestCriticalSurvivesABulkFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, c, url := limitedUpstream(t)

		calm := func(ctx context.Context) context.Context { return ctx }
		bulk := func(ctx context.Context) context.Context { return shedding.WithPriority(ctx, shedding.Bulk) }
		var warmup, critical, flooded tally
		var wg sync.WaitGroup
		flood(&wg, c, url, 4, time.Now().Add(300*time.Millisecond), calm, &warmup) // learn the calm latency
		wg.Wait()
		stop := time.Now().Add(2 * time.Second)
		flood(&wg, c, url, 4, stop, calm, &critical) // untagged: Critical
		flood(&wg, c, url, 48, stop, bulk, &flooded)
		wg.Wait()

		m := tr.Measured("up.test")
		t.Logf("critical %d/%d ok; bulk %d ok, %d shed, %d other; limit %d",
			critical.ok.Load(), critical.total(), flooded.ok.Load(), flooded.shed.Load(), flooded.other.Load(), m.LimiterLimit)
		if a := critical.availability(); a < 0.99 {
			t.Errorf("Critical availability %.3f, want >= 0.99", a)
		}
		if flooded.shed.Load()*2 < flooded.total() {
			t.Errorf("Bulk: %d of %d shed, want most", flooded.shed.Load(), flooded.total())
		}
	})
}

// TestHeavyTenantShedBeforeLight: two tenants at the same priority, one with
// ten times the callers of the other, against the same fixed capacity. The
// light tenant keeps its calls; the heavy one absorbs the shedding.
func TestHeavyTenantShedBeforeLight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, c, url := limitedUpstream(t)

		as := func(id string) func(context.Context) context.Context {
			return func(ctx context.Context) context.Context {
				return tenant.With(shedding.WithPriority(ctx, shedding.BestEffort), id)
			}
		}
		var warmup, heavy, light tally
		var wg sync.WaitGroup
		calm := func(ctx context.Context) context.Context { return ctx } // no tenant: not tracked
		flood(&wg, c, url, 4, time.Now().Add(300*time.Millisecond), calm, &warmup)
		wg.Wait()
		stop := time.Now().Add(2 * time.Second)
		flood(&wg, c, url, 40, stop, as("heavy"), &heavy)
		flood(&wg, c, url, 4, stop, as("light"), &light)
		wg.Wait()
		t.Logf("light %d/%d ok; heavy %d/%d ok, %d shed", light.ok.Load(), light.total(),
			heavy.ok.Load(), heavy.total(), heavy.shed.Load())
		if a := light.availability(); a < 0.95 {
			t.Errorf("light tenant availability %.3f, want >= 0.95", a)
		}
		if heavy.shed.Load() == 0 {
			t.Error("the heavy tenant was never shed: the test did not overload the upstream")
		}
	})
}

// TestHedgingDoesNotShrinkTheLimit is the seed's open question, kept as a
// regression test: hedging adds attempts in flight, and the limiter's growth
// is tethered to what is in flight, so at the same latency the limit with
// hedging ends at least where it ends without.
func TestHedgingDoesNotShrinkTheLimit(t *testing.T) {
	limit := func(hedge *policy.Hedge) int {
		var got int
		synctest.Test(t, func(t *testing.T) {
			up := httptestutil.NewUpstream(httptestutil.Options{
				Latency: httptestutil.Bimodal(10*time.Millisecond, 40*time.Millisecond, 0.1), Seed: 3,
			})
			set := policy.Set{Limiter: &policy.Limiter{}, Hedge: hedge}
			tr := mustNew(t, Config{Base: up.RoundTripper(), Policies: set})
			httptestutil.Load{Calls: 20000, Workers: 24}.Run(&http.Client{Transport: tr}, "http://up.test/")
			synctest.Wait() // the last rounds' losers release their permits
			got = tr.Measured("up.test").LimiterLimit
		})
		return got
	}
	without, with := limit(nil), limit(&policy.Hedge{Quantile: 0.8})
	t.Logf("limit without hedging %d, with %d", without, with)
	if with < without {
		t.Fatalf("hedging shrank the limit from %d to %d", without, with)
	}
}

// TestThrottlerShedsBulkFirstWhenTheUpstreamRefuses: an upstream with room
// for two calls at a time refuses the rest with 503. The client-side
// throttler (SRE book ch. 21) then lets through about K requests per
// accept (the book's 2 here) and refuses the excess locally with
// ErrThrottled (a kind of ErrShed), taking it from Bulk, three quarters of
// the traffic here, so that Critical is not throttled at all.
func TestThrottlerShedsBulkFirstWhenTheUpstreamRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.Constant(10 * time.Millisecond), Capacity: 2,
		})
		tr := mustNew(t, Config{Base: up.RoundTripper(), Policies: policy.Set{Throttler: &policy.Throttler{K: 2}}})
		var bulk, critical tally
		var wg sync.WaitGroup
		stop := time.Now().Add(20 * time.Second)
		for w := range 8 {
			prio, tl := shedding.Bulk, &bulk
			if w < 2 {
				prio, tl = shedding.Critical, &critical
			}
			wg.Go(func() {
				for time.Now().Before(stop) {
					req, _ := http.NewRequestWithContext(shedding.WithPriority(context.Background(), prio),
						http.MethodGet, "http://up.test/", nil)
					resp, err := tr.RoundTrip(req)
					switch {
					case err == nil:
						if resp.StatusCode == 200 {
							tl.ok.Add(1)
						} else {
							tl.other.Add(1)
						}
						resp.Body.Close()
					case errors.Is(err, policy.ErrThrottled) && errors.Is(err, policy.ErrShed):
						tl.shed.Add(1)
					default:
						t.Errorf("unexpected error %v", err)
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		t.Logf("bulk: %d ok, %d 503, %d throttled; critical: %d ok, %d 503, %d throttled",
			bulk.ok.Load(), bulk.other.Load(), bulk.shed.Load(), critical.ok.Load(), critical.other.Load(), critical.shed.Load())
		if c := critical.shed.Load(); c*50 > critical.total() {
			t.Errorf("Critical throttled %d of %d times; Bulk should absorb the throttling", c, critical.total())
		}
		if b := bulk.shed.Load(); b*10 < bulk.total()*4 {
			t.Errorf("Bulk throttled %d of %d times, want at least 40%%", b, bulk.total())
		}
	})
}
