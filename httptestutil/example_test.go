package httptestutil_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

// An upstream in a brownout: every request fails with 503 and a
// Retry-After, until the faults are removed. The in-memory RoundTripper
// serves it without sockets; inside a testing/synctest bubble the latencies
// would also pass in virtual time.
func Example() {
	u := httptestutil.NewUpstream(httptestutil.Options{
		Latency: httptestutil.Constant(time.Millisecond),
		Faults: []httptestutil.Fault{
			{Probability: 1, Status: http.StatusServiceUnavailable, RetryAfter: "1"},
		},
	})
	tr := httptestutil.Track(u.RoundTripper())
	client := &http.Client{Transport: tr}

	resp, err := client.Get("http://upstream.test/items")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(resp.StatusCode, resp.Header.Get("Retry-After"), "open bodies:", tr.Open())
	resp.Body.Close()

	u.SetFaults() // the dependency recovers
	resp, err = client.Get("http://upstream.test/items")
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body), "open bodies:", tr.Open())

	st := u.Stats()
	fmt.Println("requests:", st.Requests, "GETs:", st.ByMethod["GET"])
	// Output:
	// 503 1 open bodies: 1
	// 200 ok open bodies: 0
	// requests: 2 GETs: 2
}

// Over loopback, an Upstream is an ordinary handler.
func ExampleUpstream_loopback() {
	u := httptestutil.NewUpstream(httptestutil.Options{Capacity: 1, BodySize: 6})
	srv := httptest.NewServer(u)
	defer srv.Close()

	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Printf("%d %q\n", resp.StatusCode, body)
	// Output:
	// 200 "ok\nok\n"
}
