package httptestutil_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const target = "http://upstream.test/path?q=1"

// newRequest returns a request for target with the given body ("" for none).
func newRequest(t *testing.T, ctx context.Context, method, body string) *http.Request {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, r)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// readBody reads and closes resp.Body.
func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return string(b)
}

// closeTracker is a request body that records whether it was closed.
type closeTracker struct {
	io.Reader
	closed chan struct{}
}

func newCloseTracker(s string) *closeTracker {
	return &closeTracker{Reader: strings.NewReader(s), closed: make(chan struct{})}
}

func (c *closeTracker) Close() error {
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	return nil
}

func (c *closeTracker) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}
