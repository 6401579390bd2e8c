package transport

import (
	"net/http"
	"net/url"
	"testing"
)

// TestALanePoolEndsTheStreamOfAPanickingBase: a base that panics on the
// goroutine that called RoundTrip (its Proxy func here, which a
// connection lane keeps) ends the stream it began on the lane's clone, so
// that the clone, let go, is closed and not kept among those let go with
// streams open for the life of the transport.
func TestALanePoolEndsTheStreamOfAPanickingBase(t *testing.T) {
	base := &http.Transport{Proxy: func(*http.Request) (*url.URL, error) { panic("proxy") }}
	var let letGo
	p := newLanePool(base, "", nil, &let)
	req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the base's panic did not go on")
			}
		}()
		p.RoundTrip(req)
	}()
	p.CloseIdleConnections()
	let.mu.Lock()
	defer let.mu.Unlock()
	if len(let.m) != 0 {
		t.Errorf("%d clones let go still counted with streams open after the base panicked", len(let.m))
	}
}
