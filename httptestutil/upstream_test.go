package httptestutil_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

// timedGet sends a GET through rt and returns the response status (0 on
// error), the error and the time to the headers.
func timedGet(t *testing.T, rt http.RoundTripper) (*http.Response, time.Duration, error) {
	t.Helper()
	start := time.Now()
	resp, err := rt.RoundTrip(newRequest(t, context.Background(), http.MethodGet, ""))
	return resp, time.Since(start), err
}

func TestConstantLatencyInMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(100 * time.Millisecond)})
		start := time.Now()
		resp, err := u.Client().Get(target)
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got != 100*time.Millisecond {
			t.Errorf("headers after %v, want exactly 100ms", got)
		}
		if resp.StatusCode != http.StatusOK || resp.ContentLength != 2 {
			t.Errorf("status %d, ContentLength %d; want 200, 2", resp.StatusCode, resp.ContentLength)
		}
		if body := readBody(t, resp); body != "ok" {
			t.Errorf("body %q, want %q", body, "ok")
		}
		want := httptestutil.Stats{Requests: 1, ByMethod: map[string]int64{"GET": 1}, PeakInFlight: 1}
		if got := u.Stats(); !reflect.DeepEqual(got, want) {
			t.Errorf("Stats = %+v, want %+v", got, want)
		}
	})
}

func TestBodySize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			size int
			want string
		}{{0, "ok"}, {-1, ""}, {7, "ok\nok\no"}} {
			u := httptestutil.NewUpstream(httptestutil.Options{BodySize: tc.size})
			resp, _, err := timedGet(t, u.RoundTripper())
			if err != nil {
				t.Fatal(err)
			}
			if got := readBody(t, resp); got != tc.want || resp.ContentLength != int64(len(tc.want)) {
				t.Errorf("BodySize %d: body %q, ContentLength %d; want %q", tc.size, got, resp.ContentLength, tc.want)
			}
		}
	})
}

func TestBimodalInMemory(t *testing.T) {
	fast, slow := 10*time.Millisecond, time.Second
	run := func(seed uint64) []time.Duration {
		var got []time.Duration
		synctest.Test(t, func(t *testing.T) {
			u := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Bimodal(fast, slow, 0.25), Seed: seed})
			for range 2000 {
				resp, d, err := timedGet(t, u.RoundTripper())
				if err != nil {
					t.Fatal(err)
				}
				readBody(t, resp)
				got = append(got, d)
			}
		})
		return got
	}
	a := run(42)
	nslow := 0
	for _, d := range a {
		switch d {
		case slow:
			nslow++
		case fast:
		default:
			t.Fatalf("latency %v is neither %v nor %v", d, fast, slow)
		}
	}
	// 2000 * 0.25 = 500, sd 19.4.
	if nslow < 420 || nslow > 580 {
		t.Errorf("%d slow of 2000, want about 500", nslow)
	}
	if !slices.Equal(a, run(42)) {
		t.Error("same seed gave a different sequence")
	}
	if slices.Equal(a, run(43)) {
		t.Error("different seeds gave the same sequence")
	}
}

func TestSetLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(time.Second)})
		var wg sync.WaitGroup
		wg.Go(func() {
			resp, d, err := timedGet(t, u.RoundTripper())
			if err != nil {
				t.Error(err)
				return
			}
			readBody(t, resp)
			if d != time.Second {
				t.Errorf("request admitted before the switch took %v, want the 1s it sampled", d)
			}
		})
		synctest.Wait() // the first request is waiting out its second

		u.SetLatency(httptestutil.Constant(10 * time.Millisecond))
		for range 3 {
			resp, d, err := timedGet(t, u.RoundTripper())
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, resp)
			if d != 10*time.Millisecond {
				t.Errorf("after SetLatency: %v, want 10ms", d)
			}
		}
		if got := u.Stats().InFlight; got != 1 {
			t.Errorf("InFlight = %d, want 1 (the slow request)", got)
		}
		u.SetLatency(nil)
		resp, d, err := timedGet(t, u.RoundTripper())
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		if d != 0 {
			t.Errorf("after SetLatency(nil): %v, want 0", d)
		}
		wg.Wait()
		if got := u.Stats().PeakInFlight; got != 2 {
			t.Errorf("PeakInFlight = %d, want 2", got)
		}
	})
}

func TestSlowBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{
			Latency:  httptestutil.Constant(20 * time.Millisecond),
			BodySize: 8,
			Chunks:   4,
			Faults:   []httptestutil.Fault{{Probability: 1, SlowBody: 50 * time.Millisecond, SlowHeaders: 5 * time.Millisecond}},
		})
		start := time.Now()
		resp, err := u.RoundTripper().RoundTrip(newRequest(t, context.Background(), http.MethodGet, ""))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if d := time.Since(start); d != 25*time.Millisecond {
			t.Errorf("headers after %v, want 25ms (latency + SlowHeaders)", d)
		}
		var got []byte
		buf := make([]byte, 64)
		for i := range 4 {
			n, err := resp.Body.Read(buf)
			if err != nil {
				t.Fatalf("chunk %d: %v", i, err)
			}
			if n != 2 {
				t.Errorf("chunk %d: %d bytes, want 2", i, n)
			}
			if d, want := time.Since(start), 25*time.Millisecond+time.Duration(i)*50*time.Millisecond; d != want {
				t.Errorf("chunk %d at %v, want %v", i, d, want)
			}
			got = append(got, buf[:n]...)
		}
		if n, err := resp.Body.Read(buf); n != 0 || err != io.EOF {
			t.Errorf("after the last chunk: Read = %d, %v; want 0, EOF", n, err)
		}
		if d := time.Since(start); d != 175*time.Millisecond {
			t.Errorf("EOF at %v, want 175ms", d)
		}
		if string(got) != "ok\nok\nok" {
			t.Errorf("body %q, want %q", got, "ok\nok\nok")
		}
	})
}

func TestCancelBeforeHeaders(t *testing.T) {
	errAttempt := errors.New("attempt timeout")
	for _, tc := range []struct {
		name   string
		ctx    func() (context.Context, context.CancelFunc)
		after  time.Duration
		wantIs []error
	}{
		{
			name: "deadline",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 100*time.Millisecond)
			},
			after:  100 * time.Millisecond,
			wantIs: []error{context.DeadlineExceeded},
		},
		{
			name: "cause",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeoutCause(context.Background(), 100*time.Millisecond, errAttempt)
			},
			after:  100 * time.Millisecond,
			wantIs: []error{context.DeadlineExceeded, errAttempt},
		},
		{
			name: "cancel",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(30*time.Millisecond, cancel)
				return ctx, cancel
			},
			after:  30 * time.Millisecond,
			wantIs: []error{context.Canceled},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				u := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(time.Second)})
				ctx, cancel := tc.ctx()
				defer cancel()
				body := newCloseTracker("payload")
				req := newRequest(t, ctx, http.MethodPost, "")
				req.Body = body
				start := time.Now()
				resp, err := u.RoundTripper().RoundTrip(req)
				if resp != nil {
					t.Fatalf("RoundTrip returned a response with error %v", err)
				}
				for _, want := range tc.wantIs {
					if !errors.Is(err, want) {
						t.Errorf("err = %v, want errors.Is %v", err, want)
					}
				}
				if d := time.Since(start); d != tc.after {
					t.Errorf("returned after %v, want %v", d, tc.after)
				}
				synctest.Wait() // the handler goroutine has ended
				if d := time.Since(start); d != tc.after {
					t.Errorf("handler ended after %v, want %v", d, tc.after)
				}
				st := u.Stats()
				if st.InFlight != 0 || st.Canceled != 1 {
					t.Errorf("InFlight %d, Canceled %d; want 0, 1", st.InFlight, st.Canceled)
				}
				if !body.isClosed() {
					t.Error("request body not closed")
				}
			})
		})
	}
}

func TestCanceledBeforeRoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		body := newCloseTracker("x")
		req := newRequest(t, ctx, http.MethodPost, "")
		req.Body = body
		if _, err := u.RoundTripper().RoundTrip(req); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
		if !body.isClosed() {
			t.Error("request body not closed")
		}
		if n := u.Stats().Requests; n != 0 {
			t.Errorf("Requests = %d, want 0", n)
		}
	})
}

func TestCancelDuringBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{
			BodySize: 8,
			Faults:   []httptestutil.Fault{{Probability: 1, SlowBody: time.Second}},
		})
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		resp, err := u.RoundTripper().RoundTrip(newRequest(t, ctx, http.MethodGet, ""))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("body read error = %v, want DeadlineExceeded", err)
		}
		if string(b) != "ok\no" {
			t.Errorf("read %q before the deadline, want %q", b, "ok\no")
		}
		synctest.Wait()
		if st := u.Stats(); st.InFlight != 0 || st.Canceled != 1 {
			t.Errorf("InFlight %d, Canceled %d; want 0, 1", st.InFlight, st.Canceled)
		}
	})
}

func TestEarlyBodyClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{
			BodySize: 8,
			Faults:   []httptestutil.Fault{{Probability: 1, SlowBody: time.Second}},
		})
		tr := httptestutil.Track(u.RoundTripper())
		start := time.Now()
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodGet, ""))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		if n, err := resp.Body.Read(buf); n != 2 || err != nil {
			t.Fatalf("first chunk: %d, %v", n, err)
		}
		if tr.Open() != 1 {
			t.Errorf("Open = %d before Close, want 1", tr.Open())
		}
		resp.Body.Close()
		resp.Body.Close()
		synctest.Wait()
		if d := time.Since(start); d != 0 {
			t.Errorf("handler ended after %v, want at once", d)
		}
		if st := u.Stats(); st.InFlight != 0 || st.Canceled != 1 {
			t.Errorf("InFlight %d, Canceled %d; want 0, 1", st.InFlight, st.Canceled)
		}
		if tr.Responses() != 1 || tr.BodiesClosed() != 1 || tr.Open() != 0 {
			t.Errorf("Tracker: Responses %d, BodiesClosed %d, Open %d; want 1, 1, 0", tr.Responses(), tr.BodiesClosed(), tr.Open())
		}
		if _, err := resp.Body.Read(buf); err == nil {
			t.Error("Read after Close succeeded")
		}
	})
}

func TestReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.Constant(30 * time.Millisecond),
			Faults:  []httptestutil.Fault{{Probability: 1, Reset: true, SlowHeaders: 20 * time.Millisecond, Status: 500}},
		})
		start := time.Now()
		resp, err := u.Client().Get(target)
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("got a response, status %d", resp.StatusCode)
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("err = %v, want ECONNRESET", err)
		}
		var op *net.OpError
		if !errors.As(err, &op) {
			t.Errorf("err = %v, want a *net.OpError", err)
		}
		if d := time.Since(start); d != 50*time.Millisecond {
			t.Errorf("reset after %v, want 50ms", d)
		}
		synctest.Wait()
		if st := u.Stats(); st.InFlight != 0 || st.Canceled != 0 {
			t.Errorf("InFlight %d, Canceled %d; want 0, 0", st.InFlight, st.Canceled)
		}
	})
}

func TestCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{
			Latency:  httptestutil.Constant(100 * time.Millisecond),
			Capacity: 3,
		})
		type result struct {
			status int
			d      time.Duration
		}
		results := make(chan result, 10)
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				resp, d, err := timedGet(t, u.RoundTripper())
				if err != nil {
					t.Error(err)
					return
				}
				readBody(t, resp)
				results <- result{resp.StatusCode, d}
			})
		}
		wg.Wait()
		close(results)
		counts := map[result]int{}
		for r := range results {
			counts[r]++
		}
		want := map[result]int{{200, 100 * time.Millisecond}: 3, {503, 0}: 7}
		if !reflect.DeepEqual(counts, want) {
			t.Errorf("results = %+v, want %+v", counts, want)
		}
		st := u.Stats()
		if st.PeakInFlight != 3 || st.OverCapacity != 7 || st.Requests != 10 || st.InFlight != 0 {
			t.Errorf("Stats = %+v; want PeakInFlight 3, OverCapacity 7, Requests 10, InFlight 0", st)
		}
	})
}

func TestCapacityStaggered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{
			Latency:            httptestutil.Uniform(50*time.Millisecond, 150*time.Millisecond),
			Capacity:           3,
			OverCapacityStatus: http.StatusTooManyRequests,
		})
		var wg sync.WaitGroup
		var mu sync.Mutex
		counts := map[int]int{}
		for i := range 50 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 20 * time.Millisecond)
				resp, _, err := timedGet(t, u.RoundTripper())
				if err != nil {
					t.Error(err)
					return
				}
				readBody(t, resp)
				if n := u.Stats().InFlight; n > 3 {
					t.Errorf("InFlight = %d > capacity 3", n)
				}
				mu.Lock()
				counts[resp.StatusCode]++
				mu.Unlock()
			})
		}
		wg.Wait()
		st := u.Stats()
		if st.PeakInFlight != 3 {
			t.Errorf("PeakInFlight = %d, want 3", st.PeakInFlight)
		}
		if int64(counts[429]) != st.OverCapacity || counts[429] == 0 || counts[200]+counts[429] != 50 {
			t.Errorf("statuses %v, OverCapacity %d; want 200s and some 429s adding to 50", counts, st.OverCapacity)
		}
	})
}

func statuses(t *testing.T, u *httptestutil.Upstream, n int) (map[int]int, []int) {
	t.Helper()
	counts := map[int]int{}
	var seq []int
	for range n {
		resp, _, err := timedGet(t, u.RoundTripper())
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		ra := resp.Header.Get("Retry-After")
		if (resp.StatusCode == 503) != (ra == "2") {
			t.Fatalf("status %d with Retry-After %q", resp.StatusCode, ra)
		}
		counts[resp.StatusCode]++
		seq = append(seq, resp.StatusCode)
	}
	return counts, seq
}

func TestFaultProbability(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := httptestutil.Options{
			Seed:   7,
			Faults: []httptestutil.Fault{{Probability: 0.3, Status: 503, RetryAfter: "2"}},
		}
		counts, seq := statuses(t, httptestutil.NewUpstream(opts), 1000)
		// 1000 * 0.3 = 300, sd 14.5.
		if counts[503] < 230 || counts[503] > 370 || counts[200]+counts[503] != 1000 {
			t.Errorf("statuses %v, want about 300 503s and the rest 200", counts)
		}
		if _, again := statuses(t, httptestutil.NewUpstream(opts), 1000); !slices.Equal(seq, again) {
			t.Error("same seed gave a different sequence of faults")
		}
	})
}

func TestFaultOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{
			Seed: 1,
			Faults: []httptestutil.Fault{
				{Status: 418},                   // zero probability: never
				{Probability: 0.5, Status: 500}, // half
				{Probability: 1, Status: 502},   // the rest
				{Probability: 1, Status: 504},   // never reached
			},
		})
		counts, _ := statuses(t, u, 1000)
		if counts[500] < 420 || counts[500] > 580 || counts[500]+counts[502] != 1000 {
			t.Errorf("statuses %v, want about 500 500s and the rest 502", counts)
		}

		u.SetFaults(httptestutil.Fault{Probability: 1, Status: 503, RetryAfter: "2"})
		if counts, _ := statuses(t, u, 10); counts[503] != 10 {
			t.Errorf("after SetFaults: %v, want all 503", counts)
		}
		u.SetFaults()
		if counts, _ := statuses(t, u, 10); counts[200] != 10 {
			t.Errorf("after SetFaults(): %v, want all 200", counts)
		}
	})
}

func TestKeepBodiesAndResetStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{KeepBodies: 2, Latency: httptestutil.Constant(time.Millisecond)})
		send := func(method, body string) {
			t.Helper()
			resp, err := u.RoundTripper().RoundTrip(newRequest(t, context.Background(), method, body))
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, resp)
		}
		send(http.MethodPost, "alpha")
		send(http.MethodPut, "beta")
		send(http.MethodPost, "gamma")
		send(http.MethodGet, "")
		want := httptestutil.Stats{
			Requests:     4,
			ByMethod:     map[string]int64{"POST": 2, "PUT": 1, "GET": 1},
			PeakInFlight: 1,
			Bodies:       [][]byte{[]byte("alpha"), []byte("beta")},
		}
		if got := u.Stats(); !reflect.DeepEqual(got, want) {
			t.Errorf("Stats = %+v, want %+v", got, want)
		}

		u.ResetStats()
		if got := u.Stats(); !reflect.DeepEqual(got, httptestutil.Stats{ByMethod: map[string]int64{}}) {
			t.Errorf("Stats after ResetStats = %+v, want %+v", got, httptestutil.Stats{ByMethod: map[string]int64{}})
		}
		send(http.MethodGet, "")
		send(http.MethodPatch, "delta")
		want = httptestutil.Stats{
			Requests:     2,
			ByMethod:     map[string]int64{"GET": 1, "PATCH": 1},
			PeakInFlight: 1,
			Bodies:       [][]byte{{}, []byte("delta")},
		}
		if got := u.Stats(); !reflect.DeepEqual(got, want) {
			t.Errorf("Stats after the reset = %+v, want %+v", got, want)
		}
	})
}

func TestHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{BodySize: 10})
		resp, err := u.RoundTripper().RoundTrip(newRequest(t, context.Background(), http.MethodHead, ""))
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); body != "" || resp.ContentLength != 10 {
			t.Errorf("HEAD: body %q, ContentLength %d; want empty, 10", body, resp.ContentLength)
		}
	})
}

func TestQueueingUpstreamWaitsInsteadOfRefusing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(10 * time.Millisecond), Capacity: 2, Queue: true})
		c := u.Client()
		var wg sync.WaitGroup
		start := time.Now()
		for range 6 {
			wg.Go(func() {
				resp, err := c.Get("http://up.test/")
				if err != nil || resp.StatusCode != 200 {
					t.Errorf("got %v, %v", resp, err)
					return
				}
				resp.Body.Close()
			})
		}
		wg.Wait()
		st := u.Stats()
		// Two workers, six requests of 10ms: three rounds.
		if d := time.Since(start); d != 30*time.Millisecond || st.PeakInFlight != 2 || st.OverCapacity != 0 {
			t.Fatalf("took %v, peak %d, refused %d; want 30ms, 2, 0", d, st.PeakInFlight, st.OverCapacity)
		}
	})
}
