package main

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/shedding"
)

// class is one kind of caller of the front tier, and what its calls got.
type class struct {
	prio shedding.Priority
	rate float64 // logical calls a second

	calls atomic.Int64 // logical calls made
	ok    atomic.Int64 // answered 200 before their deadline

	// The same, of the calls made once the load had run for settle: after
	// the limits had time to find the flood.
	settledCalls atomic.Int64
	settledOK    atomic.Int64

	mu  sync.Mutex
	lat []time.Duration // of the calls answered 200
}

func (c *class) availability() float64 { return ratio(c.ok.Load(), c.calls.Load()) }

// settledAvailability is the availability of the calls made after settle.
func (c *class) settledAvailability() float64 {
	return ratio(c.settledOK.Load(), c.settledCalls.Load())
}

func ratio(ok, n int64) float64 {
	if n == 0 {
		return 0
	}
	return float64(ok) / float64(n)
}

// quantile returns the q-quantile of the latencies of the calls answered.
func (c *class) quantile(q float64) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lat) == 0 {
		return 0
	}
	slices.Sort(c.lat)
	return c.lat[min(len(c.lat)-1, int(q*float64(len(c.lat))))]
}

// load is an open-loop load on the front tier: each class's calls start at
// its rate whatever happens to the calls before them, as users' requests
// do; a share tight of them carry a deadline of tightDeadline, the others
// of deadline.
type load struct {
	client        *http.Client
	url           string
	classes       []*class
	dur           time.Duration
	deadline      time.Duration
	tight         float64
	tightDeadline time.Duration
	// tries is how many times one logical call is sent: the naive retry
	// loop of the plain mode, or 1 when the client is a resilix transport.
	tries int
	// settle is how long the load runs before its calls also count as
	// settled (see class).
	settle time.Duration
}

// run makes the calls and returns when every call has ended.
func (l *load) run() {
	const tick = 10 * time.Millisecond
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(1, 2))
	due := make([]float64, len(l.classes))
	start := time.Now()
	for at := time.Duration(0); at < l.dur; at += tick {
		for i, c := range l.classes {
			due[i] += c.rate * tick.Seconds()
			for ; due[i] >= 1; due[i]-- {
				d := l.deadline
				if rng.Float64() < l.tight {
					d = l.tightDeadline
				}
				settled := l.settle > 0 && at >= l.settle
				wg.Go(func() { l.call(c, d, settled) })
			}
		}
		time.Sleep(time.Until(start.Add(at + tick)))
	}
	wg.Wait()
}

func (l *load) call(c *class, d time.Duration, settled bool) {
	c.calls.Add(1)
	if settled {
		c.settledCalls.Add(1)
	}
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(d))
	defer cancel()
	// The priority travels in the context; a plain client and a plain
	// service ignore it.
	ctx = shedding.WithPriority(ctx, c.prio)
	deadline := strconv.FormatInt(start.Add(d).UnixNano(), 10)
	for range l.tries {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.url, nil)
		if err != nil {
			panic(err)
		}
		req.Header.Set(deadlineHeader, deadline)
		resp, err := l.client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode == http.StatusOK && ctx.Err() == nil {
			c.ok.Add(1)
			if settled {
				c.settledOK.Add(1)
			}
			c.mu.Lock()
			c.lat = append(c.lat, time.Since(start))
			c.mu.Unlock()
			return
		}
		if resp.StatusCode < 500 || ctx.Err() != nil {
			return
		}
	}
}
