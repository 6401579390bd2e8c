package admission

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
)

// informational records the 1xx answers a client got for one request.
type informational struct {
	mu    sync.Mutex
	codes []int
	ties  []string // each 1xx's Resilix-Tie value
	got   chan struct{}
}

func newInformational() *informational { return &informational{got: make(chan struct{}, 8)} }

func (in *informational) trace(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			in.mu.Lock()
			in.codes = append(in.codes, code)
			in.ties = append(in.ties, h.Get(httpx.TieHeader))
			in.mu.Unlock()
			in.got <- struct{}{}
			return nil
		},
	})
}

func (in *informational) seen() ([]int, []string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]int(nil), in.codes...), append([]string(nil), in.ties...)
}

// tieServers runs h behind a real net/http server over HTTP/1.1 and over
// HTTP/2 (TLS), as the two ways a tied request's signal travels.
func tieServers(t *testing.T, h http.Handler) map[string]*httptest.Server {
	t.Helper()
	h1 := httptest.NewServer(h)
	h2 := httptest.NewUnstartedServer(h)
	h2.EnableHTTP2 = true
	h2.StartTLS()
	t.Cleanup(func() {
		h1.Close()
		h2.Close()
	})
	return map[string]*httptest.Server{"h1": h1, "h2": h2}
}

// TestATiedRequestIsToldWhenItStarts: a request marked as tied gets one
// 103 carrying the tie header before next runs, and its final answer does
// not carry that header; an unmarked request, a malformed mark, and a
// server with NoTies get no 1xx.
func TestATiedRequestIsToldWhenItStarts(t *testing.T) {
	for _, noTies := range []bool{false, true} {
		var e events
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "ok")
		})
		h := mustHandler(t, next, Config{NoTies: noTies, Observer: e.observer()})
		for proto, srv := range tieServers(t, h) {
			for _, mark := range []string{"", "1", "yes"} {
				in := newInformational()
				req, _ := http.NewRequestWithContext(in.trace(context.Background()), http.MethodGet, srv.URL, nil)
				if mark != "" {
					req.Header.Set(httpx.TieHeader, mark)
				}
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatalf("%s mark %q: %v", proto, mark, err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(body) != "ok" {
					t.Errorf("%s mark %q: %d %q, want 200 \"ok\"", proto, mark, resp.StatusCode, body)
				}
				if v, ok := resp.Header[httpx.TieHeader]; ok {
					t.Errorf("%s mark %q: the final answer carries %s: %q", proto, mark, httpx.TieHeader, v)
				}
				codes, ties := in.seen()
				if mark == "1" && !noTies {
					if len(codes) != 1 || codes[0] != http.StatusEarlyHints || ties[0] != httpx.TieStarted {
						t.Errorf("%s: got 1xx %v with ties %q, want one 103 with %q", proto, codes, ties, httpx.TieStarted)
					}
				} else if len(codes) != 0 {
					t.Errorf("%s mark %q NoTies %v: got 1xx %v, want none", proto, mark, noTies, codes)
				}
			}
		}
		if m := e.malformedCount(); noTies && m != 0 || !noTies && m != 2 {
			t.Errorf("NoTies %v: %d malformed headers, want %d (the mark %q, once per protocol)", noTies, m, map[bool]int{false: 2, true: 0}[noTies], "yes")
		}
	}
}

func (e *events) malformedCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.malformed)
}

// TestATiedRequestIsToldWhenItLeavesTheQueue: a tied request that waits
// for a slot is told nothing while it waits, and is told when it is handed
// to next; one whose caller goes away while it waits never reaches next
// and is no refusal, as for any request.
func TestATiedRequestIsToldWhenItLeavesTheQueue(t *testing.T) {
	var e events
	entered := make(chan string, 4)
	hold := make(chan struct{})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- r.URL.Path
		if r.URL.Path == "/hold" {
			<-hold
		}
	})
	h := mustHandler(t, next, Config{
		Observer: e.observer(),
		Limiter:  policy.Limiter{InitialLimit: 1, MaxLimit: 1, QueueFactor: 2},
	})
	for proto, srv := range tieServers(t, h) {
		hold = make(chan struct{})
		send := func(ctx context.Context, path string, in *informational) <-chan error {
			done := make(chan error, 1)
			req, _ := http.NewRequestWithContext(in.trace(ctx), http.MethodGet, srv.URL+path, nil)
			req.Header.Set(httpx.TieHeader, "1")
			go func() {
				resp, err := srv.Client().Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				done <- err
			}()
			return done
		}
		first := newInformational()
		firstDone := send(context.Background(), "/hold", first)
		<-entered
		<-first.got // the holder was told as it started

		gone, leave := context.WithCancel(context.Background())
		queuedGone := newInformational()
		goneDone := send(gone, "/gone", queuedGone)
		queued := newInformational()
		queuedDone := send(context.Background(), "/queued", queued)
		for h.limiter.Queued() < 2 {
			time.Sleep(time.Millisecond) // on its way: no event to wait on but this
		}
		leave()
		if err := <-goneDone; !errors.Is(err, context.Canceled) {
			t.Errorf("%s: the caller that left got %v, want context.Canceled", proto, err)
		}
		for h.limiter.Queued() > 1 {
			time.Sleep(time.Millisecond) // on its way: no event to wait on but this
		}
		if codes, _ := queued.seen(); len(codes) != 0 {
			t.Errorf("%s: a waiting request was told %v before it left the queue", proto, codes)
		}
		close(hold)
		if err := <-firstDone; err != nil {
			t.Fatal(err)
		}
		if p := <-entered; p != "/queued" {
			t.Errorf("%s: next ran %s, want /queued (the one that left never runs)", proto, p)
		}
		if err := <-queuedDone; err != nil {
			t.Fatal(err)
		}
		if codes, ties := queued.seen(); len(codes) != 1 || ties[0] != httpx.TieStarted {
			t.Errorf("%s: the queued request got 1xx %v %q, want one 103 once it left the queue", proto, codes, ties)
		}
		if codes, _ := queuedGone.seen(); len(codes) != 0 {
			t.Errorf("%s: the request whose caller left got 1xx %v", proto, codes)
		}
	}
	if r := e.refused(); len(r) != 0 {
		t.Errorf("refusals %v, want none: a caller that leaves is not refused", r)
	}
}

// TestATiedRequestOverHTTP10IsNotTold: a client of HTTP/1.0 cannot be
// sent a 1xx (RFC 9110, section 15.2), so its mark is ignored.
func TestATiedRequestOverHTTP10IsNotTold(t *testing.T) {
	h := mustHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), Config{})
	srv := httptest.NewServer(h)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET / HTTP/1.0\r\nHost: x\r\n"+httpx.TieHeader+": 1\r\n\r\n")
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(status, " 200 ") {
		t.Errorf("HTTP/1.0 got status line %q first, want 200", status)
	}
}
