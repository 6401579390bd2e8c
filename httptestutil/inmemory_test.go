package httptestutil_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"reflect"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

func TestInMemoryRequestViews(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type seen struct {
			method, uri, host, path, query, body string
			urlHost                              string
			remote                               bool
			header                               string
			contentLength                        int64
			noBody                               bool
		}
		got := make(chan seen, 1)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			r.Header.Set("X-Handler", "mutated")
			got <- seen{
				method: r.Method, uri: r.RequestURI, host: r.Host, path: r.URL.Path, query: r.URL.RawQuery,
				body: string(b), urlHost: r.URL.Host, remote: r.RemoteAddr != "", header: r.Header.Get("X-Test"),
				contentLength: r.ContentLength, noBody: r.Body == http.NoBody,
			}
		})
		rt := httptestutil.InMemory(h)

		body := newCloseTracker("hello")
		req := newRequest(t, context.Background(), http.MethodPost, "hello")
		req.Body = body
		req.Header.Set("X-Test", "1")
		before := *req
		beforeURL := *req.URL
		beforeHeader := req.Header.Clone()

		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		synctest.Wait()

		want := seen{
			method: "POST", uri: "/path?q=1", host: "upstream.test", path: "/path", query: "q=1",
			body: "hello", remote: true, header: "1", contentLength: 5,
		}
		if s := <-got; s != want {
			t.Errorf("handler saw %+v, want %+v", s, want)
		}
		if !body.isClosed() {
			t.Error("request body not closed")
		}
		if req.RequestURI != before.RequestURI || req.RemoteAddr != before.RemoteAddr || req.Host != before.Host ||
			*req.URL != beforeURL || !reflect.DeepEqual(req.Header, beforeHeader) || req.Body != before.Body ||
			req.Context() != before.Context() {
			t.Error("RoundTrip modified the caller's request")
		}
		if resp.Request != req {
			t.Error("resp.Request is not the caller's request")
		}
		if resp.ProtoMajor != 1 || resp.StatusCode != 200 || resp.Status != "200 OK" {
			t.Errorf("ProtoMajor %d, Status %q; want 1, 200 OK", resp.ProtoMajor, resp.Status)
		}
		if resp.ContentLength != 0 || resp.Body != http.NoBody {
			t.Errorf("handler wrote nothing: ContentLength %d, Body %T; want 0, NoBody", resp.ContentLength, resp.Body)
		}

		resp, err = rt.RoundTrip(newRequest(t, context.Background(), http.MethodGet, ""))
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		if s := <-got; !s.noBody || s.contentLength != 0 {
			t.Errorf("GET without body: handler saw noBody %v, ContentLength %d; want true, 0", s.noBody, s.contentLength)
		}
	})
}

func TestInMemoryHeadersFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		done := make(chan struct{})
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer close(done)
			w.Header().Set("X-Early", "yes")
			w.WriteHeader(http.StatusAccepted)
			w.Header().Set("X-Late", "ignored")
			<-release
			io.WriteString(w, "later")
		})
		resp, err := httptestutil.InMemory(h).RoundTrip(newRequest(t, context.Background(), http.MethodGet, ""))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusAccepted || resp.ContentLength != -1 {
			t.Errorf("status %d, ContentLength %d; want 202, -1", resp.StatusCode, resp.ContentLength)
		}
		if resp.Header.Get("X-Early") != "yes" || resp.Header.Get("X-Late") != "" {
			t.Errorf("headers %v, want only those set before WriteHeader", resp.Header)
		}
		close(release)
		if body := readBody(t, resp); body != "later" {
			t.Errorf("body %q, want %q", body, "later")
		}
		<-done
	})
}

func TestInMemoryHandlerEndsOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ended := make(chan error, 1)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
			ended <- r.Context().Err()
		})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := httptestutil.InMemory(h).RoundTrip(newRequest(t, ctx, http.MethodGet, ""))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want DeadlineExceeded", err)
		}
		synctest.Wait()
		select {
		case err := <-ended:
			if err == nil {
				t.Error("handler context not cancelled")
			}
		default:
			t.Error("handler still running")
		}
	})
}

func TestInMemoryWritesFailAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ended := make(chan error, 1)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for {
				if _, err := w.Write([]byte("x")); err != nil {
					ended <- err
					return
				}
			}
		})
		resp, err := httptestutil.InMemory(h).RoundTrip(newRequest(t, context.Background(), http.MethodGet, ""))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 10)
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		synctest.Wait()
		select {
		case err := <-ended:
			t.Logf("handler's write failed with %v", err)
		default:
			t.Error("handler still running after the body was closed")
		}
	})
}

func TestInMemoryAbort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "ab")
			panic(http.ErrAbortHandler)
		})
		resp, err := httptestutil.InMemory(h).RoundTrip(newRequest(t, context.Background(), http.MethodGet, ""))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "ab" || !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("ReadAll = %q, %v; want %q, ECONNRESET", b, err, "ab")
		}
	})
}

func TestInMemoryContentLength(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		writeErr := make(chan error, 1)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "abc")
			if r.Method == http.MethodPost {
				_, err := io.WriteString(w, "def")
				writeErr <- err
			}
		})
		rt := httptestutil.InMemory(h)
		resp, err := rt.RoundTrip(newRequest(t, context.Background(), http.MethodGet, ""))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ContentLength != 5 || string(b) != "abc" || err != io.ErrUnexpectedEOF {
			t.Errorf("short body: ContentLength %d, ReadAll = %q, %v; want 5, %q, ErrUnexpectedEOF", resp.ContentLength, b, err, "abc")
		}

		resp, err = rt.RoundTrip(newRequest(t, context.Background(), http.MethodPost, ""))
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := <-writeErr; !errors.Is(err, http.ErrContentLength) {
			t.Errorf("write beyond Content-Length: %v, want ErrContentLength", err)
		}
	})
}

func TestInMemoryNoContent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		writeErr := make(chan error, 1)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
			_, err := io.WriteString(w, "x")
			writeErr <- err
		})
		resp, err := httptestutil.InMemory(h).RoundTrip(newRequest(t, context.Background(), http.MethodGet, ""))
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); body != "" || resp.ContentLength != 0 {
			t.Errorf("204: body %q, ContentLength %d; want empty, 0", body, resp.ContentLength)
		}
		if err := <-writeErr; !errors.Is(err, http.ErrBodyNotAllowed) {
			t.Errorf("write on 204: %v, want ErrBodyNotAllowed", err)
		}
	})
}

func TestTracker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{})
		tr := httptestutil.Track(u.RoundTripper())
		var resps []*http.Response
		for _, m := range []string{"GET", "GET", "POST"} {
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), m, ""))
			if err != nil {
				t.Fatal(err)
			}
			resps = append(resps, resp)
		}
		io.ReadAll(resps[0].Body) // EOF is not Close
		resps[0].Body.Close()
		resps[0].Body.Close()
		resps[1].Body.Close()
		if tr.Responses() != 3 || tr.BodiesClosed() != 2 || tr.Open() != 1 {
			t.Errorf("Responses %d, BodiesClosed %d, Open %d; want 3, 2, 1", tr.Responses(), tr.BodiesClosed(), tr.Open())
		}
		resps[2].Body.Close()
		if tr.Open() != 0 {
			t.Errorf("Open = %d, want 0", tr.Open())
		}

		u.SetFaults(httptestutil.Fault{Probability: 1, Reset: true})
		if _, err := tr.RoundTrip(newRequest(t, context.Background(), http.MethodDelete, "")); err == nil {
			t.Error("Reset: no error")
		}
		want := map[string]int64{"GET": 2, "POST": 1, "DELETE": 1}
		if tr.Requests() != 4 || tr.Errors() != 1 || tr.Responses() != 3 || !reflect.DeepEqual(tr.ByMethod(), want) {
			t.Errorf("Requests %d, Errors %d, Responses %d, ByMethod %v; want 4, 1, 3, %v",
				tr.Requests(), tr.Errors(), tr.Responses(), tr.ByMethod(), want)
		}
		synctest.Wait()
	})
}

// TestTrackerWait: a round trip left running by a client that has moved on
// (here on its own goroutine, over a base that ignores cancellation, as a
// hedge loser would be) is waited for in virtual time, and its response is
// counted by the time Wait returns.
func TestTrackerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(time.Second)})
		inner := u.RoundTripper()
		stubborn := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return inner.RoundTrip(r.WithContext(context.WithoutCancel(r.Context())))
		})
		tr := httptestutil.Track(stubborn)
		start := time.Now()
		tr.Wait() // nothing in flight: at once
		if d := time.Since(start); d != 0 {
			t.Fatalf("Wait with nothing in flight took %v", d)
		}

		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the client has given up; the base does not care
		for range 2 {
			req := newRequest(t, ctx, http.MethodGet, "")
			go func() {
				resp, err := tr.RoundTrip(req)
				if err == nil {
					resp.Body.Close()
				}
			}()
		}
		synctest.Wait()
		if n := tr.InFlight(); n != 2 {
			t.Fatalf("InFlight = %d, want 2", n)
		}
		tr.Wait()
		if d := time.Since(start); d != time.Second {
			t.Errorf("Wait returned after %v, want 1s, when the upstream answered", d)
		}
		if tr.InFlight() != 0 || tr.Responses() != 2 {
			t.Errorf("InFlight %d, Responses %d; want 0, 2", tr.InFlight(), tr.Responses())
		}
		synctest.Wait() // the goroutines close what they got
		if tr.Open() != 0 {
			t.Errorf("Open = %d, want 0", tr.Open())
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
