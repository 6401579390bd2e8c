package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// goAwayServer is net/http's own server speaking HTTP/2 over cleartext on
// loopback, whose POSTs wait until released, so that a test can shut it
// down gracefully (GOAWAY, then the in-flight streams finish) while a
// call's round is on the wire.
type goAwayServer struct {
	srv     *http.Server
	l       net.Listener
	arrived chan struct{} // one value per POST that reached the handler
	release chan struct{}

	mu     sync.Mutex
	bodies [][]byte
}

func newGoAwayServer(t *testing.T) *goAwayServer {
	t.Helper()
	s := &goAwayServer{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	s.srv = &http.Server{
		Protocols: &p,
		ErrorLog:  log.New(io.Discard, "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				return // a warm-up GET: 200 at once
			}
			b, _ := io.ReadAll(r.Body)
			s.mu.Lock()
			s.bodies = append(s.bodies, b)
			s.mu.Unlock()
			s.arrived <- struct{}{}
			select {
			case <-s.release:
			case <-r.Context().Done():
			}
		}),
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.l = l
	done := make(chan struct{})
	go func() { defer close(done); _ = s.srv.Serve(l) }()
	t.Cleanup(func() {
		s.srv.Close()
		<-done
	})
	return s
}

func (s *goAwayServer) url() string { return "http://" + s.l.Addr().String() + "/" }

func (s *goAwayServer) posts() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.bodies...)
}

// waitArrivals waits for n POSTs to reach the handler, or fails the test.
func (s *goAwayServer) waitArrivals(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-s.arrived:
		case <-time.After(5 * time.Second):
			t.Fatalf("a POST did not reach the server within 5s")
		}
	}
}

// goAwayClient is a transport that retries and hedges (at the median of
// the fast warm-up GETs, so that a waiting POST is hedged at once; two
// legs at most) over HTTP/2 to s, warmed.
func goAwayClient(t *testing.T, s *goAwayServer) *Transport {
	t.Helper()
	tr := mustNew(t, Config{
		Base: h2Client(t),
		Policies: policy.Set{
			Attempts: 3,
			Retry:    &policy.Retry{},
			Hedge:    &policy.Hedge{Quantile: 0.5, MinSamples: 5, MaxConcurrent: 2},
		},
	})
	t.Cleanup(tr.CloseIdleConnections)
	// The warm-up teaches the latency window but hedges nothing, so that
	// the hedges' allowance is whole for the POST.
	warm := WithOverride(t.Context(), Override{NoHedge: true})
	for range 20 {
		resp, err := get(t, warm, tr, s.url())
		if err != nil {
			t.Fatalf("warm-up: %v", err)
		}
		resp.Body.Close()
	}
	return tr
}

type postResult struct {
	resp *http.Response
	err  error
}

// postAsync sends a POST of body through tr on a goroutine of its own, and
// delivers its result, the body read and closed.
func postAsync(t *testing.T, ctx context.Context, tr *Transport, url string, body []byte) <-chan postResult {
	ch := make(chan postResult, 1)
	go func() {
		resp, err := post(t, ctx, tr, url, string(body))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		ch <- postResult{resp, err}
	}()
	return ch
}

// TestGracefulGoAwayMidRound: net/http's server shuts down gracefully (a
// GOAWAY, its listener closed, the streams in flight let finish) while a
// hedgeable POST is in flight. A plain POST is never hedged nor retried:
// the server sees it once. A POST marked repeatable is hedged at once, and
// both its legs are on the server when the GOAWAY comes: the call gets the
// answer of one of them, the other is discarded, nothing more reaches the
// server, and both legs carried the call's body, byte for byte.
func TestGracefulGoAwayMidRound(t *testing.T) {
	body := bytes.Repeat([]byte("order-42;"), 1000)
	for _, tt := range []struct {
		name       string
		repeatable bool
		legs       int // POSTs on the server before the GOAWAY: the first, and its hedge
	}{
		{"plain POST", false, 1},
		{"repeatable POST", true, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newGoAwayServer(t)
			tr := goAwayClient(t, s)
			ctx := t.Context()
			if tt.repeatable {
				ctx = MarkRepeatable(ctx)
			}
			res := postAsync(t, ctx, tr, s.url(), body)
			s.waitArrivals(t, tt.legs)
			time.Sleep(20 * time.Millisecond) // long past the threshold: any hedge due is due

			shut := make(chan error, 1)
			go func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				shut <- s.srv.Shutdown(sctx)
			}()
			time.Sleep(50 * time.Millisecond) // the GOAWAY is out; the listener is closed
			close(s.release)

			r := <-res
			if r.err != nil {
				t.Fatalf("call: %v, want the answer of a leg the server had", r.err)
			}
			if r.resp.StatusCode != 200 {
				t.Fatalf("call: status %d, want 200", r.resp.StatusCode)
			}
			if err := <-shut; err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			posts := s.posts()
			if len(posts) != tt.legs {
				t.Fatalf("the server saw %d POSTs, want %d: nothing may reach it after its GOAWAY, and a plain POST only once", len(posts), tt.legs)
			}
			for i, b := range posts {
				if !bytes.Equal(b, body) {
					t.Fatalf("POST %d carried %d bytes, not the %d of the call's body", i, len(b), len(body))
				}
			}
		})
	}
}

// TestForcedCloseMidPOSTIsNotRetried: a server that shuts down and then
// closes its connections while a plain POST waits gives the client an
// error that does not prove the POST unsent: it is not retried, whatever
// Retry says, and the server saw it once.
func TestForcedCloseMidPOSTIsNotRetried(t *testing.T) {
	s := newGoAwayServer(t)
	tr := goAwayClient(t, s)
	var attempts atomic.Int32
	tr.obs = &policy.Observer{AttemptDone: func(policy.AttemptInfo) { attempts.Add(1) }}
	res := postAsync(t, t.Context(), tr, s.url(), []byte("order-43"))
	s.waitArrivals(t, 1)
	sctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.srv.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want it to give up on the waiting POST", err)
	}
	s.srv.Close() // the POST's connection goes
	r := <-res
	if r.err == nil {
		t.Fatalf("call: status %d, want an error", r.resp.StatusCode)
	}
	if got := len(s.posts()); got != 1 {
		t.Fatalf("the server saw %d POSTs, want 1", got)
	}
	if got := attempts.Load(); got != 1 {
		t.Fatalf("%d attempts (%v), want 1: a POST that may have reached the server is not retried", got, r.err)
	}
	close(s.release)
}
