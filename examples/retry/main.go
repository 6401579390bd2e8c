// Command retry shows what resilix's retry does to traffic, against three
// local upstreams on loopback: one that fails 5% of calls, one that is
// down, and a healthy one that shares the client with both.
//
// It prints one row per upstream and client: how many calls succeeded, how
// many wire calls that took, and the latency of the calls.
//
//	go run ./examples/retry
package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

const (
	callsPerRow = 600
	workers     = 8
)

func main() {
	if _, err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "retry:", err)
		os.Exit(1)
	}
}

type upstream struct {
	name string
	opts httptestutil.Options
}

// row is one line of the table.
type row struct {
	upstream, client string
	ok, wire         int
	took             time.Duration // the row's calls, first to last
}

func run(w io.Writer) ([]row, error) {
	latency := httptestutil.LogNormal(2*time.Millisecond, 0.4)
	upstreams := []upstream{
		{"flaky (5% 503)", httptestutil.Options{Latency: latency, Seed: 1,
			Faults: []httptestutil.Fault{{Probability: 0.05, Status: 503}}}},
		{"down (all 503)", httptestutil.Options{Latency: latency, Seed: 2,
			Faults: []httptestutil.Fault{{Probability: 1, Status: 503}}}},
		{"healthy", httptestutil.Options{Latency: latency, Seed: 3}},
	}

	rt, err := transport.New(transport.Config{
		Policies: policy.Set{
			Retry:   &policy.Retry{BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond},
			Timeout: &policy.Timeout{PerAttempt: time.Second},
		},
	})
	if err != nil {
		return nil, err
	}
	defer rt.CloseIdleConnections()
	plain := &http.Transport{MaxIdleConnsPerHost: workers}
	defer plain.CloseIdleConnections()

	var rows []row
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "upstream\tclient\tcalls\tsucceeded\twire calls\textra\tp50\tp99\tbudget left\t")
	for _, u := range upstreams {
		for _, client := range []struct {
			name string
			rt   http.RoundTripper
		}{{"net/http", plain}, {"resilix", rt}} {
			up := httptestutil.NewUpstream(u.opts)
			srv := httptest.NewServer(up)
			start := time.Now()
			r := httptestutil.Load{Calls: callsPerRow, Workers: workers, Timeout: 5 * time.Second}.
				Run(&http.Client{Transport: client.rt}, srv.URL)
			took := time.Since(start)
			srv.Close()
			wire := up.Stats().Requests
			rows = append(rows, row{u.name, client.name, r.OK, int(wire), took})
			budget := "-"
			if client.rt == rt {
				m := rt.Measured(strings.TrimPrefix(srv.URL, "http://"))
				budget = fmt.Sprintf("%.1f", m.BudgetBalance)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f%%\t%d\t%+.1f%%\t%v\t%v\t%s\t\n",
				u.name, client.name, callsPerRow, 100*float64(r.OK)/callsPerRow, wire,
				100*float64(wire-callsPerRow)/callsPerRow,
				r.Quantile(0.5).Round(100*time.Microsecond), r.Quantile(0.99).Round(100*time.Microsecond), budget)
		}
	}
	if err := tw.Flush(); err != nil {
		return nil, err
	}
	fmt.Fprintln(w, `
Retries fix the flaky upstream for a few percent more wire calls. Against the
upstream that is down, the shared budget (20% of calls, plus 10 tokens a
second and the 20 it holds when the outage begins; a retry that succeeds
earns its token back, so only failed ones count) caps the extra load instead
of tripling it. Each upstream host has its own
budget, so the dead one never spends the healthy one's.`)
	return rows, nil
}
