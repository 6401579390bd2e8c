package main

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/policy"
)

// deadlineHeader carries the load generator's deadline, in Unix
// nanoseconds, through both tiers in every mode. No service acts on it: it
// is the demo's instrument, with which the back tier counts the work it
// started after the caller had given up.
const deadlineHeader = "Fleet-Deadline"

// back is the back service: a fixed capacity of workers, each call taking
// work of one of them. A call waits for a worker until its context ends:
// when its caller goes away, and, when deadlines are propagated, when the
// caller's deadline passes. The same handler serves both modes; what
// differs is what its context knows.
type back struct {
	workers chan struct{}
	work    time.Duration
	down    atomic.Bool // an outage: every call is answered 503 at once

	started atomic.Int64 // calls that got a worker and did the work
	wasted  atomic.Int64 // of those, calls whose caller had already given up
}

func newBack(workers int, work time.Duration) *back {
	return &back{workers: make(chan struct{}, workers), work: work}
}

func (b *back) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if b.down.Load() {
		http.Error(w, "back: down", http.StatusServiceUnavailable)
		return
	}
	ctx := r.Context()
	select {
	case b.workers <- struct{}{}:
	case <-ctx.Done():
		http.Error(w, "back: gave up waiting for a worker", http.StatusServiceUnavailable)
		return
	}
	defer func() { <-b.workers }()
	if ctx.Err() != nil {
		http.Error(w, "back: gave up waiting for a worker", http.StatusServiceUnavailable)
		return
	}
	b.started.Add(1)
	if ns, err := strconv.ParseInt(r.Header.Get(deadlineHeader), 10, 64); err == nil && time.Now().UnixNano() > ns {
		b.wasted.Add(1)
	}
	time.Sleep(b.work)
	io.WriteString(w, "ok")
}

// front is the front service: each call it serves makes one call to the
// back tier, through its client, and answers with what it got. tries is
// how many times it calls the back for one call: the naive retry loop of
// the plain mode, or 1 when its client is a resilix transport, whose Retry
// does the retrying.
type front struct {
	client *http.Client
	back   string
	tries  int
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	status, retryAfter := http.StatusBadGateway, ""
	for range f.tries {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, f.back, nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		req.Header[deadlineHeader] = r.Header[deadlineHeader]
		resp, err := f.client.Do(req)
		if err != nil {
			var rej *policy.RejectedError
			if errors.As(err, &rej) {
				// Refused by the front's own client: say so upward, with
				// the time the refusal is expected to last.
				if rej.RetryAfter > 0 {
					w.Header().Set("Retry-After", seconds(rej.RetryAfter))
				}
				http.Error(w, "front: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			if r.Context().Err() != nil {
				return // the caller is gone
			}
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		status, retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
		if status < 500 {
			break
		}
	}
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	if status != http.StatusOK {
		http.Error(w, "front: back answered "+strconv.Itoa(status), status)
		return
	}
	io.WriteString(w, "ok")
}

// seconds formats d for Retry-After: whole seconds, rounded up.
func seconds(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// counted counts the calls that reach h: the load on a tier, whatever
// h then admits.
type counted struct {
	h     http.Handler
	calls atomic.Int64
}

func (c *counted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.calls.Add(1)
	c.h.ServeHTTP(w, r)
}
