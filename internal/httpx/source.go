package httpx

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
)

// Source is a caller's request body as one attempt sends it: it reads and
// closes the body, and keeps the first error its Read (other than io.EOF)
// or Close returned, so that the attempt's error can be told to be the
// body's own (Failed): the caller's, not the dependency's. net/http
// returns a body's read error as it is, or wraps it.
//
// Its zero value reads nothing: Reset gives it a body. Read and Close are
// called by net/http, on a goroutine of its own; Failed may be called
// concurrently with them.
//
// It counts what it read too, for Mismatch: net/http's own error for a
// body that does not match its ContentLength races, over HTTP/1, with
// the read error of the connection it closes for it, and either may come
// back.
type Source struct {
	rc    io.ReadCloser
	err   atomic.Pointer[error]
	n     atomic.Int64 // bytes read
	ended atomic.Bool  // the body returned io.EOF
}

// Reset makes s the reader of body, with nothing read and no error kept.
func (s *Source) Reset(body io.ReadCloser) {
	s.rc = body
	s.err.Store(nil)
	s.n.Store(0)
	s.ended.Store(false)
}

func (s *Source) Read(p []byte) (int, error) {
	n, err := s.rc.Read(p)
	s.n.Add(int64(n))
	switch {
	case err == io.EOF:
		s.ended.Store(true)
	case err != nil:
		s.keep(err)
	}
	return n, err
}

// Mismatch reports whether what s read so far proves its body does not
// match length, the request's ContentLength: more than length bytes, or
// an end at fewer. A length of 0 or less says nothing.
func (s *Source) Mismatch(length int64) bool {
	return mismatch(s.n.Load(), s.ended.Load(), length)
}

// mismatch reports whether a body of which n bytes were read, to its end
// if ended, does not match length, a request's ContentLength (0 or less:
// unknown or none, which nothing contradicts).
func mismatch(n int64, ended bool, length int64) bool {
	return length > 0 && (n > length || ended && n != length)
}

// Mismatched reports whether body, about to be sent, is an in-memory
// reader (see Fallible) whose unread length is not length, the request's
// ContentLength: a request sent again with its body already read.
// Reading no byte, it tells the mismatch net/http is about to refuse. A
// length of 0 or less, or any other body, says nothing.
func Mismatched(body io.ReadCloser, length int64) bool {
	if length <= 0 || body == nil || body == http.NoBody {
		return false
	}
	switch r := unwrapNop(body).(type) {
	case *bytes.Buffer:
		return int64(r.Len()) != length
	case *bytes.Reader:
		return int64(r.Len()) != length
	case *strings.Reader:
		return int64(r.Len()) != length
	}
	return false
}

func (s *Source) Close() error {
	err := s.rc.Close()
	if err != nil {
		s.keep(err)
	}
	return err
}

func (s *Source) keep(err error) { s.err.CompareAndSwap(nil, &err) }

// Failed reports whether err, the error of the attempt that sent s, is
// (or wraps) the error s's body returned.
func (s *Source) Failed(err error) bool {
	p := s.err.Load()
	return p != nil && err != nil && errors.Is(err, *p)
}

// Fallible reports whether a read of body may fail: false for no body
// and for the in-memory readers http.NewRequest takes (*bytes.Buffer,
// *bytes.Reader, *strings.Reader, bare or in io.NopCloser), which end in
// io.EOF, never in an error; true for anything else (a file, a pipe, a
// reader of the caller's own).
func Fallible(body io.ReadCloser) bool {
	if body == nil || body == http.NoBody {
		return false
	}
	switch unwrapNop(body).(type) {
	case *bytes.Buffer, *bytes.Reader, *strings.Reader:
		return false
	}
	return true
}

// unwrapNop returns the reader in body when body is io.NopCloser's, else
// body.
func unwrapNop(body io.ReadCloser) io.Reader {
	if t := reflect.TypeOf(body); t == nopCloser || t == nopCloserWriterTo {
		return reflect.ValueOf(body).Field(0).Interface().(io.Reader)
	}
	return body
}

// The types io.NopCloser returns, for a reader without and with WriteTo.
var (
	nopCloser         = reflect.TypeOf(io.NopCloser(nil))
	nopCloserWriterTo = reflect.TypeOf(io.NopCloser(struct {
		io.Reader
		io.WriterTo
	}{}))
)
