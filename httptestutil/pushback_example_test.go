package httptestutil_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

// An API's rate limit: a bucket of 2 that refills at one request a minute.
// The first two requests of a burst pass; the third is refused with 429
// and Retry-After without reaching the upstream.
func ExampleRateLimit() {
	up := httptestutil.NewUpstream(httptestutil.Options{})
	api := httptestutil.NewRateLimit(up, httptestutil.RateLimitOptions{PerSecond: 1.0 / 60, Burst: 2})
	client := &http.Client{Transport: httptestutil.InMemory(api)}
	for range 3 {
		resp, err := client.Get("http://api.test/")
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Printf("%d Retry-After %q\n", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	fmt.Printf("%+v, upstream saw %d\n", api.Stats(), up.Stats().Requests)
	// Output:
	// 200 Retry-After ""
	// 200 Retry-After ""
	// 429 Retry-After "1"
	// {Admitted:2 Refused:1}, upstream saw 2
}

// A server overloaded for a minute answers 503 with Retry-After, and
// serves again once the overload has been ended.
func ExampleOverload() {
	ov := httptestutil.NewOverload(nil, httptestutil.OverloadOptions{})
	client := &http.Client{Transport: httptestutil.InMemory(ov)}
	show := func() {
		resp, err := client.Get("http://up.test/")
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Printf("%d Retry-After %q\n", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	ov.Begin(time.Minute)
	show()
	ov.Begin(0)
	show()
	// Output:
	// 503 Retry-After "1"
	// 200 Retry-After ""
}
