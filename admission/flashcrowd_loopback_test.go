package admission

import (
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
)

// TestFlashCrowdLoopback is TestFlashCrowdIsAdmitted and
// TestFlashCrowdOnAFixedCapacity over real loopback HTTP: admission in
// front of the handler in an httptest server, 400 callers on connections
// of their own, in the same process (the machine's cores are shared by
// both sides). It prints the admitted shares and fails on the same
// targets. It runs only when RESILIX_FLASHCROWD is set:
//
//	RESILIX_FLASHCROWD=1 go test -count=1 -run '^TestFlashCrowdLoopback$' -v ./admission/
func TestFlashCrowdLoopback(t *testing.T) {
	if os.Getenv("RESILIX_FLASHCROWD") == "" {
		t.Skip("a loopback measurement of a flash crowd; set RESILIX_FLASHCROWD=1 to run it")
	}
	serve := func(t *testing.T, capacity int) (*server, *events, *http.Client, string) {
		var e events
		h := crowdServer(t, capacity, &e)
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		tr := &http.Transport{MaxIdleConnsPerHost: 2 * crowdSize}
		t.Cleanup(tr.CloseIdleConnections)
		return h, &e, &http.Client{Transport: tr}, srv.URL
	}
	t.Run("room-for-all", func(t *testing.T) {
		h, e, c, url := serve(t, 0)
		crowd := runRoomy(c, url)
		t.Logf("limit %s", e.trace(16))
		checkRoomyCrowd(t, crowd, h.limiter.Limit())
	})
	t.Run("capacity-20", func(t *testing.T) {
		const capacity = 20
		h, e, c, url := serve(t, capacity)
		critical, bulk := runFixed(c, url)
		t.Logf("limit %s", e.trace(16))
		checkFixedCrowd(t, critical, bulk, capacity, h.limiter.Limit(), e.highest())
	})
}
