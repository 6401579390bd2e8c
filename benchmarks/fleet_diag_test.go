package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// diagClientHeader carries a fleet client's index to the servers, so that
// each server can count whose calls it gets.
const diagClientHeader = "X-Fleet-Client"

// TestMetastableFleetDiag runs the simulated fleet of resilix's quick start
// RESILIX_FLEET_DIAG times, behind admission.Handler unless
// RESILIX_FLEET_SERVER=fifo (RESILIX_FLEET_DIAG_SET=without-throttler
// drops the Throttler), and prints for each run how the calls issued from
// 3 s after the trigger's end on failed: which gate refused them
// ("gate-<name>", "-held" when the refusal carried a RetryAfter), the
// status they got, or "deadline"; the clients that failed most; and what
// each server got in the last second, and from how many clients. A run
// below 99% goodput over its last 5 s also prints its seconds, those
// clients' wire calls by server, and each server's arrivals, refusals and
// admission limits.
//
//	RESILIX_FLEET_DIAG=40 go test -count=1 -run '^TestMetastableFleetDiag$' -v -timeout 30m .
func TestMetastableFleetDiag(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("RESILIX_FLEET_DIAG"))
	if n <= 0 {
		t.Skip("RESILIX_FLEET_DIAG=runs runs it")
	}
	sc := metastableRun
	secs := int(sc.total() / time.Second)
	settled := sc.calm + sc.trigger + 3*time.Second
	f := fleet{clients: 200, servers: 4, admission: os.Getenv("RESILIX_FLEET_SERVER") != "fifo"}
	set := quickStart
	if os.Getenv("RESILIX_FLEET_DIAG_SET") == "without-throttler" {
		set = func() policy.Set {
			s := quickStart()
			s.Throttler = nil
			return s
		}
	}
	for run := range n {
		var (
			mu       sync.Mutex
			start    time.Time
			started  bool
			fails    = make([]map[string]int, f.clients) // by client, calls issued from settled on
			byServer = make([][]int, f.clients)          // by client, wire calls from settled on, by server
			arrived  = make([][]int, f.servers)          // by server, requests each second
			refused  = make([][]int, f.servers)          // by server, admission's refusals each second
			limits   = make([][]string, f.servers)       // by server, "second:limit" of each move
			nextID   int
		)
		for i := range fails {
			fails[i] = map[string]int{}
			byServer[i] = make([]int, f.servers)
		}
		for i := range f.servers {
			arrived[i], refused[i] = make([]int, secs), make([]int, secs)
		}
		second := func() int { // under mu
			s := int(time.Since(start) / time.Second)
			if s < 0 || s >= secs {
				return -1
			}
			return s
		}
		f.wrap = func(i int, h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				if s := second(); s >= 0 {
					arrived[i][s]++
				}
				if c, err := strconv.Atoi(r.Header.Get(diagClientHeader)); err == nil && time.Since(start) >= settled {
					byServer[c][i]++
				}
				mu.Unlock()
				h.ServeHTTP(w, r)
			})
		}
		f.observer = func(i int) *policy.Observer {
			return &policy.Observer{
				Refused: func(policy.Refusal) {
					mu.Lock()
					if s := second(); s >= 0 {
						refused[i][s]++
					}
					mu.Unlock()
				},
				LimitTransition: func(lt policy.LimitTransition) {
					mu.Lock()
					limits[i] = append(limits[i], fmt.Sprintf("%.1f:%d", time.Since(start).Seconds(), lt.To))
					mu.Unlock()
				},
			}
		}
		m := metaClient{"resilix", func(tb testing.TB, base http.RoundTripper, url string) caller {
			c := &http.Client{Transport: mustResilix(tb, base, set())}
			mu.Lock()
			id := nextID
			nextID++
			if !started {
				start, started = time.Now(), true
			}
			mu.Unlock()
			return func(ctx context.Context) bool {
				issued := time.Now()
				why := diagGet(ctx, c, url, id)
				if why != "ok" && issued.Sub(start) >= settled {
					mu.Lock()
					fails[id][why]++
					mu.Unlock()
				}
				return why == "ok"
			}
		}}
		o := runSimulated(t, sc, f, m)

		total := map[string]int{}
		failed := make([]int, f.clients)
		for i, fm := range fails {
			for k, v := range fm {
				total[k] += v
				failed[i] += v
			}
		}
		worst := make([]int, f.clients)
		for i := range worst {
			worst[i] = i
		}
		slices.SortStableFunc(worst, func(a, b int) int { return failed[b] - failed[a] })
		worst = worst[:10]
		var top []string
		for _, i := range worst {
			if failed[i] > 0 {
				top = append(top, fmt.Sprintf("c%d:%v", i, fails[i]))
			}
		}
		last, clients := make([]int, f.servers), make([]int, f.servers)
		for i := range f.servers {
			last[i] = arrived[i][secs-1]
			for _, bs := range byServer {
				if bs[i] > 0 {
					clients[i]++
				}
			}
		}
		_, to := sc.triggerSlots()
		last5 := o.goodput(o.sc.slots()-50, o.sc.slots())
		fmt.Printf("run %d: back after %s, last5 %.1f%%, new conns/s after %.0f; by server in the last second %v, clients by server %v; failed %v; worst clients %s\n",
			run, fmtRecovery(o.recovery()), 100*last5, float64(sum(o.s.conns, to, o.sc.slots()))/sc.after.Seconds(),
			last, clients, total, strings.Join(top, " "))
		if last5 < 0.99 || testing.Verbose() && os.Getenv("RESILIX_FLEET_DIAG_ALL") != "" {
			fmt.Print(perSecond(o))
			for _, i := range worst {
				fmt.Printf("    c%d wire calls by server %v\n", i, byServer[i])
			}
			for i := range f.servers {
				fmt.Printf("  server %d arrivals/s %v\n  server %d refusals/s %v\n  server %d limits (last 40) %v\n",
					i, arrived[i], i, refused[i], i, limits[i][max(0, len(limits[i])-40):])
			}
		}
	}
}

// diagGet is get, saying how the call ended: "ok", "late" (a 200 after
// the deadline), the gate that refused it, the status, "deadline" or
// "err". The request carries the client's index in diagClientHeader.
func diagGet(ctx context.Context, c *http.Client, url string, client int) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "err"
	}
	req.Header.Set(diagClientHeader, strconv.Itoa(client))
	resp, err := c.Do(req)
	if err != nil {
		var re *policy.RejectedError
		switch {
		case errors.As(err, &re):
			s := "gate-" + re.Gate.String()
			if re.RetryAfter > 0 {
				s += "-held"
			}
			return s
		case errors.Is(err, context.DeadlineExceeded):
			return "deadline"
		}
		return "err"
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return strconv.Itoa(resp.StatusCode)
	}
	if dl, _ := ctx.Deadline(); !time.Now().Before(dl) {
		return "late"
	}
	return "ok"
}
