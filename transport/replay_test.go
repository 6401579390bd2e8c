package transport

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// recorder is a base that reads every request body to its end, keeps it,
// and answers with the next of its codes (repeating the last); an error
// in errs, where set, is returned instead, before the body is read.
type recorder struct {
	mu     sync.Mutex
	codes  []int
	errs   []error
	bodies [][]byte
	calls  int
}

func (b *recorder) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	i := b.calls
	b.calls++
	b.mu.Unlock()
	if i < len(b.errs) && b.errs[i] != nil {
		closeBody(r.Body)
		return nil, b.errs[i]
	}
	var got []byte
	if r.Body != nil {
		var err error
		got, err = io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	b.mu.Lock()
	b.bodies = append(b.bodies, got)
	code := b.codes[min(i, len(b.codes)-1)]
	b.mu.Unlock()
	return respond(r, code), nil
}

func (b *recorder) n() int { b.mu.Lock(); defer b.mu.Unlock(); return b.calls }

// noGetBody returns a caller's body that has no GetBody: what
// http.NewRequest gives an io.Reader it does not know.
func noGetBody(p []byte) *trackedReq { return &trackedReq{Reader: bytes.NewReader(p)} }

// randomBytes returns n bytes drawn from a seeded source.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// skipLog records the retries an observer heard were skipped.
func skipLog() (*policy.Observer, func() []policy.RetrySkip) {
	var mu sync.Mutex
	var skips []policy.RetrySkip
	return &policy.Observer{RetrySkipped: func(s policy.RetrySkip) { mu.Lock(); skips = append(skips, s); mu.Unlock() }},
		func() []policy.RetrySkip { mu.Lock(); defer mu.Unlock(); return slices.Clone(skips) }
}

// TestBufferedBodyIsReplayed: a PUT whose body has no GetBody is retried
// with a copy of its body kept as the first attempt read it, identical
// byte for byte, when it fits the default bound of 64 KiB (exactly the
// bound included); one byte more and it is sent once, and the observer
// hears not_replayable with the hint that the body was too large. The
// caller's request is not modified and its body is closed once.
func TestBufferedBodyIsReplayed(t *testing.T) {
	const bound = 64 << 10
	for _, tc := range []struct {
		name string
		size int
		fits bool
	}{
		{"empty", 0, true},
		{"1 KiB", 1 << 10, true},
		{"exactly the bound", bound, true},
		{"bound+1", bound + 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			payload := randomBytes(tc.size)
			base := &recorder{codes: []int{503, 200}}
			obs, skips := skipLog()
			tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: obs})
			body := noGetBody(payload)
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://a.test/", body)
			before := *req
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if req.Body != before.Body || req.GetBody != nil || req.Context() != before.Context() {
				t.Fatal("the caller's request was modified")
			}
			if !body.closed.Load() {
				t.Fatal("the caller's body was not closed")
			}
			if !tc.fits {
				if base.n() != 1 || resp.StatusCode != 503 {
					t.Fatalf("%d wire calls, %d; want the body sent once and its 503", base.n(), resp.StatusCode)
				}
				if s := skips(); len(s) != 1 || s[0].Reason != policy.SkipNotReplayable || !s[0].BodyTooLarge {
					t.Fatalf("skips %+v; want not_replayable, too large", s)
				}
				return
			}
			if base.n() != 2 || resp.StatusCode != 200 {
				t.Fatalf("%d wire calls, %d; want the retry's 200", base.n(), resp.StatusCode)
			}
			for i, b := range base.bodies {
				if !bytes.Equal(b, payload) {
					t.Fatalf("attempt %d sent %d bytes, want the %d of the body, byte for byte", i+1, len(b), len(payload))
				}
			}
		})
	}
}

// TestBufferingNeverMakesAPostRepeatable: a plain POST's body is kept only
// for a retry of an attempt that never reached the server; after a 503 it
// is not sent again, and the skip is for the method, not the body, whether
// the body fitted the buffer or not.
func TestBufferingNeverMakesAPostRepeatable(t *testing.T) {
	for _, size := range []int{8, 100} {
		base := &recorder{codes: []int{503, 200}}
		obs, skips := skipLog()
		set := retrySet()
		set.ReplayBuffer = 64
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: obs})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://a.test/", noGetBody(randomBytes(size)))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base.n() != 1 || resp.StatusCode != 503 {
			t.Fatalf("%d bytes: %d wire calls, %d; want one and its 503", size, base.n(), resp.StatusCode)
		}
		if s := skips(); len(s) != 1 || s[0].Reason != policy.SkipNotReplayable || s[0].BodyTooLarge {
			t.Fatalf("%d bytes: skips %+v; want not_replayable for the method, not the body", size, s)
		}
	}
}

// TestUnsentPostWithoutGetBodyIsRetried: a POST whose body has no GetBody
// is retried after an attempt that never reached the server, with its
// whole body: one no attempt read (a refused connection) or one the
// refused attempt read and the buffer kept (an HTTP/2 stream the server
// refused after the body went out).
func TestUnsentPostWithoutGetBodyIsRetried(t *testing.T) {
	payload := randomBytes(3000)
	for _, tc := range []struct {
		name  string
		first func(r *http.Request) error
	}{
		{"connection refused", func(r *http.Request) error { r.Body.Close(); return errRefused }},
		{"stream refused after the body", func(r *http.Request) error {
			io.ReadAll(r.Body)
			r.Body.Close()
			return fmt.Errorf("http2: Transport: cannot retry err [stream error: stream ID 1; REFUSED_STREAM; received from peer] after Request.Body was written; define Request.GetBody to avoid this error")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{codes: []int{200}}
			var n atomic.Int32
			base := fakeRT(func(r *http.Request) (*http.Response, error) {
				if n.Add(1) == 1 {
					return nil, tc.first(r)
				}
				return rec.RoundTrip(r)
			})
			var log attemptLog
			tr := mustNew(t, Config{Base: base, Policies: retrySet(), Observer: log.observer()})
			body := noGetBody(payload)
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://a.test/", body)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if len(rec.bodies) != 1 || !bytes.Equal(rec.bodies[0], payload) {
				t.Fatalf("the retry sent %d bytes; want the whole body", len(rec.bodies[0]))
			}
			if want := "[first retry/unsent]"; fmt.Sprint(log.reasons()) != want || !body.closed.Load() {
				t.Fatalf("attempts %v, body closed %v; want %s and closed", log.reasons(), body.closed.Load(), want)
			}
		})
	}
}

// TestReplayBufferOff: a negative ReplayBuffer keeps no copy, and a body
// without GetBody is sent once, and not retried.
func TestReplayBufferOff(t *testing.T) {
	base := &recorder{codes: []int{503, 200}}
	obs, skips := skipLog()
	set := retrySet()
	set.ReplayBuffer = -1
	tr := mustNew(t, Config{Base: base, Policies: set, Observer: obs})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://a.test/", noGetBody([]byte("x")))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s := skips(); base.n() != 1 || len(s) != 1 || s[0].Reason != policy.SkipNotReplayable || s[0].BodyTooLarge {
		t.Fatalf("%d wire calls, skips %+v; want one call, not_replayable", base.n(), s)
	}
}

// TestSlowStreamingBodyIsReplayed: an io.Pipe body that trickles in is
// kept as the first attempt sends it, then replayed whole by the retry;
// the pipe's reader is closed.
func TestSlowStreamingBodyIsReplayed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		payload := randomBytes(10 << 10)
		pr, pw := io.Pipe()
		go func() {
			for chunk := range slices.Chunk(payload, 1000) {
				time.Sleep(20 * time.Millisecond)
				if _, err := pw.Write(chunk); err != nil {
					return
				}
			}
			pw.Close()
		}()
		base := &recorder{codes: []int{503, 200}}
		tr := mustNew(t, Config{Base: base, Policies: retrySet()})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://a.test/", pr)
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v, %v; want the retry's 200", resp, err)
		}
		resp.Body.Close()
		if len(base.bodies) != 2 || !bytes.Equal(base.bodies[0], payload) || !bytes.Equal(base.bodies[1], payload) {
			t.Fatal("the attempts did not send the body, byte for byte")
		}
		if _, err := pw.Write([]byte("more")); err != io.ErrClosedPipe {
			t.Fatalf("writing after the call: %v; want the reader closed", err)
		}
	})
}

// TestBufferedBodyIsClosedOnEveryPath: whatever the attempts did with it,
// a caller's body that resilix buffered is closed by the time RoundTrip
// returns an error or its response is closed, a base that panics or
// never closes what it was given included.
func TestBufferedBodyIsClosedOnEveryPath(t *testing.T) {
	for _, tc := range []struct {
		name string
		base http.RoundTripper
	}{
		{"success", &recorder{codes: []int{200}}},
		{"retried", &recorder{codes: []int{503, 200}}},
		{"attempts run out", &recorder{codes: []int{503}}},
		{"unread, refused", &recorder{codes: []int{200}, errs: []error{errRefused, errRefused, errRefused}}},
		{"base that never closes", neverCloses{}},
		{"base that panics", fakeRT(func(r *http.Request) (*http.Response, error) { panic("base bug") })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := mustNew(t, Config{Base: tc.base, Policies: retrySet()})
			body := noGetBody(randomBytes(100))
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://a.test/", body)
			func() {
				defer func() { recover() }()
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			}()
			if !body.closed.Load() {
				t.Fatal("the caller's body was not closed")
			}
		})
	}
}

// neverCloses is a base that breaks the contract: it never closes the
// request's body.
type neverCloses struct{}

func (neverCloses) RoundTrip(*http.Request) (*http.Response, error) { return nil, errRefused }

// legBase is a base for hedging tests: every call reads its request body
// to the end (keeping it), then answers 200 after latency(i), i counting
// calls from 0, unless its context ends first.
type legBase struct {
	latency func(i int) time.Duration
	mu      sync.Mutex
	calls   int
	bodies  map[int][]byte
}

func (b *legBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	i := b.calls
	b.calls++
	b.mu.Unlock()
	var got []byte
	if r.Body != nil {
		got, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	b.mu.Lock()
	if b.bodies == nil {
		b.bodies = map[int][]byte{}
	}
	b.bodies[i] = got
	b.mu.Unlock()
	return respondAfter(r, b.latency(i))
}

// hedgedPut warms a hedging transport over base with 30 GETs of 10ms, then
// makes one PUT with body, which has no GetBody.
func hedgedPut(t *testing.T, base *legBase, set policy.Set, body io.Reader) (*hedgeEvents, int, error) {
	t.Helper()
	ev := &hedgeEvents{}
	tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
	warm(t, tr, 30)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://up.test/", body)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return ev, 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return ev, resp.StatusCode, nil
}

// TestHedgeSendsTheBufferedBody: a PUT whose body has no GetBody is hedged
// once the first leg has sent its body, and the hedge sends the same
// bytes.
func TestHedgeSendsTheBufferedBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		payload := randomBytes(1 << 10)
		base := &legBase{latency: func(i int) time.Duration {
			if i == 30 {
				return 300 * time.Millisecond // the first leg is slow: hedged
			}
			return 10 * time.Millisecond
		}}
		ev, code, err := hedgedPut(t, base, hedgeSet(), io.NopCloser(bytes.NewReader(payload)))
		if err != nil || code != 200 {
			t.Fatalf("got %d, %v", code, err)
		}
		synctest.Wait() // the winning hedge's goroutine reports after the caller has its answer
		if started, won := ev.counts(); started != 1 || won != 1 {
			t.Fatalf("hedges started %d, won %d; want 1 and 1", started, won)
		}
		if !bytes.Equal(base.bodies[30], payload) || !bytes.Equal(base.bodies[31], payload) {
			t.Fatalf("the legs sent %d and %d bytes; want the body, byte for byte, twice", len(base.bodies[30]), len(base.bodies[31]))
		}
	})
}

// trickle returns a body that sends payload in 512-byte chunks, one every
// 10ms, with no GetBody: 80ms for 4 KiB, past the 10ms threshold.
func trickle(payload []byte) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		for chunk := range slices.Chunk(payload, 512) {
			time.Sleep(10 * time.Millisecond)
			if _, err := pw.Write(chunk); err != nil {
				return // the call is over: its body was closed
			}
		}
		pw.Close()
	}()
	return pr
}

// TestHedgeWaitsForTheBodyStillSending: a hedge that comes due while the
// first leg is still sending a body without GetBody (it trickles in) is
// sent once the body is complete, from the copy, and every leg's server
// receives the body byte for byte; no hedge is reported suppressed.
func TestHedgeWaitsForTheBodyStillSending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		payload := randomBytes(4 << 10)
		base := &legBase{latency: func(i int) time.Duration {
			if i == 30 {
				return 300 * time.Millisecond // the first leg is slow once its body is in
			}
			return 10 * time.Millisecond
		}}
		var startedAt time.Duration
		ev := &hedgeEvents{}
		obs := ev.observer()
		var begin time.Time
		started := obs.HedgeStarted
		obs.HedgeStarted = func(h policy.HedgeInfo) { startedAt = time.Since(begin); started(h) }
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet(), Observer: obs})
		warm(t, tr, 30)
		begin = time.Now()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://up.test/", trickle(payload))
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v, %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took := time.Since(begin)
		synctest.Wait()
		if started, won := ev.counts(); started != 1 || won != 1 {
			t.Fatalf("hedges started %d, won %d, suppressed as body_pending %d; want 1, 1 and 0",
				started, won, ev.reason(policy.HedgeBodyPending))
		}
		if n := ev.reason(policy.HedgeBodyPending); n != 0 {
			t.Errorf("suppressed as body_pending %d times, want none", n)
		}
		if startedAt != 80*time.Millisecond || took != 90*time.Millisecond {
			t.Errorf("the hedge started after %v and answered after %v; want as the body completed, 80ms, and 10ms later", startedAt, took)
		}
		for i := 30; i <= 31; i++ {
			if !bytes.Equal(base.bodies[i], payload) {
				t.Errorf("leg %d's server received %d bytes; want the %d of the body, byte for byte", i-29, len(base.bodies[i]), len(payload))
			}
		}
	})
}

// TestHedgeWaitingForTheBodyTakesOneToken: a hedge that waits for the
// body the first leg is still sending passes the gates once, when it is
// sent: a hedge takes a token only from a bucket full but for one, and
// the bucket (5/s, burst 40), full after the warm-up, holds 39 tokens and
// what accrued meanwhile once the first leg is admitted; the hedge is
// sent, not refused for a token its wait spent.
func TestHedgeWaitingForTheBodyTakesOneToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		payload := randomBytes(4 << 10)
		base := &legBase{latency: func(i int) time.Duration {
			if i == 30 {
				return 300 * time.Millisecond
			}
			return 10 * time.Millisecond
		}}
		ev := &hedgeEvents{}
		set := hedgeSet()
		set.RateLimit = &policy.RateLimit{PerSecond: 5, Burst: 40}
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
		warm(t, tr, 30)
		time.Sleep(10 * time.Second) // the bucket refills; the latency window keeps its samples
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://up.test/", trickle(payload))
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v, %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		synctest.Wait()
		if started, _ := ev.counts(); started != 1 {
			t.Fatalf("hedges started %d, suppressed as rejected %d; want 1 and 0: the wait for the body spent a token",
				started, ev.reason(policy.HedgeRejected))
		}
	})
}

// TestHedgeWithTheBodyNeverComplete: a hedge that comes due while the
// first leg is still sending a body without GetBody waits for the body,
// and when the first leg answers before sending all of it (the server did
// not read on), no hedge is sent: it is reported suppressed once, with the
// reason body_pending, and the first leg's answer is the call's.
func TestHedgeWithTheBodyNeverComplete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) <= 30 || r.Body == nil {
				return respondAfter(r, 10*time.Millisecond)
			}
			// Reads the first chunk only, and answers 30ms later.
			if _, err := io.ReadFull(r.Body, make([]byte, 512)); err != nil {
				return nil, err
			}
			return respondAfter(r, 30*time.Millisecond)
		})
		ev := &hedgeEvents{}
		tr := mustNew(t, Config{Base: base, Policies: hedgeSet(), Observer: ev.observer()})
		warm(t, tr, 30)
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, "http://up.test/", trickle(randomBytes(4<<10)))
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v, %v", resp, err)
		}
		resp.Body.Close()
		synctest.Wait()
		if started, _ := ev.counts(); started != 0 || ev.reason(policy.HedgeBodyPending) != 1 || calls.Load() != 31 {
			t.Fatalf("hedges started %d, suppressed as body_pending %d, %d calls; want 0, 1 and 31",
				started, ev.reason(policy.HedgeBodyPending), calls.Load())
		}
	})
}

// TestHedgeWithABodyTooLarge: a body without GetBody beyond ReplayBuffer
// cannot be sent by a hedge: it is suppressed with body_too_large.
func TestHedgeWithABodyTooLarge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{latency: func(i int) time.Duration {
			if i == 30 {
				return 300 * time.Millisecond
			}
			return 10 * time.Millisecond
		}}
		set := hedgeSet()
		set.ReplayBuffer = 1 << 10
		ev, code, err := hedgedPut(t, base, set, io.NopCloser(bytes.NewReader(randomBytes(1<<10+1))))
		if err != nil || code != 200 {
			t.Fatalf("got %d, %v", code, err)
		}
		synctest.Wait()
		if started, _ := ev.counts(); started != 0 || ev.reason(policy.HedgeBodyTooLarge) != 1 {
			t.Fatalf("hedges started %d, suppressed as body_too_large %d; want 0 and 1", started, ev.reason(policy.HedgeBodyTooLarge))
		}
	})
}

// TestBufferedPutAllocations: a 1 KiB PUT without GetBody on the retry
// path costs two allocations of resilix's own: the Replay (with the first
// attempt's reader of it) and the attempt's request copy that carries the
// reader. The buffer comes from a pool.
func TestBufferedPutAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop buffers")
	}
	resp := &http.Response{StatusCode: 200, Body: http.NoBody}
	p := make([]byte, 512)
	base := fakeRT(func(r *http.Request) (*http.Response, error) {
		for {
			if _, err := r.Body.Read(p); err != nil {
				return resp, nil
			}
		}
	})
	tr := mustNew(t, Config{Base: base, Policies: retrySet()})
	payload := randomBytes(1 << 10)
	body := new(rewound)
	req, _ := http.NewRequest(http.MethodPut, "http://a.test/", body)
	if n := testing.AllocsPerRun(1000, func() {
		body.Reset(payload)
		_, _ = tr.RoundTrip(req)
	}); n != 2 {
		t.Errorf("%v allocations per call, want 2", n)
	}
}
