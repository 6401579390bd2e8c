package httpx

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestPushbackHint(t *testing.T) {
	for _, tt := range []struct {
		status     int
		retryAfter string
		ms         string
		want       time.Duration
		ok         bool
	}{
		{503, "1", "40", 40 * time.Millisecond, true},
		{429, "2", "1500", 1500 * time.Millisecond, true},
		{429, "1", "2500", 2500 * time.Millisecond, true}, // longer than Retry-After: said as it is
		{503, "1", " 7 ", 7 * time.Millisecond, true},
		{503, "1", "0", 0, true}, // the server means no wait
		{503, "1", "40ms", 0, false},
		{503, "1", "-40", 0, false},
		{503, "1", "99999999999999999999", maxWait, true}, // capped
		{503, "soon", "40", 40 * time.Millisecond, true},  // read beside any Retry-After value
		{200, "1", "40", 0, false},
		{503, "1", "", 0, false},
		{503, "1", "4O", 0, false},
		{503, "", "40", 0, false}, // no Retry-After: not read
		{500, "1", "40", 0, false},
	} {
		resp := &http.Response{StatusCode: tt.status, Header: http.Header{}}
		if tt.retryAfter != "" {
			resp.Header.Set("Retry-After", tt.retryAfter)
		}
		if tt.ms != "" {
			resp.Header.Set(HoldHeader, tt.ms)
		}
		if got, ok := PushbackHint(resp); got != tt.want || ok != tt.ok {
			t.Errorf("%d, Retry-After %q, %s %q: %v, %v; want %v, %v", tt.status, tt.retryAfter, HoldHeader, tt.ms, got, ok, tt.want, tt.ok)
		}
	}
	resp := &http.Response{StatusCode: 503, Header: http.Header{"Retry-After": {"1"}, HoldHeader: {strings.Repeat("9", 100)}}}
	if n := testing.AllocsPerRun(100, func() { PushbackHint(resp) }); n != 0 {
		t.Errorf("PushbackHint allocated %v times, want 0", n)
	}
}
