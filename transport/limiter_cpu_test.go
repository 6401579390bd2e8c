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
)

// The tests in this file run the limiter against an upstream that is never
// overloaded, seen through a client whose own CPU is the bottleneck: the
// loopback case of a sub-millisecond handler on a small machine, where what
// the limiter measures from dispatch to headers is mostly the client's own
// scheduling. Everything runs in a bubble, so "healthy" is exact: the
// upstream answers in 100 µs whatever its load, and every microsecond above
// that is the client's.

// clientCPU is the latency a client's own CPU adds to each call it
// measures: every runnable goroutine of the client delays the others.
// A call in flight adds perCall to each call dispatched while it is in
// flight, a caller that spins on refusals adds perSpinner (it never blocks,
// so it holds a core for whole time slices), and the machine's other work
// multiplies the lot by the neighbour's load.
type clientCPU struct {
	perCall, perSpinner time.Duration

	active, spinning atomic.Int64
	load             atomic.Int64 // the neighbour's factor, in percent; 100 when calm
}

func newClientCPU(perCall, perSpinner time.Duration) *clientCPU {
	c := &clientCPU{perCall: perCall, perSpinner: perSpinner}
	c.load.Store(100)
	return c
}

// delay is what the client's CPU adds to a call dispatched now.
func (c *clientCPU) delay() time.Duration {
	d := time.Duration(c.active.Load())*c.perCall + time.Duration(c.spinning.Load())*c.perSpinner
	return d * time.Duration(c.load.Load()) / 100
}

// cpuRoundTripper adds the client's CPU to the latency of base, inside
// the window the limiter measures.
type cpuRoundTripper struct {
	cpu  *clientCPU
	base http.RoundTripper
}

func (rt cpuRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	rt.cpu.active.Add(1)
	defer rt.cpu.active.Add(-1)
	if d := rt.cpu.delay(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-req.Context().Done():
			t.Stop()
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, req.Context().Err()
		}
	}
	return rt.base.RoundTrip(req)
}

// neighbour is other work on the machine: until stop, it loads the CPU by
// the factor busy (in percent) for busyFor, then leaves it calm for
// calmFor.
func (c *clientCPU) neighbour(wg *sync.WaitGroup, busy int64, busyFor, calmFor time.Duration, stop time.Time) {
	wg.Go(func() {
		for time.Now().Before(stop) {
			time.Sleep(calmFor)
			c.load.Store(busy)
			time.Sleep(busyFor)
			c.load.Store(100)
		}
	})
}

// cpuLoad is a closed loop of callers through c until stop. A caller that
// is refused waits pause before its next call when pause > 0; otherwise it
// calls again at once, spinning: it costs the CPU perSpinner until it is
// admitted again, and each refusal takes it spinCost of virtual time.
type cpuLoad struct {
	callers  int
	pause    time.Duration
	spinCost time.Duration
}

// cpuResult counts what a cpuLoad saw.
type cpuResult struct {
	ok, refused, other atomic.Int64
}

func (r *cpuResult) refusedShare() float64 {
	n := r.ok.Load() + r.refused.Load() + r.other.Load()
	return float64(r.refused.Load()) / float64(max(n, 1))
}

func (l cpuLoad) run(wg *sync.WaitGroup, c *http.Client, cpu *clientCPU, url string, stop time.Time, res *cpuResult) {
	for range l.callers {
		wg.Go(func() {
			spinning := false
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				resp, err := c.Do(req)
				if resp != nil {
					resp.Body.Close()
				}
				cancel()
				refused := errors.Is(err, policy.ErrRejected)
				switch {
				case refused:
					res.refused.Add(1)
				case err == nil && resp.StatusCode == http.StatusOK:
					res.ok.Add(1)
				default:
					res.other.Add(1)
				}
				if refused && l.pause <= 0 && !spinning {
					cpu.spinning.Add(1)
					spinning = true
				} else if !refused && spinning {
					cpu.spinning.Add(-1)
					spinning = false
				}
				switch {
				case refused && l.pause > 0:
					time.Sleep(l.pause)
				case refused:
					time.Sleep(l.spinCost)
				}
			}
			if spinning {
				cpu.spinning.Add(-1)
			}
		})
	}
}

// limitLog records a transport's limit moves.
type limitLog struct {
	mu    sync.Mutex
	moves []policy.LimitTransition
}

func (g *limitLog) observer() *policy.Observer {
	return &policy.Observer{LimitTransition: func(lt policy.LimitTransition) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.moves = append(g.moves, lt)
	}}
}

// lowest returns the lowest limit moved to, or 0 if it never moved.
func (g *limitLog) lowest() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	low := 0
	for _, m := range g.moves {
		if low == 0 || m.To < low {
			low = m.To
		}
	}
	return low
}

// healthyUpstream is an upstream that answers in 100 µs whatever its load,
// behind a client whose CPU adds 20 µs per call in flight and 500 µs per
// spinning caller, with a transport that runs lim in front of it.
func healthyUpstream(t *testing.T, lim policy.Limiter) (*Transport, *http.Client, *clientCPU, *limitLog) {
	up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(100 * time.Microsecond)})
	cpu := newClientCPU(20*time.Microsecond, 500*time.Microsecond)
	var log limitLog
	tr := mustNew(t, Config{
		Base:     cpuRoundTripper{cpu: cpu, base: up.RoundTripper()},
		Policies: policy.Set{Limiter: &lim},
		Observer: log.observer(),
	})
	return tr, &http.Client{Transport: tr}, cpu, &log
}

// TestLimiterHealthyUpstreamBusyClient is the two scenarios in
// virtual time: 16 closed-loop callers of an upstream that is never
// overloaded, on a client whose own CPU makes each call slower the more
// calls it has in flight and whose machine is periodically busy with other
// work (a neighbour that triples the client's share of the latency for 100
// ms in every 300). A refused caller waits 1 ms, or calls again at once,
// spinning. Nothing is overloaded, so the limiter must refuse nothing and
// keep its limit at or above the 16 calls in use.
func TestLimiterHealthyUpstreamBusyClient(t *testing.T) {
	for _, tt := range []struct {
		name string
		load cpuLoad
	}{
		{"refused-waits-1ms", cpuLoad{callers: 16, pause: time.Millisecond}},
		{"refused-retries-at-once", cpuLoad{callers: 16, spinCost: 50 * time.Microsecond}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, c, cpu, log := healthyUpstream(t, policy.Limiter{})
				var wg sync.WaitGroup
				var res cpuResult
				stop := time.Now().Add(2 * time.Second)
				cpu.neighbour(&wg, 300, 100*time.Millisecond, 200*time.Millisecond, stop)
				tt.load.run(&wg, c, cpu, "http://up.test/", stop, &res)
				wg.Wait()
				m := tr.Measured("up.test")
				t.Logf("%d ok, %d refused (%.3f%%), %d other; limit %d, lowest %d, %d moves",
					res.ok.Load(), res.refused.Load(), 100*res.refusedShare(), res.other.Load(), m.LimiterLimit, log.lowest(), len(log.moves))
				if res.refused.Load() != 0 {
					t.Errorf("%d calls refused by a limiter in front of a healthy upstream", res.refused.Load())
				}
				if low := log.lowest(); low != 0 && low < 16 || m.LimiterLimit < 16 {
					t.Errorf("limit went down to %d (ends at %d) with 16 calls in use", low, m.LimiterLimit)
				}
			})
		})
	}
}

// TestLimiterRefusalStormCannotLowerTheLimit: the storm is made permanent,
// with a MaxLimit of 8 (and so 4 places in the queue) under 16 callers who
// call again at once when refused: four callers spin at all times, and
// each spinning caller costs the client's CPU as much as 25 calls in
// flight. The neighbour's busy spells make the latency jump. A jump may
// shrink the limit, but every shrink leaves more callers spinning, which
// raises the latency instead of lowering it: the refusals must not ratchet
// the limit down. It may dip by one or two (twice in a row, now and then,
// when the spinners' timing shifts within a calm spell), never three moves
// down in a row nor below three quarters of where it started, and it ends
// where it started.
func TestLimiterRefusalStormCannotLowerTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Slow start off: at its MaxLimit from the start the limit has
		// nothing to double, and the round that ends slow start takes the
		// gradient without headroom, which is not the ratchet this test
		// is about.
		tr, c, cpu, log := healthyUpstream(t, policy.Limiter{InitialLimit: 8, MaxLimit: 8, SlowStartIdle: -1})
		var wg sync.WaitGroup
		var res cpuResult
		stop := time.Now().Add(2 * time.Second)
		cpu.neighbour(&wg, 300, 100*time.Millisecond, 200*time.Millisecond, stop)
		cpuLoad{callers: 16, spinCost: 50 * time.Microsecond}.run(&wg, c, cpu, "http://up.test/", stop, &res)
		wg.Wait()
		m := tr.Measured("up.test")
		t.Logf("%d ok, %d refused; limit %d, lowest %d, moves %v",
			res.ok.Load(), res.refused.Load(), m.LimiterLimit, log.lowest(), log.moves)
		if res.refused.Load() == 0 {
			t.Fatal("nobody was refused: there was no storm")
		}
		down := 0 // moves down in a row
		for i, mv := range log.moves {
			if mv.To >= mv.From {
				down = 0
				continue
			}
			if down++; down == 3 {
				t.Errorf("moves %d to %d all went down: %v", i-2, i, log.moves[i-2:i+1])
			}
		}
		if low := log.lowest(); low != 0 && low < 6 {
			t.Errorf("the limit went down to %d, below three quarters of the 8 it started at", low)
		}
		if m.LimiterLimit != 8 {
			t.Errorf("limit ends at %d, want the 8 it started at", m.LimiterLimit)
		}
	})
}

// TestLimiterOverloadSeenThroughABusyClient is the overload the limiter
// is for, through the same busy client: the upstream has 8 workers at 5 ms
// a call and queues the rest, and 52 callers flood it after a calm
// warm-up. Callers who wait 5 ms when refused are shed as a queue is: the limit
// settles near twice the upstream's capacity and most calls are refused.
// Callers who call again at once make each refusal cost the client's CPU
// instead; the limiter must not collapse under them (the gradient alone
// went down to 4 and served an eighth of the upstream's capacity), and the
// upstream must go on serving at its capacity, 1600 calls a second.
func TestLimiterOverloadSeenThroughABusyClient(t *testing.T) {
	for _, tt := range []struct {
		name  string
		pause time.Duration
	}{
		{"refused-waits-5ms", 5 * time.Millisecond},
		{"refused-retries-at-once", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				up := httptestutil.NewUpstream(httptestutil.Options{
					Latency: httptestutil.Constant(5 * time.Millisecond), Capacity: 8, Queue: true,
				})
				cpu := newClientCPU(20*time.Microsecond, 500*time.Microsecond)
				var log limitLog
				tr := mustNew(t, Config{
					Base:     cpuRoundTripper{cpu: cpu, base: up.RoundTripper()},
					Policies: policy.Set{Limiter: &policy.Limiter{}},
					Observer: log.observer(),
				})
				c := &http.Client{Transport: tr}
				var wg sync.WaitGroup
				var warm, res cpuResult
				cpuLoad{callers: 4, pause: 5 * time.Millisecond}.run(&wg, c, cpu, "http://up.test/", time.Now().Add(300*time.Millisecond), &warm)
				wg.Wait()
				cpuLoad{callers: 52, pause: tt.pause, spinCost: 50 * time.Microsecond}.run(&wg, c, cpu, "http://up.test/", time.Now().Add(2*time.Second), &res)
				wg.Wait()
				m := tr.Measured("up.test")
				t.Logf("%d ok, %d refused (%.1f%%); limit %d, lowest %d", res.ok.Load(), res.refused.Load(), 100*res.refusedShare(), m.LimiterLimit, log.lowest())
				if ok := res.ok.Load(); ok < 2900 {
					t.Errorf("%d calls served in 2 s by an upstream that serves 1600 a second; moves %v", ok, log.moves)
				}
				if tt.pause > 0 && (res.refusedShare() < 0.5 || m.LimiterLimit > 24) {
					t.Errorf("limit %d, %.1f%% refused: the overload was not shed", m.LimiterLimit, 100*res.refusedShare())
				}
			})
		})
	}
}
