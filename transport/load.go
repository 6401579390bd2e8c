package transport

import (
	"net/http"

	"github.com/resilix/resilix/internal/lane"
	"github.com/resilix/resilix/internal/orca"
)

// laneLoad reads the load report on resp, an answer on a lane (ORCA's
// endpoint-load-metrics; see package orca), as the lane keeps it (see
// lane.Answer): the server's load as a utilization, and, when the server
// said its limit (resilix's own named metrics), what one request adds to
// it, and whether the load counts the request answered: admission counts
// a request it let through among those in flight as its answer's headers
// go out, and not one it refused (its refusals are 429, 503 and 504). A report in another form than TEXT, or with no load in it, is none;
// a malformed one is none, and its value returned with bad true, to be
// counted. It allocates nothing.
func laneLoad(resp *http.Response) (l lane.Load, ok bool, value string, bad bool) {
	if resp == nil {
		return lane.Load{}, false, "", false
	}
	r, st, v := orca.Parse(resp.Header)
	switch st {
	case orca.OK:
		u, src := r.Load()
		if src == orca.SourceNone {
			return lane.Load{}, false, "", false
		}
		l.Util = u
		if src == orca.SourceResilix {
			l.Per = 1 / r.Limit
			switch resp.StatusCode {
			case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			default:
				l.Served = r.InFlight >= 1
			}
		}
		return l, true, "", false
	case orca.Malformed:
		return lane.Load{}, false, v, true
	}
	return lane.Load{}, false, "", false
}
