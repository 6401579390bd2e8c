package httpx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

// TestFallible: the bodies http.NewRequest makes of in-memory readers
// cannot fail to read; anything else may.
func TestFallible(t *testing.T) {
	for _, b := range []string{"x"} {
		for _, body := range []io.Reader{strings.NewReader(b), bytes.NewReader([]byte(b)), bytes.NewBufferString(b)} {
			req, _ := http.NewRequest(http.MethodPut, "http://a.test/", body)
			if Fallible(req.Body) {
				t.Errorf("Fallible(%T of %T) = true", req.Body, body)
			}
		}
	}
	if Fallible(nil) || Fallible(http.NoBody) {
		t.Error("no body is fallible")
	}
	for _, body := range []io.ReadCloser{
		io.NopCloser(io.MultiReader()),
		os.Stdin,
		io.NopCloser(struct{ io.Reader }{strings.NewReader("x")}),
	} {
		if !Fallible(body) {
			t.Errorf("Fallible(%T) = false", body)
		}
	}
	in := io.NopCloser(strings.NewReader("x"))
	if n := testing.AllocsPerRun(100, func() { Fallible(in) }); n != 0 {
		t.Errorf("Fallible allocates %v times", n)
	}
}

type failingBody struct{ readErr, closeErr error }

func (f failingBody) Read([]byte) (int, error) { return 0, f.readErr }
func (f failingBody) Close() error             { return f.closeErr }

// TestSourceKeepsTheBodysError: a Source tells its body's read or close
// error, bare or wrapped, from any other, and EOF is no error.
func TestSourceKeepsTheBodysError(t *testing.T) {
	disk := errors.New("disk")
	var s Source
	s.Reset(failingBody{readErr: io.EOF})
	io.Copy(io.Discard, &s)
	s.Close()
	if s.Failed(io.EOF) || s.Failed(disk) {
		t.Error("a body read to its end failed")
	}
	s.Reset(failingBody{readErr: disk})
	io.Copy(io.Discard, &s)
	if !s.Failed(disk) || !s.Failed(fmt.Errorf("broken: %w", disk)) {
		t.Error("the body's read error is not told")
	}
	if s.Failed(errors.New("disk")) || s.Failed(nil) {
		t.Error("another error is told as the body's")
	}
	s.Reset(failingBody{readErr: io.EOF, closeErr: disk})
	io.Copy(io.Discard, &s)
	s.Close()
	if !s.Failed(disk) {
		t.Error("the body's close error is not told")
	}
}

// TestMismatch: a body read to its end at other than its ContentLength,
// or past it, does not match it; an unknown length matches anything.
func TestMismatch(t *testing.T) {
	for _, tc := range []struct {
		n      int64
		ended  bool
		length int64
		want   bool
	}{
		{0, true, 7, true},
		{7, true, 7, false},
		{3, false, 7, false},
		{8, false, 7, true},
		{5, true, 0, false},
		{5, true, -1, false},
	} {
		if got := mismatch(tc.n, tc.ended, tc.length); got != tc.want {
			t.Errorf("mismatch(%d, %v, %d) = %v", tc.n, tc.ended, tc.length, got)
		}
	}
	drained := bytes.NewReader([]byte("payload"))
	io.Copy(io.Discard, drained)
	for _, tc := range []struct {
		body   io.ReadCloser
		length int64
		want   bool
	}{
		{io.NopCloser(drained), 7, true},
		{io.NopCloser(strings.NewReader("payload")), 7, false},
		{io.NopCloser(strings.NewReader("payload")), 3, true},
		{io.NopCloser(bytes.NewBufferString("payload")), 0, false},
		{io.NopCloser(io.MultiReader()), 7, false}, // not known before it is read
		{http.NoBody, 7, false},
	} {
		if got := Mismatched(tc.body, tc.length); got != tc.want {
			t.Errorf("Mismatched(%T, %d) = %v", tc.body, tc.length, got)
		}
	}
}
