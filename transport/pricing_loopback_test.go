package transport_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/resilix/resilix/policy"
)

// TestPricingLoopback is the pricing scenario (see pricingRate) over
// loopback sockets: the API is an httptest server on 127.0.0.1, the
// transport's base the default pooled transport. It runs only when
// RESILIX_PRICING is set, to 1 (6s) or to a Go duration, and prints the
// figures as a table, failing on a missed target, beside those of the same
// scenario without the RateLimit (twice the duration in all). Run it without -race:
// the race detector's slowdown of every call would be measured, not the
// rate limit.
//
//	RESILIX_PRICING=1 go test -count=1 -run TestPricingLoopback -v ./transport/
func TestPricingLoopback(t *testing.T) {
	d := optIn(t, "RESILIX_PRICING", 6*time.Second, "a loopback measurement of a rate-limited API under a Bulk flood; set RESILIX_PRICING=1 (or a duration) to run it")
	f, without := pricingBoth(t, d, func(t *testing.T, set policy.Set, d time.Duration) *pricingFigures {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		api := pricingAPI()
		srv := httptest.NewServer(api)
		defer srv.Close()
		return runPricing(t, set, nil, srv.URL+"/", api, d, func() {})
	})
	f.report(t, "pricing over loopback, "+d.String(), without)
}
