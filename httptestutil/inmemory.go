package httptestutil

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"syscall"
)

// InMemory returns an [http.RoundTripper] that serves each request by
// calling h in-process, with no sockets, so it can be used inside
// [testing/synctest] bubbles: the goroutine running h and its timers belong
// to the bubble of the goroutine calling RoundTrip.
//
// RoundTrip does not modify the caller's request. The handler gets a
// server-side copy: RequestURI, RemoteAddr (192.0.2.1:1234) and Host set, the
// URL reduced to path and query, Body the request body (or [http.NoBody])
// and a context derived from the request's, so the client's cancellation
// reaches the handler. That context is also cancelled when the client closes
// the response body early, and when the handler returns.
//
// RoundTrip returns as soon as the handler sends the headers (WriteHeader,
// the first Write or Flush, or returning). The body is streamed through an
// in-memory pipe that buffers up to 4 KiB, like a server connection's write
// buffer: a handler writing a small body returns without waiting for the
// client to read it, a slow handler's chunks reach the client as they are
// written, and a handler writing more blocks until the client reads. If the
// caller closes the body early, the handler's context is cancelled and its
// writes fail. resp.ContentLength is the handler's Content-Length header, 0
// if the handler wrote nothing and returned before sending headers, and -1
// otherwise; HEAD, 204 and 304 responses have an [http.NoBody] body. The
// request body is closed when the handler returns or the request's context
// is done, whichever comes first.
//
// Errors:
//   - If the request's context is done before the headers, RoundTrip
//     returns promptly with an error matching the context's Err (and its
//     cause, when [context.Cause] differs), and the handler is left to
//     notice its cancelled context. If it is done after the headers, body
//     reads fail with that error.
//   - If the handler panics with [http.ErrAbortHandler] (as [Upstream] does
//     for a [Fault] with Reset), RoundTrip fails, or body reads fail if the
//     headers were sent, with a *net.OpError matching
//     errors.Is(err, syscall.ECONNRESET).
//   - Other panics in the handler are not recovered: they crash the
//     program, with the handler's stack.
//   - A body shorter than the declared Content-Length ends with
//     [io.ErrUnexpectedEOF]; writes beyond it fail with
//     [http.ErrContentLength].
//
// Once the handler has returned and the body has been read to EOF or
// closed, no goroutine of the exchange remains.
func InMemory(h http.Handler) http.RoundTripper { return inMemory{h} }

type inMemory struct{ h http.Handler }

// resetError is what an aborted handler looks like to the client.
func resetError() error {
	return &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
}

func (t inMemory) RoundTrip(req *http.Request) (*http.Response, error) {
	body := &onceCloser{rc: req.Body}
	if req.URL == nil {
		body.Close()
		return nil, errors.New("httptestutil: nil Request.URL")
	}
	ctx := req.Context()
	if ctx.Err() != nil {
		body.Close()
		return nil, ctxError(ctx)
	}

	hctx, cancel := context.WithCancel(ctx)
	sreq := serverRequest(hctx, req, body)
	pipe := newPipe()
	w := &memWriter{
		req:     req,
		sreq:    sreq,
		header:  make(http.Header),
		ready:   make(chan struct{}),
		pipe:    pipe,
		cancel:  cancel,
		declare: -1,
	}
	stop := context.AfterFunc(ctx, func() {
		err := ctxError(ctx)
		pipe.closeWrite(err)
		body.Close()
	})
	go func() {
		defer func() {
			stop()
			body.Close()
			v := recover()
			if v != nil && v != http.ErrAbortHandler {
				panic(v)
			}
			w.finish(v != nil, ctx)
			cancel()
		}()
		t.h.ServeHTTP(w, sreq)
	}()

	select {
	case <-w.ready:
		if w.err != nil {
			return nil, w.err
		}
		return w.resp, nil
	case <-ctx.Done():
		return nil, ctxError(ctx)
	}
}

// serverRequest returns the handler's view of req.
func serverRequest(ctx context.Context, req *http.Request, body *onceCloser) *http.Request {
	s := req.Clone(ctx)
	s.RequestURI = req.URL.RequestURI()
	if u, err := url.ParseRequestURI(s.RequestURI); err == nil {
		s.URL = u
	}
	if s.Host == "" {
		s.Host = req.URL.Host
	}
	s.RemoteAddr = "192.0.2.1:1234"
	if s.Method == "" {
		s.Method = http.MethodGet
	}
	if s.Header == nil {
		s.Header = make(http.Header)
	}
	s.Proto, s.ProtoMajor, s.ProtoMinor = "HTTP/1.1", 1, 1
	s.Close = false
	s.GetBody = nil
	s.Cancel = nil //lint:ignore SA1019 a server-side request never carries the client's Cancel channel
	s.Response = nil
	if req.Body == nil || req.Body == http.NoBody {
		s.Body = http.NoBody
		s.ContentLength = 0
	} else {
		s.Body = body
	}
	if req.URL.Scheme == "https" {
		s.TLS = &tls.ConnectionState{
			Version:           tls.VersionTLS13,
			HandshakeComplete: true,
			ServerName:        req.URL.Hostname(),
		}
	}
	return s
}

// ctxError is the error for a request whose context is done: it matches
// ctx.Err() and, when different, context.Cause(ctx).
func ctxError(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// onceCloser closes the request body at most once; Close may be called by
// the handler, by the round trip when the handler returns, and by the
// context's AfterFunc, concurrently with reads as the RoundTripper contract
// allows.
type onceCloser struct {
	rc   io.ReadCloser
	once sync.Once
}

func (b *onceCloser) Read(p []byte) (int, error) {
	if b.rc == nil {
		return 0, io.EOF
	}
	return b.rc.Read(p)
}

func (b *onceCloser) Close() error {
	b.once.Do(func() {
		if b.rc != nil {
			b.rc.Close()
		}
	})
	return nil
}

// memWriter is the handler's http.ResponseWriter. Its methods run on the
// handler's goroutine only; the round trip reads resp and err after ready
// is closed.
type memWriter struct {
	req    *http.Request // the caller's
	sreq   *http.Request // the handler's
	header http.Header
	pipe   *pipe
	cancel context.CancelFunc

	wroteHeader bool
	noBody      bool  // HEAD, 204 or 304: writes are discarded or refused
	declare     int64 // Content-Length sent, or -1
	written     int64

	ready chan struct{} // closed when resp or err is set
	resp  *http.Response
	err   error
}

func (w *memWriter) Header() http.Header { return w.header }

func (w *memWriter) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("httptestutil: invalid WriteHeader code %v", code))
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		return // informational: not the response yet
	}
	w.sendHeader(code, false)
}

// sendHeader builds the response and hands it to the round trip. done
// means the handler has returned without writing anything.
func (w *memWriter) sendHeader(code int, done bool) {
	w.wroteHeader = true
	h := w.header.Clone()
	w.declare = -1
	if v := h.Get("Content-Length"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			w.declare = n
		}
	}
	resp := &http.Response{
		Status:        strconv.Itoa(code) + " " + http.StatusText(code),
		StatusCode:    code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		ContentLength: w.declare,
		Request:       w.req,
		TLS:           w.sreq.TLS,
		Body:          &memBody{pipe: w.pipe, cancel: w.cancel},
	}
	head := w.sreq.Method == http.MethodHead
	w.noBody = head || code == http.StatusNoContent || code == http.StatusNotModified
	switch {
	case head:
		resp.Body = http.NoBody
	case w.noBody || done:
		resp.Body = http.NoBody
		resp.ContentLength = 0
	}
	w.resp = resp
	close(w.ready)
}

func (w *memWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		if _, ok := w.header["Content-Type"]; !ok && len(p) > 0 {
			w.header.Set("Content-Type", http.DetectContentType(p))
		}
		w.WriteHeader(http.StatusOK)
	}
	if w.noBody {
		if w.sreq.Method == http.MethodHead {
			return len(p), nil
		}
		return 0, http.ErrBodyNotAllowed
	}
	if w.declare >= 0 && w.written+int64(len(p)) > w.declare {
		return 0, http.ErrContentLength
	}
	n, err := w.pipe.Write(p)
	w.written += int64(n)
	return n, err
}

// Flush sends the headers if they have not been sent; body writes are
// never buffered.
func (w *memWriter) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
}

// finish ends the exchange after the handler returned.
func (w *memWriter) finish(aborted bool, ctx context.Context) {
	switch {
	case aborted && !w.wroteHeader:
		w.err = resetError()
		close(w.ready)
	case aborted:
		w.pipe.closeWrite(resetError())
	case ctx.Err() != nil:
		w.pipe.closeWrite(ctxError(ctx))
	case !w.wroteHeader:
		if _, ok := w.header["Content-Length"]; !ok {
			w.header.Set("Content-Length", "0")
		}
		w.sendHeader(http.StatusOK, true)
	case w.declare >= 0 && w.written < w.declare:
		w.pipe.closeWrite(io.ErrUnexpectedEOF)
	}
	w.pipe.closeWrite(nil)
}

// memBody is the response body, the read side of the pipe. Closing it
// before EOF cancels the handler's context and makes its writes fail.
type memBody struct {
	pipe   *pipe
	cancel context.CancelFunc
}

var (
	errBodyClosed   = errors.New("httptestutil: read on closed response body")
	errClientClosed = errors.New("httptestutil: client closed the response body")
)

func (b *memBody) Read(p []byte) (int, error) { return b.pipe.Read(p) }

func (b *memBody) Close() error {
	b.cancel()
	b.pipe.closeRead(errClientClosed)
	return nil
}
