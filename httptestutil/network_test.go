package httptestutil_test

import (
	"errors"
	"io"
	"net/http"
	"syscall"
	"testing"
	"testing/synctest"

	"github.com/resilix/resilix/httptestutil"
)

// TestNetworkPlacesEachConnectionOnTheNextReplica: two transports, one
// connection each, land on two replicas; a connection keeps its replica;
// an address nobody serves is refused; Close leaves nothing running.
func TestNetworkPlacesEachConnectionOnTheNextReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n httptestutil.Network
		replica := func(name string) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) })
		}
		n.Listen("api:80", replica("a"), replica("b"))
		defer n.Close()
		get := func(c *http.Client, url string) (string, error) {
			resp, err := c.Get(url)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return string(b), err
		}
		var got []string
		for range 2 {
			tr := n.Transport()
			c := &http.Client{Transport: tr}
			first, err := get(c, "http://api/")
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if again, err := get(c, "http://api/"); err != nil || again != first {
					t.Fatalf("a kept-alive connection answered %q, %v; want %q, its replica", again, err, first)
				}
			}
			got = append(got, first)
			tr.CloseIdleConnections()
		}
		if got[0] == got[1] {
			t.Errorf("two connections both landed on replica %q, want one each", got[0])
		}
		if dialed, open := n.Conns(); dialed != 2 || open != 0 {
			t.Errorf("Conns() = %d dialed, %d open; want 2 and 0", dialed, open)
		}
		tr := n.Transport()
		defer tr.CloseIdleConnections()
		if _, err := get(&http.Client{Transport: tr}, "http://nobody/"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dialing an address nobody serves: %v, want ECONNREFUSED", err)
		}
	})
}
