package fleetops

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// Each run: clients start calling startUp after they are started, the
// first warmUp of calls is not measured, then window is.
const (
	startUp = 1500 * time.Millisecond
	warmUp  = 2 * time.Second
	window  = 10 * time.Second
	// lastStretch is "the last 3 s" of the window.
	lastStretch = 3 * time.Second
)

// refresh is Replicas.Refresh at its default, which the resilix client
// uses and the scale targets are relative to.
var refresh = policy.Replicas{}.WithDefaults().Refresh

// TestFleetOps puts policy.Replicas through a fleet's daily life with real
// parts: Debian's nginx as the replicas, each on its own
// loopback address (127.0.0.2 and up) and one port, answering every
// request after 5 ms (libnginx-mod-http-echo); Debian's dnsmasq on a
// loopback port naming them (its hosts file rewritten and re-read on
// SIGHUP); a net/http client (go-cleanhttp's pooled transport, dialing
// through the same DNS) and a resilix client (Attempts 3, Retry, Hedge,
// Breaker, Timeout{PerAttempt: 1s}, Replicas{Endpoints: that DNS} at its
// defaults), each in a process of its own, side by side at 200 calls/s
// open loop (80% GET, 10% plain POST, 10% POST with an Idempotency-Key),
// 2 s deadlines. Each run of a scenario measures 10 s after a 2 s
// warm-up, on a fleet of its own, and checks the resilix client against
// its targets: one table per run, the verdicts under it, and a
// test failure for each target missed. The targets, in every run unless
// said ("the last 3s" are the window's; a comparison with net/http is of
// the sums over the runs):
//
//   - steady: no lane ejected (warm-up included).
//   - restart (each replica SIGQUIT, waited for, started again): 0 failed
//     GETs and Idempotency-Key POSTs, failed calls <= net/http's; each
//     restarted replica answers within 2 s of listening again, and each
//     restarted before the last 3 s holds >= half its fair share of them.
//   - crash (SIGKILL, left in DNS): 0 failed GETs, failed calls <=
//     net/http's, its lane out within 1 s (ejected, or at most one
//     attempt a second on it from then on).
//   - freeze (SIGSTOP for 5 s): failed calls <= half of net/http's; it
//     answers again within 3 s of SIGCONT.
//   - scaleout (3 -> 6 in DNS): each new replica answers within Refresh +
//     1 s, and the new ones hold >= 35% of the last 3 s.
//   - scalein (6 -> 3 in DNS, the removed replicas SIGQUIT 1 s later): 0
//     failed GETs and Idempotency-Key POSTs, plain-POST failures <=
//     net/http's.
//   - scalein-conns (the removed replicas left running for Refresh + 5
//     s): no connection of the resilix client to one open 2 s after its
//     refresh dropped it (its count of lanes fell to three).
//   - slow (one replica 20x slower): its share <= 2%, p99 <= 1.5x the
//     steady runs' mean p99.
//   - stall (both clients SIGSTOPped 200 ms of every 500 ms for 2 s): no
//     lane ejected, each replica >= half its fair share after the stalls.
//   - replicas: make replicas' TestReplicas passes in each run.
//   - every scenario: plain POSTs reach a server at most once (the
//     replicas' access logs).
//
// It runs only when FLEETOPS is set: to 1 or all for every scenario, or
// to a comma-separated list of them (steady, restart, crash, freeze,
// scaleout, scalein, scalein-conns, slow, stall, replicas); FLEETOPS_RUNS
// is the runs of each (default 3); FLEETOPS_PROTO=h2 runs them over TLS
// with HTTP/2 (a certificate of the harness's own), where the default is
// HTTP/1.1 in the clear; FLEETOPS_KEEP=dir keeps each run's configs,
// logs and the clients' records (one JSON line an attempt, call and lane
// event) in a directory under dir. As root it installs what it is
// missing with apt-get (nginx-light, libnginx-mod-http-echo, dnsmasq,
// haproxy), and skips otherwise; it never touches the machine's
// resolv.conf, hosts file or nginx config, and every process it starts
// is killed at the end of its run.
func TestFleetOps(t *testing.T) {
	sel := os.Getenv("FLEETOPS")
	if sel == "" {
		t.Skip("the fleet-operations harness with nginx and dnsmasq; set FLEETOPS=1 (or a list of scenarios) to run it, as make fleet-ops does")
	}
	runs := 3
	if s := os.Getenv("FLEETOPS_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("FLEETOPS_RUNS=%q: want a count of runs", s)
		}
		runs = n
	}
	chosen, err := chooseScenarios(sel)
	if err != nil {
		t.Fatal(err)
	}
	var h2 bool
	switch p := os.Getenv("FLEETOPS_PROTO"); p {
	case "", "h1":
	case "h2":
		h2 = true
	default:
		t.Fatalf("FLEETOPS_PROTO=%q: want h1 (HTTP/1.1 in the clear, the default) or h2 (HTTP/2 over TLS)", p)
	}
	nginx, dnsmasq := tools(t, slices.ContainsFunc(chosen, func(sc scenario) bool { return sc.name == "replicas" }))
	var steady []*run // the steady runs, which slow's p99 is relative to
	for _, sc := range chosen {
		t.Run(sc.name, func(t *testing.T) {
			if sc.name == "replicas" {
				makeReplicas(t, runs)
				return
			}
			if sc.name == "slow" && len(steady) == 0 {
				steady = append(steady, runOnce(t, nginx, dnsmasq, scenarioNamed("steady"), 0, h2))
			}
			var done []*run
			for i := range runs {
				t.Run("run"+strconv.Itoa(i+1), func(t *testing.T) {
					r := runOnce(t, nginx, dnsmasq, sc, i, h2)
					tb := r.table(sc)
					vs := sc.judge(r)
					vs = append(vs, atMostOnce(r))
					if sc.name == "slow" {
						vs = append(vs, slowP99(r, steady))
					}
					t.Logf("%s, run %d of %d\n%s%s", sc.title, i+1, runs, tb, verdicts(t, vs))
					done = append(done, r)
				})
			}
			if sc.name == "steady" {
				steady = append(steady, done...)
			}
			if sc.across != nil && len(done) > 0 {
				t.Logf("%s, over %d runs\n%s", sc.title, len(done), verdicts(t, sc.across(done)))
			}
		})
	}
}

func chooseScenarios(sel string) ([]scenario, error) {
	if sel == "1" || sel == "all" {
		return scenarios(), nil
	}
	var out []scenario
	for name := range strings.SplitSeq(sel, ",") {
		sc := scenarioNamed(strings.TrimSpace(name))
		if sc.name == "" {
			var names []string
			for _, sc := range scenarios() {
				names = append(names, sc.name)
			}
			return nil, fmt.Errorf("FLEETOPS: no scenario %q; there are %s", name, strings.Join(names, ", "))
		}
		out = append(out, sc)
	}
	return out, nil
}

func scenarioNamed(name string) scenario {
	for _, sc := range scenarios() {
		if sc.name == name {
			return sc
		}
	}
	return scenario{}
}

// A scenario is what happens to the fleet in a run, and its targets.
type scenario struct {
	name, title string
	// size is the replicas of the fleet, all started before the clients,
	// named in DNS the first named.
	size, named int
	slow        bool          // the first replica answers 20× slower
	extra       time.Duration // the clients call this long past the window
	// act does what happens to the fleet, from the window's start on.
	act func(r *run)
	// since gives, for each replica whose first answer matters, the
	// moment it is counted from.
	since func(r *run) map[string]time.Time
	// judge checks a run's targets; across, those that compare sums
	// over the runs.
	judge  func(r *run) []verdict
	across func(rs []*run) []verdict
}

// A run is one run of a scenario: its fleet, its events and its clients'
// records.
type run struct {
	f              *fleet
	from, to       time.Time // the measured window
	mu             sync.Mutex
	events         []event
	nethttp, resil []record
	resilixProc    *client
	nethttpProc    *client
	access         []accessLine
	samples        []connSample
}

type event struct {
	what, ip string
	at       time.Time
}

// connSample is how many connections each client held to the replicas
// dropped from DNS, at a moment.
type connSample struct {
	at               time.Time
	nethttp, resilix int
}

func (r *run) mark(what, ip string, at time.Time) {
	r.mu.Lock()
	r.events = append(r.events, event{what, ip, at})
	r.mu.Unlock()
}

func (r *run) event(what, ip string) (time.Time, bool) {
	for _, e := range r.events {
		if e.what == what && e.ip == ip {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// sleepTo sleeps until the window's start plus d.
func (r *run) sleepTo(d time.Duration) { time.Sleep(time.Until(r.from.Add(d))) }

// callsIn tallies the calls of recs started in [from, to).
func callsIn(recs []record, from, to time.Time) tally {
	return tallyCalls(of(recs, "call", from, to))
}

func (r *run) ejections(from, to time.Time) []record { return of(r.resil, "eject", from, to) }

// runOnce runs sc once on a fleet of its own, over HTTP/2 and TLS when
// h2 is true.
func runOnce(t *testing.T, nginx, dnsmasq string, sc scenario, i int, h2 bool) *run {
	t.Helper()
	f := newFleet(t, nginx, dnsmasq, sc.size, h2)
	if sc.slow {
		f.replicas[0].delay = 20 * f.replicas[0].delay
	}
	r := &run{f: f}
	for _, rep := range f.replicas {
		r.mark("listen", rep.ip, f.start(rep))
	}
	f.name(f.replicas[:sc.named]...)
	start := time.Now().Add(startUp)
	length := warmUp + window + sc.extra
	r.from, r.to = start.Add(warmUp), start.Add(warmUp+window)
	r.nethttpProc = f.startClient("nethttp", i, start, length)
	r.resilixProc = f.startClient("resilix", i, start, length)
	if sc.act != nil {
		sc.act(r)
	}
	wait := time.Until(start.Add(length)) + callDeadline + 10*time.Second
	r.nethttp = r.nethttpProc.records(t, wait)
	r.resil = r.resilixProc.records(t, wait)
	var err error
	if r.access, err = f.accessLog(); err != nil {
		t.Fatal(err)
	}
	return r
}

// table is a run's figures: a row per client.
func (r *run) table(sc scenario) *table {
	reps := r.f.replicas
	var names []string
	for _, rep := range reps {
		names = append(names, strings.TrimPrefix(rep.ip, "127.0.0"))
	}
	tb := &table{cols: []string{"client", "calls", "failed GET/POST/keyed", "p50", "p99", "p99.9", "share % " + strings.Join(names, "/"), "ejections", "first answer"}}
	var since map[string]time.Time
	if sc.since != nil {
		since = sc.since(r)
	}
	for _, c := range []struct {
		name string
		recs []record
	}{{"net/http", r.nethttp}, {"resilix", r.resil}} {
		tl := callsIn(c.recs, r.from, r.to)
		var shares []string
		for _, rep := range reps {
			shares = append(shares, strconv.Itoa(int(100*tl.share(rep.ip)+0.5)))
		}
		ej := "-"
		if c.name == "resilix" {
			ej = strconv.Itoa(len(r.ejections(r.from, r.to)))
		}
		var firsts []string
		for _, rep := range reps {
			if at, ok := since[rep.ip]; ok {
				d, ok := firstAnswer(c.recs, rep.ip, at)
				firsts = append(firsts, secs(d, ok))
			}
		}
		tb.row(c.name, strconv.Itoa(tl.calls),
			fmt.Sprintf("%d/%d/%d", tl.failed["get"], tl.failed["post"], tl.failed["keyed"]),
			ms(quantile(tl.lats, 0.5)), ms(quantile(tl.lats, 0.99)), ms(quantile(tl.lats, 0.999)),
			strings.Join(shares, "/"), ej, cmp.Or(strings.Join(firsts, " "), "-"))
		if len(tl.errs) > 0 {
			tb.note("%s errors: %s", c.name, countsText(tl.errs, errClass))
		}
		protos := map[string]int{}
		for _, rec := range of(c.recs, "call", r.from, r.to) {
			if rec.Proto != "" {
				protos[rec.Proto]++
			}
		}
		tb.note("%s answers by protocol: %s", c.name, countsText(protos, nil))
		if warm := callsIn(c.recs, r.from.Add(-warmUp), r.from); warm.failures() > 0 {
			tb.note("%s warm-up (not measured): %d of %d calls failed: %s", c.name, warm.failures(), warm.calls, countsText(warm.errs, errClass))
		}
	}
	if att := of(r.resil, "attempt", r.from, r.to); len(att) > 0 {
		by := map[string]int{}
		for _, a := range att {
			by[cmp.Or(a.Replica, "none")]++
		}
		var parts []string
		for _, rep := range reps {
			parts = append(parts, strconv.Itoa(by[rep.ip]))
		}
		calls := len(of(r.resil, "call", r.from, r.to))
		tb.note("resilix wire attempts %s by lane: %s (%.3f a call)", strings.Join(names, "/"), strings.Join(parts, "/"), float64(len(att))/float64(max(calls, 1)))
	}
	for _, e := range r.ejections(r.from.Add(-warmUp), r.to.Add(sc.extra)) {
		tb.note("resilix ejected %s at %+.2fs (%s, for %v)", e.Replica, e.start().Sub(r.from).Seconds(), e.Reason, time.Duration(e.Lat))
	}
	for _, e := range r.events {
		if !e.at.Before(r.from.Add(-warmUp)) {
			tb.note("%s %s at %+.2fs", e.what, e.ip, e.at.Sub(r.from).Seconds())
		}
	}
	var took []time.Duration
	for _, l := range r.access {
		if !l.At.Before(r.from) && l.At.Before(r.to) {
			took = append(took, l.Took)
		}
	}
	slices.Sort(took)
	tb.note("servers' own $request_time over the window: p50 %s, p99 %s (%d requests, both clients)", ms(quantile(took, 0.5)), ms(quantile(took, 0.99)), len(took))
	if len(since) > 0 {
		tb.note("first answer: of a call started after the replica listened again, was named in DNS or thawed, counted from that moment")
	}
	return tb
}

// countsText writes the counts of m, merged by class (nil: as they are),
// the most frequent first.
func countsText(m map[string]int, class func(string) string) string {
	by := map[string]int{}
	for k, n := range m {
		if class != nil {
			k = class(k)
		}
		by[k] += n
	}
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(by[b]-by[a], strings.Compare(a, b)) })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, by[k]))
	}
	return strings.Join(parts, ", ")
}

// A verdict is one target checked: what it needs, what was measured.
type verdict struct {
	target, got string
	ok          bool
}

func check(ok bool, target, format string, args ...any) verdict {
	return verdict{target: target, got: fmt.Sprintf(format, args...), ok: ok}
}

// verdicts prints vs, and fails t for each target missed.
func verdicts(t *testing.T, vs []verdict) string {
	t.Helper()
	var b strings.Builder
	for _, v := range vs {
		mark := "ok  "
		if !v.ok {
			mark = "MISS"
			t.Errorf("missed: %s: got %s", v.target, v.got)
		}
		fmt.Fprintf(&b, "  %s %s: %s\n", mark, v.target, v.got)
	}
	return b.String()
}

// atMostOnce is the target of every scenario: plain POSTs reach a server
// at most once.
func atMostOnce(r *run) verdict {
	var reps []accessLine
	for _, l := range r.access {
		if strings.HasPrefix(l.ID, "r") {
			reps = append(reps, l)
		}
	}
	dup := repeatedPlainPOSTs(reps)
	return check(len(dup) == 0, "plain POSTs reach a server at most once", "%d repeated %s", len(dup), strings.Join(dup[:min(len(dup), 5)], " "))
}

// sumFailed sums the failed calls of the kinds given (all when none) over
// the runs' windows, for the net/http and the resilix clients.
func sumFailed(rs []*run, kinds ...string) (nethttp, resil int) {
	for _, r := range rs {
		for i, recs := range [][]record{r.nethttp, r.resil} {
			tl := callsIn(recs, r.from, r.to)
			n := tl.failures()
			if len(kinds) > 0 {
				n = 0
				for _, k := range kinds {
					n += tl.failed[k]
				}
			}
			if i == 0 {
				nethttp += n
			} else {
				resil += n
			}
		}
	}
	return nethttp, resil
}

func noneFailed(r *run, kinds ...string) verdict {
	tl := callsIn(r.resil, r.from, r.to)
	n := 0
	var got []string
	for _, k := range kinds {
		n += tl.failed[k]
		got = append(got, fmt.Sprintf("%d %s", tl.failed[k], k))
	}
	names := map[string]string{"get": "GETs", "keyed": "Idempotency-Key POSTs"}
	var want []string
	for _, k := range kinds {
		want = append(want, names[k])
	}
	return check(n == 0, "0 failed "+strings.Join(want, " and "), "%s", strings.Join(got, ", "))
}

func noEjection(r *run, from time.Time) verdict {
	ej := r.ejections(from, r.to)
	var got []string
	for _, e := range ej {
		got = append(got, fmt.Sprintf("%s at %+.2fs (%s)", e.Replica, e.start().Sub(r.from).Seconds(), e.Reason))
	}
	return check(len(ej) == 0, "no lane ejected", "%d ejected %s", len(ej), strings.Join(got, ", "))
}

func failedAtMost(rs []*run, factor float64, what string, kinds ...string) verdict {
	n, x := sumFailed(rs, kinds...)
	return check(float64(x) <= factor*float64(n), what, "resilix %d, net/http %d", x, n)
}

func scenarios() []scenario {
	return []scenario{
		{
			name: "steady", title: "steady: three replicas, 5 ms each",
			size: 3, named: 3,
			judge: func(r *run) []verdict { return []verdict{noEjection(r, r.from.Add(-warmUp))} },
		},
		{
			name: "restart", title: "rolling graceful restart: each replica SIGQUIT, waited for and started again, 2.1 s apart, from +0.5s",
			size: 3, named: 3,
			act: func(r *run) {
				for i, rep := range r.f.replicas {
					r.sleepTo(500*time.Millisecond + time.Duration(i)*2100*time.Millisecond)
					r.mark("quit", rep.ip, time.Now())
					r.f.stop(rep)
					r.mark("listening again", rep.ip, r.f.start(rep))
				}
			},
			since: func(r *run) map[string]time.Time { return r.sinceEvent("listening again") },
			judge: func(r *run) []verdict {
				vs := []verdict{noneFailed(r, "get", "keyed")}
				last := callsIn(r.resil, r.to.Add(-lastStretch), r.to)
				for _, rep := range r.f.replicas {
					at, _ := r.event("listening again", rep.ip)
					d, ok := firstAnswer(r.resil, rep.ip, at)
					vs = append(vs, check(ok && d <= 2*time.Second, rep.ip+" answers within 2s of listening again", "%s", secs(d, ok)))
					if at.Before(r.to.Add(-lastStretch)) {
						share := last.share(rep.ip)
						vs = append(vs, check(share >= 0.5/3, rep.ip+" holds >= half its fair share (16.7%) of the last 3s", "%.1f%%", 100*share))
					}
				}
				return vs
			},
			across: func(rs []*run) []verdict {
				return []verdict{failedAtMost(rs, 1, "failed calls <= net/http's (sum of the runs)")}
			},
		},
		{
			name: "crash", title: "crash: the first replica SIGKILLed at +2s, left in DNS",
			size: 3, named: 3,
			act: func(r *run) {
				r.sleepTo(2 * time.Second)
				rep := r.f.replicas[0]
				rep.proc.signal(syscall.SIGKILL)
				r.mark("killed", rep.ip, time.Now())
			},
			judge: func(r *run) []verdict {
				rep := r.f.replicas[0]
				killed, _ := r.event("killed", rep.ip)
				return []verdict{noneFailed(r, "get"), laneOut(r, rep.ip, killed)}
			},
			across: func(rs []*run) []verdict {
				return []verdict{failedAtMost(rs, 1, "failed calls <= net/http's (sum of the runs)")}
			},
		},
		{
			name: "freeze", title: "freeze: the first replica SIGSTOPped at +2s for 5s (its kernel still accepts)",
			size: 3, named: 3,
			act: func(r *run) {
				rep := r.f.replicas[0]
				r.sleepTo(2 * time.Second)
				rep.proc.signal(syscall.SIGSTOP)
				r.mark("stopped", rep.ip, time.Now())
				r.sleepTo(7 * time.Second)
				rep.proc.signal(syscall.SIGCONT)
				r.mark("thawed", rep.ip, time.Now())
			},
			since: func(r *run) map[string]time.Time { return r.sinceEvent("thawed") },
			judge: func(r *run) []verdict {
				rep := r.f.replicas[0]
				at, _ := r.event("thawed", rep.ip)
				d, ok := firstAnswer(r.resil, rep.ip, at)
				return []verdict{check(ok && d <= 3*time.Second, rep.ip+" answers within 3s of SIGCONT", "%s", secs(d, ok))}
			},
			across: func(rs []*run) []verdict {
				return []verdict{failedAtMost(rs, 0.5, "failed calls <= half of net/http's (sum of the runs)")}
			},
		},
		{
			name: "scaleout", title: fmt.Sprintf("scale out 3 -> 6 in DNS at +1s (Refresh %v)", refresh),
			size: 6, named: 3,
			act: func(r *run) {
				r.sleepTo(time.Second)
				at := r.f.name(r.f.replicas...)
				for _, rep := range r.f.replicas[3:] {
					r.mark("named", rep.ip, at)
				}
			},
			since: func(r *run) map[string]time.Time { return r.sinceEvent("named") },
			judge: func(r *run) []verdict {
				var vs []verdict
				last := callsIn(r.resil, r.to.Add(-lastStretch), r.to)
				share := 0.0
				for _, rep := range r.f.replicas[3:] {
					at, _ := r.event("named", rep.ip)
					d, ok := firstAnswer(r.resil, rep.ip, at)
					vs = append(vs, check(ok && d <= refresh+time.Second, fmt.Sprintf("%s answers within Refresh + 1s (%v)", rep.ip, refresh+time.Second), "%s", secs(d, ok)))
					share += last.share(rep.ip)
				}
				return append(vs, check(share >= 0.35, "the new replicas hold >= 35% of the last 3s", "%.1f%%", 100*share))
			},
		},
		{
			name: "scalein", title: "scale in 6 -> 3 in DNS at +2s, the removed replicas SIGQUIT 1s later",
			size: 6, named: 6,
			act: func(r *run) {
				r.sleepTo(2 * time.Second)
				at := r.f.name(r.f.replicas[:3]...)
				for _, rep := range r.f.replicas[3:] {
					r.mark("unnamed", rep.ip, at)
				}
				time.Sleep(time.Until(at.Add(time.Second)))
				var wg sync.WaitGroup
				for _, rep := range r.f.replicas[3:] {
					wg.Go(func() {
						r.mark("quit", rep.ip, time.Now())
						r.f.stop(rep)
					})
				}
				wg.Wait()
			},
			judge: func(r *run) []verdict { return []verdict{noneFailed(r, "get", "keyed")} },
			across: func(rs []*run) []verdict {
				return []verdict{failedAtMost(rs, 1, "plain-POST failures <= net/http's (sum of the runs)", "post")}
			},
		},
		{
			name: "scalein-conns", title: fmt.Sprintf("scale in 6 -> 3 in DNS at +1s, the removed replicas left running for Refresh + 5s (%v)", refresh+5*time.Second),
			size: 6, named: 6,
			extra: max(0, time.Second+refresh+5*time.Second-window),
			act: func(r *run) {
				r.sleepTo(time.Second)
				at := r.f.name(r.f.replicas[:3]...)
				removed := r.f.ips(r.f.replicas[3:]...)
				for _, ip := range removed {
					r.mark("unnamed", ip, at)
				}
				for time.Since(at) < refresh+5*time.Second {
					s := connSample{at: time.Now()}
					for _, c := range []*client{r.nethttpProc, r.resilixProc} {
						n, err := c.conns(removed)
						if err != nil {
							break
						}
						for _, v := range n {
							if c == r.nethttpProc {
								s.nethttp += v
							} else {
								s.resilix += v
							}
						}
					}
					r.samples = append(r.samples, s)
					time.Sleep(100 * time.Millisecond)
				}
			},
			judge: func(r *run) []verdict { return []verdict{connsClosed(r)} },
		},
		{
			name: "slow", title: "slow replica: the first replica answers after 100 ms (20x)",
			size: 3, named: 3, slow: true,
			judge: func(r *run) []verdict {
				tl := callsIn(r.resil, r.from, r.to)
				share := tl.share(r.f.replicas[0].ip)
				return []verdict{check(share <= 0.02, "the slow replica's share <= 2%", "%.1f%%", 100*share)}
			},
		},
		{
			name: "stall", title: "stalled client: both client processes SIGSTOPped 200 ms of every 500 ms for 2s from +1s",
			size: 3, named: 3,
			act: func(r *run) {
				for i := range 4 {
					r.sleepTo(time.Second + time.Duration(i)*500*time.Millisecond)
					for _, c := range []*client{r.nethttpProc, r.resilixProc} {
						c.proc.signal(syscall.SIGSTOP)
					}
					time.Sleep(200 * time.Millisecond)
					for _, c := range []*client{r.nethttpProc, r.resilixProc} {
						c.proc.signal(syscall.SIGCONT)
					}
				}
				r.mark("stalls over", "clients", time.Now())
			},
			judge: func(r *run) []verdict {
				vs := []verdict{noEjection(r, r.from.Add(-warmUp))}
				after := callsIn(r.resil, r.from.Add(3*time.Second), r.to)
				for _, rep := range r.f.replicas {
					share := after.share(rep.ip)
					vs = append(vs, check(share >= 0.5/3, rep.ip+" holds >= half its fair share (16.7%) after the stalls", "%.1f%%", 100*share))
				}
				return vs
			},
		},
		{name: "replicas", title: "make replicas (TestReplicas, haproxy installed)"},
	}
}

func (r *run) sinceEvent(what string) map[string]time.Time {
	out := map[string]time.Time{}
	for _, e := range r.events {
		if e.what == what {
			out[e.ip] = e.at
		}
	}
	return out
}

// laneOut checks that the crashed replica's lane is out within 1 s: the
// lane ejected by then, or, from then on, at most one attempt a second on
// it (the probes of a lane that is out).
func laneOut(r *run, ip string, killed time.Time) verdict {
	for _, e := range r.ejections(killed, killed.Add(time.Second)) {
		if e.Replica == ip {
			return check(true, ip+"'s lane out within 1s", "ejected after %.2fs", e.start().Sub(killed).Seconds())
		}
	}
	n := 0
	for _, a := range of(r.resil, "attempt", killed.Add(time.Second), r.to) {
		if a.Replica == ip {
			n++
		}
	}
	stretch := r.to.Sub(killed.Add(time.Second))
	return check(float64(n) <= stretch.Seconds()+1, ip+"'s lane out within 1s (ejected, or at most 1 attempt/s on it after)",
		"not ejected within 1s; %d attempts on it over the %.1fs after", n, stretch.Seconds())
}

// connsClosed checks that no resilix connection to a replica dropped from
// DNS is open 2 s after the client's refresh dropped it (its count of
// lanes fell to 3).
func connsClosed(r *run) verdict {
	at, _ := r.event("unnamed", r.f.replicas[3].ip)
	var dropped time.Time
	for _, l := range r.resil {
		if l.Type == "lanes" && l.N == 3 && !l.start().Before(at) {
			dropped = l.start()
			break
		}
	}
	const target = "no resilix connection to a removed replica open 2s after its refresh dropped it"
	if len(r.samples) == 0 {
		return check(false, target, "no samples of the client's connections")
	}
	lastN, lastAt := r.samples[len(r.samples)-1].resilix, r.samples[len(r.samples)-1].at
	netLast := r.samples[len(r.samples)-1].nethttp
	if dropped.IsZero() {
		return check(false, target, "the refresh never dropped them within Refresh + 5s (%d resilix, %d net/http connections to them open at the end)", lastN, netLast)
	}
	// closed is the first sample from which none is open to the end.
	var closed time.Time
	for i := len(r.samples) - 1; i >= 0 && r.samples[i].resilix == 0; i-- {
		closed = r.samples[i].at
	}
	if closed.IsZero() {
		return check(false, target, "dropped at %+.2fs, %d still open at %+.2fs (net/http: %d)", dropped.Sub(r.from).Seconds(), lastN, lastAt.Sub(r.from).Seconds(), netLast)
	}
	d := closed.Sub(dropped)
	return check(d <= 2*time.Second, target, "dropped at %+.2fs, all closed %.2fs later (net/http: %d open at the end)", dropped.Sub(r.from).Seconds(), max(d, 0).Seconds(), netLast)
}

// slowP99 checks the slow scenario's p99 against the steady runs'.
func slowP99(r *run, steady []*run) verdict {
	var ref time.Duration
	for _, s := range steady {
		ref += quantile(callsIn(s.resil, s.from, s.to).lats, 0.99)
	}
	ref /= time.Duration(max(len(steady), 1))
	p99 := quantile(callsIn(r.resil, r.from, r.to).lats, 0.99)
	return check(p99 <= ref*3/2, fmt.Sprintf("p99 <= 1.5x the steady p99 (%s, mean of %d steady runs)", ms(ref), len(steady)), "%s", ms(p99))
}

// makeReplicas runs make replicas' TestReplicas n times, haproxy
// installed, each run's output kept in a file whose name it logs.
func makeReplicas(t *testing.T, n int) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not in PATH")
	}
	if lookPath("haproxy") == "" {
		t.Fatal("haproxy is not installed")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	passed := 0
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		cmd := exec.CommandContext(ctx, goBin, "test", "-count=1", "-run", "^TestReplicas$", "-v", "-timeout", "7m", "./transport/")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "RESILIX_REPLICAS=1")
		cmd.Env = append(cmd.Env, "PATH="+os.Getenv("PATH")+":/usr/sbin")
		out, err := cmd.CombinedOutput()
		cancel()
		logPath := filepath.Join(os.TempDir(), fmt.Sprintf("fleetops-replicas-%d.log", i+1))
		os.WriteFile(logPath, out, 0o644)
		var fails []string
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "--- FAIL") || strings.Contains(l, "_test.go:") && strings.Contains(l, "target") {
				fails = append(fails, l)
			}
		}
		if err == nil {
			passed++
		}
		t.Logf("make replicas, run %d of %d: %s (output in %s)\n  %s", i+1, n, map[bool]string{true: "every check passed", false: fmt.Sprintf("failed (%v)", err)}[err == nil], logPath, strings.Join(fails, "\n  "))
	}
	t.Logf("make replicas\n%s", verdicts(t, []verdict{check(passed == n, "every check of make replicas in every run", "%d of %d runs passed", passed, n)}))
}
