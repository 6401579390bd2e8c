package httptestutil

import (
	"context"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Load is a closed-loop load: Workers goroutines each make GET calls back
// to back until Calls calls have been made in all. It is how resilix's
// demos and benchmarks drive an upstream; its loops are bounded by Calls
// and by each call's Timeout.
type Load struct {
	// Calls is the number of calls to make. If zero, 1000.
	Calls int
	// Workers is the number of concurrent callers. If zero, 8.
	Workers int
	// Timeout bounds each call, body included. If zero, 10s.
	Timeout time.Duration
}

// LoadResult is what a Load measured.
type LoadResult struct {
	// Latencies holds each call's duration, from the request to the end of
	// its body, sorted ascending.
	Latencies []time.Duration
	// OK counts calls answered 2xx; Failed counts the others, errors
	// included.
	OK, Failed int
}

// Run makes the calls to url through c and reports them. Each response
// body is read to the end and closed.
func (l Load) Run(c *http.Client, url string) LoadResult {
	calls, workers, timeout := l.Calls, l.Workers, l.Timeout
	if calls <= 0 {
		calls = 1000
	}
	if workers <= 0 {
		workers = 8
	}
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	var (
		mu  sync.Mutex
		res = LoadResult{Latencies: make([]time.Duration, 0, calls)}
		wg  sync.WaitGroup
	)
	jobs := make(chan struct{})
	for range workers {
		wg.Go(func() {
			for range jobs {
				start := time.Now()
				ok := call(c, url, timeout)
				d := time.Since(start)
				mu.Lock()
				res.Latencies = append(res.Latencies, d)
				if ok {
					res.OK++
				} else {
					res.Failed++
				}
				mu.Unlock()
			}
		})
	}
	for range calls {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	slices.Sort(res.Latencies)
	return res
}

func call(c *http.Client, url string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err == nil && resp.StatusCode >= 200 && resp.StatusCode < 300
}

// Quantile returns the q-quantile of the latencies (nearest rank), or 0
// when there are none.
func (r LoadResult) Quantile(q float64) time.Duration {
	n := len(r.Latencies)
	if n == 0 {
		return 0
	}
	i := int(q*float64(n)+0.999999999) - 1
	return r.Latencies[min(max(i, 0), n-1)]
}
