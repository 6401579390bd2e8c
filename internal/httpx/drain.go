package httpx

import (
	"io"
	"net/http"
	"time"
)

// DrainLimit is the most of a superseded response body Discard reads
// before closing it.
const DrainLimit = 4 << 10

// DrainTime is the longest Discard spends draining a body before it
// closes it.
const DrainTime = 100 * time.Millisecond

// Discard throws resp away without making the caller wait. In the
// background it reads at most DrainLimit bytes of the body, for at most
// DrainTime, so that a small body's connection can be reused, then closes
// it. A body that stalls is closed when DrainTime runs out, which ends a
// pending read on net/http's bodies, so the goroutine ends by then. A nil
// resp, or one without a body, is ignored.
func Discard(resp *http.Response) {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	go drain(resp.Body)
}

// Drain is Discard on the calling goroutine: it returns once resp's body
// has been drained (at most DrainLimit bytes, for at most DrainTime) and
// closed.
func Drain(resp *http.Response) {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	drain(resp.Body)
}

func drain(b io.ReadCloser) {
	stop := time.AfterFunc(DrainTime, func() { _ = b.Close() })
	_, _ = io.CopyN(io.Discard, b, DrainLimit)
	if stop.Stop() {
		_ = b.Close()
	}
}
