package admission

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// trustLoopback trusts callers on the loopback network, as a Trust for
// internal callers trusts a network prefix.
func trustLoopback(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && ap.Addr().IsLoopback()
}

// TestLoopback runs the handler behind a real net/http server: what next
// sees, flushing and hijacking through the writer it gets, and a client
// that hangs up while it waits in the queue. Each step waits on events,
// never on the clock.
func TestLoopback(t *testing.T) {
	var e events
	hold := make(chan struct{})
	entered := make(chan struct{}, 1)
	served := make(chan string, 8) // "path status" of each request the server is done with
	var s seen
	next := http.NewServeMux()
	next.Handle("/probe", probe(&s))
	next.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-hold // the client has read the first line
		io.WriteString(w, "second\n")
	})
	next.HandleFunc("/hijack", func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		rw.Flush()
	})
	next.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-hold
	})
	h := mustHandler(t, next, Config{
		Trust: trustLoopback, Observer: e.observer(),
		Limiter: policy.Limiter{InitialLimit: 1, MaxLimit: 1, QueueFactor: 1},
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &writer{ResponseWriter: w}
		defer func() { served <- fmt.Sprint(r.URL.Path, " ", rec.status) }()
		h.ServeHTTP(rec, r)
	}))
	defer srv.Close()
	get := func(ctx context.Context, path string, kv ...string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
		for i := 0; i+1 < len(kv); i += 2 {
			req.Header.Set(kv[i], kv[i+1])
		}
		return srv.Client().Do(req)
	}

	// What next sees, from a trusted caller.
	start := time.Now()
	resp, err := get(context.Background(), "/probe", "Resilix-Priority", "bulk", "Resilix-Tenant", "acme", "Resilix-Timeout-Ms", "60000", "Resilix-Attempt", "2")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	<-served
	if s.prio != shedding.Bulk || s.tenant != "acme" || s.attempt != 2 || !s.hasDeadline ||
		s.deadline.Before(start.Add(time.Minute)) || s.deadline.After(time.Now().Add(time.Minute)) {
		t.Errorf("next saw %+v", s)
	}

	// Flush reaches the client before next returns.
	resp, err = get(context.Background(), "/stream")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); line != "first\n" || err != nil {
		t.Errorf("first line %q, %v", line, err)
	}
	hold <- struct{}{}
	if rest, err := io.ReadAll(br); string(rest) != "second\n" || err != nil {
		t.Errorf("rest %q, %v", rest, err)
	}
	resp.Body.Close()
	<-served

	// Hijack through the writer.
	resp, err = get(context.Background(), "/hijack")
	if err != nil {
		t.Fatal(err)
	}
	if body, _ := io.ReadAll(resp.Body); string(body) != "hijacked" {
		t.Errorf("hijacked body %q", body)
	}
	resp.Body.Close()
	<-served

	// A client that hangs up while queued: 499 for the logs, no refusal.
	held := make(chan error, 1)
	go func() {
		resp, err := get(context.Background(), "/hold")
		if err == nil {
			resp.Body.Close()
		}
		held <- err
	}()
	<-entered // the only slot is taken
	ctx, cancel := context.WithCancel(context.Background())
	queued := make(chan error, 1)
	go func() {
		_, err := get(ctx, "/probe")
		queued <- err
	}()
	for h.limiter.Queued() == 0 { // on its way: no event to wait on but this
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-queued; err == nil || !strings.Contains(err.Error(), "canceled") {
		t.Errorf("the cancelled client got %v", err)
	}
	if p := <-served; p != "/probe 499" {
		t.Errorf("served %q, want the cancelled /probe with 499", p)
	}
	close(hold)
	if err := <-held; err != nil {
		t.Error(err)
	}
	<-served
	if rs := e.refused(); len(rs) != 0 {
		t.Errorf("refusals %+v, want none", rs)
	}
	if h.limiter.InFlight() != 0 || h.limiter.Queued() != 0 {
		t.Errorf("in flight %d, queued %d at the end", h.limiter.InFlight(), h.limiter.Queued())
	}
}
