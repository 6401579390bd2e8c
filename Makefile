# resilix: the two commands a newcomer needs are `make demo` and `make test`.
GO        ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCHSTAT   := golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
FUZZTIME  ?= 15s

SOAK      ?= 3m
FLAKY     ?= 1

.PHONY: test demo bench lint fuzz soak flaky

## test: gofmt check, then go vet and every test with the race detector,
## in every module. The modules run side by side (three at a time), each
## one's output kept together: the tests of redisrate and of
## examples/prometheus spend most of their time waiting on a real server,
## time the root module's CPU-bound tests fill.
test:
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	@$(MAKE) --no-print-directory -j3 --output-sync=target test-root test-redisrate test-prometheus test-benchmarks test-docs

.PHONY: test-root test-redisrate test-prometheus test-benchmarks test-docs
test-root:
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

# redisrate, the shared rate limit on Redis, is its own module, so that
# the Redis client stays out of resilix's go.mod (./... does not reach a
# nested module); its tests start their own redis-server and redis-cli:
# they skip where those are not in PATH, and fail if CI=true (.ci/run
# installs them). Here they check counts and limits; make redis checks
# the rates and waits too.
test-redisrate:
	cd redisrate && $(GO) vet ./... && $(GO) test -race -count=1 ./...

# examples/prometheus is its own module, so that the Prometheus exporter
# stays out of resilix's go.mod. Its tests run promtool and a real
# Prometheus on its dashboard and rules: they skip where prometheus is not
# in PATH, and fail if CI=true (.ci/run installs it).
test-prometheus:
	cd examples/prometheus && $(GO) vet ./... && $(GO) test -race -count=1 ./...

# benchmarks/ is the comparison with peer libraries, also its own module;
# its tests are the correctness facts (fast, in synctest).
test-benchmarks:
	cd benchmarks && $(GO) vet ./... && $(GO) test -race -count=1 ./...

# docs/ is its own module too: its test type-checks every Go snippet of
# README.md and docs/*.md (otelhttp, go-redis stay out of go.mod).
test-docs:
	cd docs && $(GO) vet ./... && $(GO) test -race -count=1 ./...

## test-oldest-go: go vet and the root module's tests (no -race) with
## the oldest Go that go.mod allows (its go directive), which the go
## command downloads from the Go module proxy as golang.org/toolchain;
## .ci/run runs it after make test.
OLDEST_GO := go$(shell sed -n 's/^go //p' go.mod)
.PHONY: test-oldest-go
test-oldest-go:
	GOTOOLCHAIN=$(OLDEST_GO) $(GO) version
	GOTOOLCHAIN=$(OLDEST_GO) $(GO) vet ./...
	GOTOOLCHAIN=$(OLDEST_GO) $(GO) test -count=1 ./...

## soak: the transport's contract checks over loopback, randomized, for
## SOAK (default 3m): 5xx storms, resets, stalled bodies, slow headers and
## a panicking base; ends by itself and prints what it checked. make test
## runs a 2-second version of the same test.
soak:
	RESILIX_SOAK=$(SOAK) $(GO) test -race -count=1 -run '^TestSoak$$' -v -timeout 0 ./transport/ | grep -v '^=== '

## flaky: how the default chain treats a flaky host, measured over loopback
## beside bare net/http and checked against targets (about 80s): steady 20%
## 503s and resets, resets on fresh connections with Hedge, an 8s outage,
## a jump from 5% to 60% failing; one table per scenario. FLAKY is 1, or a
## duration for the steady scenarios (default 8s). No -race: the figures
## are calls a second, wire calls per call and seconds to recover, and the
## race detector's several-fold slowdown of every call would measure it,
## not resilix. make test builds the harness under -race and skips it.
## Not piped through grep, so that a missed target fails make.
flaky:
	RESILIX_FLAKY=$(FLAKY) $(GO) test -count=1 -run '^TestFlaky$$' -v -timeout 5m ./transport/

## demo: the main job against a local upstream, printed as a table; then
## three tiers overloaded and taken down, with and without resilix.
demo:
	$(GO) run ./examples/hedging
	@echo
	$(GO) run ./examples/fleet

## bench: every benchmark of resilix, with allocations; compare runs with
## benchstat. The comparison with peers: cd benchmarks && go test -bench .
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./... | tee bench.txt
	@echo "compare two runs with: $(GO) run $(BENCHSTAT) old.txt bench.txt"

## lint: staticcheck, fetched through the Go module proxy.
lint:
	$(GO) run $(STATICCHECK) ./...
	cd examples/prometheus && $(GO) run $(STATICCHECK) ./...
	cd benchmarks && $(GO) run $(STATICCHECK) ./...
	cd redisrate && $(GO) run $(STATICCHECK) ./...
	cd docs && $(GO) run $(STATICCHECK) ./...

## fuzz: a short run of every fuzz target, one at a time (go test -fuzz takes one).
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

## replicas: a host of four replicas, one degraded (20x slower, or failing
## half its calls; then all failing), measured over loopback beside bare
## net/http and resilix without Replicas, and the Replicas row checked
## against DESIGN.md §8's targets (about 125s; 175s with haproxy in PATH):
## requests naming the first replica with Endpoints the four addresses, and
## an L4 balancer placing each connection on a replica (one written in the
## test, and HAProxy in TCP mode when haproxy is in PATH) with connection
## lanes; HTTP/1.1 and h2c; one table per case. REPLICAS is 1, or a duration for each case (default
## 6s, measured after a 1s warm-up that only breaker openings and ejections count). No -race: the figures are latency quantiles against the same
## client's, shares of answers and wire calls per call at a steady rate,
## and the race detector's several-fold slowdown of every call would move
## the quantiles and the pacing, measuring it, not resilix. make test
## builds the harness under -race and skips it. Not piped through grep, so
## that a missed target fails make.
REPLICAS ?= 1
.PHONY: replicas
replicas:
	RESILIX_REPLICAS=$(REPLICAS) $(GO) test -count=1 -run '^TestReplicas$$' -v -timeout 6m ./transport/

## fleet-ops: replicas through a fleet's daily life, with real
## parts: Debian's nginx as three replicas (six to scale) on 127.0.0.2 and
## up, named by dnsmasq on a loopback port, and a net/http and a resilix
## client (Replicas over that DNS), each in a process of its own, at 200
## calls/s; a rolling restart, a crash, a frozen replica, scaling out and
## in, a slow replica and the clients' own stalls, each 10s measured after
## a 2s warm-up, then make replicas' TestReplicas; one table per run,
## checked against the targets in fleetops/'s TestFleetOps doc. FLEETOPS is all, or a list
## (FLEETOPS=crash,freeze); FLEETOPS_RUNS the runs of each (default 3:
## about 18 minutes, 10 of them make replicas' runs); FLEETOPS_PROTO=h2
## for HTTP/2 over TLS in place of HTTP/1.1 in the clear. Installs
## nginx-light, libnginx-mod-http-echo, dnsmasq and haproxy with apt-get
## as root, and skips otherwise. No -race, for the reason given at flaky.
## make test builds it under -race and skips it. Not piped through grep,
## so that a missed target fails make.
FLEETOPS ?= all
FLEETOPS_RUNS ?= 3
.PHONY: fleet-ops
fleet-ops:
	FLEETOPS=$(FLEETOPS) FLEETOPS_RUNS=$(FLEETOPS_RUNS) $(GO) test -count=1 -run '^TestFleetOps$$' -v -timeout 60m ./fleetops/

## fleet-pushback: four replicas behind admission.Handler (4, 4, 2, and 4
## workers that drop to 2 for 2s of every 6s; lognormal service, mean
## 10ms), eight clients with Replicas over the four, Attempts 2, Retry and
## a 250ms PerAttempt, open loop at 90% of the fleet's mean capacity, 12s
## a seed, 5 seeds; a table per seed (p50, p99, failed calls, each
## replica's time above 1.5x its workers), checked against p99 <= 250ms and
## failed calls <= 0.5% in every seed. Each seed runs on an in-memory
## network in virtual time (testing/synctest: the fleet's dynamics alone,
## about 10s in all), then over loopback (about 75s), whose notes say how
## late the machine started calls and answered them: the replicas' workers
## keep their schedule, but a machine too busy to keep up makes the
## loopback run measure it. FLEET_PUSHBACK is 1, or a duration for each
## seed; RESILIX_FLEET_PUSHBACK_TRACE=1 in the environment adds notes on
## how and when calls failed, lanes ejected, and each replica's latency and
## admission limit over time. No -race, for the reason given at flaky.
## make test builds it under -race and skips it.
FLEET_PUSHBACK ?= 1
.PHONY: fleet-pushback
fleet-pushback:
	RESILIX_FLEET_PUSHBACK=$(FLEET_PUSHBACK) $(GO) test -count=1 -run '^TestFleetPushback$$' -v -timeout 10m ./transport/

## load-picking: picking by the servers' load reports against peak-EWMA
## alone, round robin and a least-loaded oracle (the last two the test's
## own pickers), on an in-memory network in virtual time: four replicas
## behind admission.Handler limited at their workers (4, 4, 2, and 4 whose
## service times double for 2s of every 6s; lognormal service, mean 10ms),
## eight clients, open loop at 70% and 90% of the fleet's mean capacity, 3
## seeds of 12s each per picker; a table per load (the median of the
## seeds' p50, p99, p99.9 and refusals, the weak replica's longest time
## above 1.5x its workers, each replica's share), checked against the
## targets in docs/replicas.md. About 30s. LOAD_PICKING is 1, or a duration for
## each seed. No -race, for the reason given at flaky. With
## RESILIX_LOAD_PICKING_TRACE=1 in the environment (make loadreports
## reads it too), notes say where admission's refusals came from: which
## replica, when in the dip's period, what the refused client's own last
## report from that replica said, and how many clients came to it in the
## service time before.
LOAD_PICKING ?= 1
.PHONY: load-picking
load-picking:
	RESILIX_LOAD_PICKING=$(LOAD_PICKING) $(GO) test -count=1 -run '^TestLoadPicking$$' -v -timeout 10m ./transport/

## tied: tied requests (Hedge.Tied) beside hedging at the p95 and no
## hedging, over loopback: four replicas behind admission.Handler, 8
## workers each with the limiter fixed at them and a deep queue (lognormal
## service, mean 40ms, sigma 0.25), reached through Replicas' Endpoints;
## bursty open loop (Poisson at 1.5x and 0.5x of the mean in turns of
## 400ms) at 70% and 85% of the fleet's capacity; HTTP/1.1 and h2c; hedging twice (the
## spread between the two is the machine's noise), and hedging and tied
## against plain servers too (no admission, no start signal). The
## configurations take turns in short slices of one run, 3 runs; a table
## per protocol and load (p50, p99, p99.9, failed calls, wire calls and
## handler executions per call, twins cancelled while queued, refusals),
## checked against the targets in TestTied's doc on the median of the
## runs. About 6 minutes. TIED is 1, or a duration for each slice (default
## 800ms). No -race, for the reason given at flaky. make test builds it
## under -race and skips it. Not piped through grep, so that a missed
## target fails make.
TIED ?= 1
.PHONY: tied
tied:
	RESILIX_TIED=$(TIED) $(GO) test -count=1 -run '^TestTied$$' -v -timeout 15m ./transport/

## limiter-throughput: what the adaptive limiter costs a healthy upstream
## (about 25s): a loopback handler that answers at once, 16 closed-loop
## callers, bare net/http against the Limiter alone, every policy but
## Hedge, and the Limiter with refused callers calling again at once, in
## 50ms turns in a shuffled order; best of three tries checked against 0.97x,
## 0.90x and 0.90x bare's calls a second with < 0.1% failed; prints the
## limit over time. No -race, for the reason given at flaky.
.PHONY: limiter-throughput
limiter-throughput:
	RESILIX_LIMITER_THROUGHPUT=1 $(GO) test -count=1 -run '^TestLimiterThroughput$$' -v -timeout 5m ./transport/

## metastable: the metastability experiment of benchmarks/ (about 7
## min): a server of 8 workers at 10ms behind an unbounded FIFO that works
## on requests whose callers have gone, offered 640 calls/s open loop with
## a 1s deadline, its service time 5x for 5s; each client (bare net/http,
## two hand-written retry loops, go-retryablehttp, failsafe-go with and
## without its budget, resilix's quick start) alone against a fresh server
## over loopback, then behind a front service (two tiers), then 200 of each
## against a fleet in virtual time (and that fleet's resilix clients
## watched each second); prints one table each, draws
## docs/metastable.svg, and fails if resilix's one-tier run misses back to
## 95% goodput within 2s of the trigger's end or more than 1.3 handler
## starts per offered call during it. No -race, for the reason given at
## flaky. make test runs a smoke of it in virtual time.
.PHONY: metastable
metastable:
	cd benchmarks && RESILIX_METASTABLE=1 RESILIX_METASTABLE_SVG=../docs/metastable.svg $(GO) test -count=1 -run '^TestMetastable$$' -v -timeout 20m .

## scenarios: three loopback measurements checked against targets (about
## 45s), each printing its table: the hedge threshold after an 8s
## brownout (TestHedgeRecovery), a flash crowd on admission's slow start
## (TestFlashCrowdLoopback), and a rate-limited API shared by Critical and
## Bulk callers (TestPricingLoopback). No -race, for the reason given at
## flaky. make test builds them under -race and skips them.
## redis: redisrate's failover, cluster and fleet tests with their timing
## checks on (RESILIX_REDIS_TIMING=1): the rates within 20% of the limits,
## no call waiting past StoreTimeout, the shared limit back within a second
## of Redis (2.5s of a cluster's failover); about 40s. No -race, for the
## reason given at flaky; make test runs the same tests under -race,
## checking counts and limits only.
.PHONY: redis
redis:
	cd redisrate && RESILIX_REDIS_TIMING=1 $(GO) test -count=1 -run 'TestFailover|TestCluster|TestFleet|TestTakeIsExact|TestRoundTripsPerLease' -v .

.PHONY: scenarios
scenarios:
	RESILIX_HEDGE_RECOVERY=1 $(GO) test -count=1 -run '^TestHedgeRecovery$$' -v ./transport/
	RESILIX_FLASHCROWD=1 $(GO) test -count=1 -run '^TestFlashCrowdLoopback$$' -v ./admission/
	RESILIX_PRICING=1 $(GO) test -count=1 -run '^TestPricingLoopback$$' -v ./transport/

## loadreports: make load-picking's fleet over real loopback: four
## replicas, each an http.Server on a 127.0.0.1 port behind
## admission.Handler limited at its workers (4, 4, 2, and 4 whose service
## times double for 2s of every 6s; timed waits, lognormal, mean 10ms),
## eight clients as goroutine groups with their own transports, open loop
## at 70% and 90% of the fleet's mean capacity; round robin, peak-EWMA
## alone and load reports in turn, 3 runs of 8s each; a table per load
## (the median of the runs), checked against the targets in
## docs/replicas.md (about 3 minutes). LOADREPORTS is 1, or a duration
## for each run. No -race, for the reason given at flaky. make test builds
## it under -race and skips it. Not piped through grep, so that a missed
## target fails make.
LOADREPORTS ?= 1
.PHONY: loadreports
loadreports:
	RESILIX_LOADREPORTS=$(LOADREPORTS) $(GO) test -count=1 -run '^TestLoadReports$$' -v -timeout 15m ./transport/
