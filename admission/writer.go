package admission

import (
	"bufio"
	"io"
	"net"
	"net/http"
)

// writer is the ResponseWriter next gets: it records the status next sends
// and whether it hijacked the connection, and passes everything through.
// What it does not implement, http.ResponseController reaches through
// Unwrap.
type writer struct {
	http.ResponseWriter
	status   int  // the final status sent; 0 until then
	hijacked bool // Hijack succeeded
	returned bool // next returned (rather than panicked)
	// report is the server whose load the answer reports, set when the
	// caller is told it; nil otherwise.
	report *server
}

func (w *writer) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // 1xx are not final
		w.status = code
		if w.report != nil {
			w.report.writeLoad(w.Header())
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *writer) Write(b []byte) (int, error) {
	w.sent()
	return w.ResponseWriter.Write(b)
}

// WriteString keeps io.WriteString from copying s to a []byte, when the
// server's writer can take a string as net/http's can.
func (w *writer) WriteString(s string) (int, error) {
	w.sent()
	return io.WriteString(w.ResponseWriter, s)
}

// ReadFrom keeps io.Copy's fast paths (net/http's sendfile), when the
// server's writer has them.
func (w *writer) ReadFrom(r io.Reader) (int64, error) {
	w.sent()
	return io.Copy(w.ResponseWriter, r)
}

func (w *writer) Flush() {
	w.sent()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return c, rw, err
}

// Unwrap returns the server's writer, for http.ResponseController.
func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// sent records the implicit 200 of a body or a flush before any status,
// and puts the load report in its header.
func (w *writer) sent() {
	if w.status == 0 {
		w.status = http.StatusOK
		if w.report != nil {
			w.report.writeLoad(w.Header())
		}
	}
}
