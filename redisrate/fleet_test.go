//go:build unix

package redisrate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// childEnv holds a fleetConfig when the test binary runs as one process
// of a fleet (see TestMain).
const childEnv = "RESILIX_REDISRATE_CHILD"

// fleetConfig is what each process of a fleet is told.
type fleetConfig struct {
	Addr      string        // Redis
	Rate      int           // the shared limit, per second
	PerSecond float64       // the local fallback
	Offered   int           // calls a second this process makes
	Start     time.Time     // when to start, the same for every process
	Duration  time.Duration // how long
}

// fleetResult is what each process reports, as a line of JSON on stdout.
type fleetResult struct {
	Admitted, Refused, Failed int
	Asks                      int           // store round trips
	MaxWait                   time.Duration // the longest call
	Transitions               int
	Leaks                     string // goleak's, at the end
}

// TestFleetSharesOneLimit runs the test binary again as three processes,
// each with its own transport and Redis client, sharing one key of a limit
// of 200 a second for 5 seconds, each offering 1000 calls a second. Between
// them they get no more than the limit allows: 1000, plus 5% and one lease
// per process. With timing() (make redis), which a busy machine's
// scheduler would fail, they get no less either, none is starved (each
// gets at least a quarter of its fair share), and no ask times out.
func TestFleetSharesOneLimit(t *testing.T) {
	s := startRedis(t)
	const procs, rate = 3, 200
	cfg := fleetConfig{
		Addr:      s.addr,
		Rate:      rate,
		PerSecond: float64(rate) / procs,
		Offered:   1000,
		Start:     time.Now().Add(time.Second), // time for the processes to start
		Duration:  5 * time.Second,
	}
	env, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	results := make([]fleetResult, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+string(env))
			dieWithParent(cmd)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Errorf("process %d: %v\n%s", i, err, stderr.String())
				return
			}
			if err := json.Unmarshal(stdout.Bytes(), &results[i]); err != nil {
				t.Errorf("process %d: %v in %q", i, err, stdout.String())
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	want := rate * int(cfg.Duration/time.Second)
	lease := policy.RateLimit{PerSecond: cfg.PerSecond, Shared: nopStore{}}.WithDefaults().Lease
	total := 0
	for i, r := range results {
		total += r.Admitted
		t.Logf("process %d: %d admitted, %d refused, %d store round trips, %d store transitions, longest call %v",
			i, r.Admitted, r.Refused, r.Asks, r.Transitions, r.MaxWait)
		if r.Failed > 0 || r.Leaks != "" || timing() && r.Transitions > 0 {
			t.Errorf("process %d: %d calls failed otherwise than rate limited, %d store transitions, leaks: %s",
				i, r.Failed, r.Transitions, r.Leaks)
		}
		if fair := want / procs; timing() && r.Admitted < fair/4 {
			t.Errorf("process %d starved: %d admitted, want at least a quarter of its fair share %d", i, r.Admitted, fair)
		}
	}
	slack := want/20 + procs*lease
	t.Logf("the fleet: %d admitted in %v at %d/s, want %d ± %d (5%% and a lease of %d per process)",
		total, cfg.Duration, rate, want, slack, lease)
	if total > want+slack || timing() && total < want-slack {
		t.Errorf("the fleet admitted %d, want %d ± %d", total, want, slack)
	}
}

// nopStore stands for a store where only its presence matters.
type nopStore struct{}

func (nopStore) Take(context.Context, string, int) (int, time.Duration, error) { return 0, 0, nil }

// runChild runs this process as one process of TestFleetSharesOneLimit
// when the environment says so (ok), and returns its exit code.
func runChild() (code int, ok bool) {
	env, ok := os.LookupEnv(childEnv)
	if !ok {
		return 0, false
	}
	return fleetChild(env), true
}

// fleetChild is one process of TestFleetSharesOneLimit: it calls through a
// transport of its own from cfg.Start for cfg.Duration, and prints what it
// got. It returns the process's exit code.
func fleetChild(env string) int {
	var cfg fleetConfig
	if err := json.Unmarshal([]byte(env), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	res, err := runFleetChild(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := goleak.Find(); err != nil {
		res.Leaks = err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func runFleetChild(cfg fleetConfig) (fleetResult, error) {
	var res fleetResult
	client := redis.NewClient(&redis.Options{Addr: cfg.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	if err := client.Ping(context.Background()).Err(); err != nil { // a connection ready, no token taken
		return res, err
	}
	lim, err := New(client, Limit{Rate: cfg.Rate})
	if err != nil {
		return res, err
	}
	store := &countingStore{SharedLimiter: lim}
	var mu sync.Mutex
	tr, err := transport.New(transport.Config{
		Base:     okBase{},
		Policies: policy.Set{RateLimit: &policy.RateLimit{PerSecond: cfg.PerSecond, Shared: store}},
		Observer: &policy.Observer{StoreTransition: func(policy.StoreTransition) {
			mu.Lock()
			res.Transitions++
			mu.Unlock()
		}},
	})
	if err != nil {
		return res, err
	}
	time.Sleep(time.Until(cfg.Start))
	end := cfg.Start.Add(cfg.Duration)
	tick := time.NewTicker(time.Second / time.Duration(cfg.Offered))
	defer tick.Stop()
	for time.Now().Before(end) {
		start := time.Now()
		ok, limited, err := roundTrip(tr)
		res.MaxWait = max(res.MaxWait, time.Since(start))
		switch {
		case ok:
			res.Admitted++
		case limited:
			res.Refused++
		default:
			res.Failed++
			if res.Failed == 1 {
				fmt.Fprintln(os.Stderr, err)
			}
		}
		<-tick.C
	}
	// The ask in flight, if any, answers within StoreTimeout.
	time.Sleep(2 * policy.DefaultStoreTimeout)
	res.Asks = len(store.all())
	mu.Lock()
	defer mu.Unlock()
	return res, nil
}
