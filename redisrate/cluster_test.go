//go:build unix

package redisrate

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// clusterNodeTimeout is the cluster-node-timeout of the test clusters: a
// node that does not answer for this long is failed over, in about twice
// that in all.
const clusterNodeTimeout = time.Second

// clusterCreateTime bounds one redis-cli --cluster create (see
// startCluster).
const clusterCreateTime = 30 * time.Second

// create starts six servers with cluster-enabled, in place of c's nodes,
// and joins them with redis-cli --cluster create, returning its output.
func (c *redisCluster) create() ([]byte, error) {
	t := c.t
	t.Helper()
	c.nodes, c.admin = nil, map[string]*redis.Client{}
	addrs := make([]string, 6)
	for i := range addrs {
		s := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", fmt.Sprint(clusterNodeTimeout.Milliseconds()),
			"--repl-diskless-sync-delay", "0") // a replica in sync at once, not 5s later
		c.nodes = append(c.nodes, s)
		addrs[i] = s.addr
		c.admin[s.addr] = newClient(t, s.addr)
	}
	ctx, cancel := context.WithTimeout(t.Context(), clusterCreateTime)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	out, err := exec.CommandContext(ctx, "redis-cli", append(args, "--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput()
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return out, err
}

// redisCluster is a Redis Cluster of six redis-servers on loopback, three
// masters with a replica each, that a test starts and that is killed when
// the test ends. Its methods are for the test's goroutine.
type redisCluster struct {
	t     testing.TB
	nodes []*redisServer
	admin map[string]*redis.Client // a client of each node, by address
}

// startCluster starts six servers with cluster-enabled and joins them with
// redis-cli --cluster create, and returns once every node says the cluster
// is ok and every replica is in sync with its master. A create that does
// not end within clusterCreateTime (redis-cli waiting for the nodes to
// join, on a machine whose CPUs are taken) is tried once more, on six new
// servers.
func startCluster(t testing.TB) *redisCluster {
	t.Helper()
	need(t, "redis-cli")
	c := &redisCluster{t: t}
	for try := 1; ; try++ {
		out, err := c.create()
		if err == nil {
			break
		}
		if try == 2 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
		}
		t.Logf("redis-cli --cluster create did not end within %v, trying six new servers: %s", clusterCreateTime, out)
		for _, s := range c.nodes {
			s.kill()
		}
	}
	ctx := t.Context()
	c.await("the cluster to come up", time.Minute, func() error {
		for _, s := range c.nodes {
			if err := c.clusterOK(s.addr); err != nil {
				return err
			}
			info, err := c.admin[s.addr].Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if strings.Contains(info, "role:slave") && !strings.Contains(info, "master_link_status:up") {
				return fmt.Errorf("replica %s not in sync yet", s.addr)
			}
		}
		return nil
	})
	return c
}

// await polls done every 20ms until it returns nil, for at most limit, and
// returns how long that took.
func (c *redisCluster) await(what string, limit time.Duration, done func() error) time.Duration {
	c.t.Helper()
	start := time.Now()
	for {
		err := done()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			c.t.Fatalf("waited %v for %s: %v", limit, what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clusterOK says why the node at addr does not see the cluster as ok, if
// it does not.
func (c *redisCluster) clusterOK(addr string) error {
	ctx, cancel := context.WithTimeout(c.t.Context(), time.Second)
	defer cancel()
	info, err := c.admin[addr].ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:6") {
		return fmt.Errorf("%s: %q", addr, strings.Fields(info)[:3])
	}
	return nil
}

// addrs is the address of every node.
func (c *redisCluster) addrs() []string {
	var a []string
	for _, s := range c.nodes {
		a = append(a, s.addr)
	}
	return a
}

// node is the server at addr.
func (c *redisCluster) node(addr string) *redisServer {
	for _, s := range c.nodes {
		if s.addr == addr {
			return s
		}
	}
	c.t.Fatalf("no node at %s", addr)
	return nil
}

// master returns the address of the master that the node at from says
// owns the slot of key.
func (c *redisCluster) master(from, key string) (string, error) {
	ctx, cancel := context.WithTimeout(c.t.Context(), time.Second)
	defer cancel()
	slot, err := c.admin[from].ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return "", err
	}
	// CLUSTER SLOTS names the slot's master first, which is the question;
	// Redis 7 still serves it beside CLUSTER SHARDS.
	//lint:ignore SA1019 CLUSTER SLOTS answers exactly who owns a slot
	slots, err := c.admin[from].ClusterSlots(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, r := range slots {
		if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr, nil
		}
	}
	return "", fmt.Errorf("%s: no master owns slot %d", from, slot)
}

// hostsOn returns n hosts whose keys under DefaultPrefix the master at
// addr owns.
func (c *redisCluster) hostsOn(addr string, n int) []string {
	c.t.Helper()
	var hosts []string
	for i := 0; len(hosts) < n; i++ {
		if i > 1000 {
			c.t.Fatalf("no %d hosts of 1000 on %s", n, addr)
		}
		h := fmt.Sprintf("api-%d.test", i)
		m, err := c.master(addr, DefaultPrefix+h)
		if err != nil {
			c.t.Fatal(err)
		}
		if m == addr {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// masters returns the address of every master, the first node's view.
func (c *redisCluster) masters() []string {
	c.t.Helper()
	//lint:ignore SA1019 CLUSTER SLOTS answers exactly who owns a slot
	slots, err := c.admin[c.nodes[0].addr].ClusterSlots(c.t.Context()).Result()
	if err != nil {
		c.t.Fatal(err)
	}
	var m []string
	for _, r := range slots {
		m = append(m, r.Nodes[0].Addr)
	}
	return m
}

// newClusterClient returns a client of the cluster as the package doc
// recommends it, closed when the test ends, with its map of the slots
// loaded and a connection to each master and the script on it, so that
// the first asks are not slower than StoreTimeout on a busy machine.
func newClusterClient(t testing.TB, addrs []string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: addrs, ContextTimeoutEnabled: true, MaxRetries: -1, ReadTimeout: 500 * time.Millisecond,
	})
	t.Cleanup(func() { c.Close() })
	err := c.ForEachMaster(t.Context(), func(ctx context.Context, m *redis.Client) error {
		return gcra.Load(ctx, m).Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// getOn calls host through rt, as roundTrip does api.test.
func getOn(rt *transport.Transport, host string) (admitted, rateLimited bool, err error) {
	return roundTripURL(rt, "http://"+host+"/")
}

// TestClusterSharesLimits: three transports, each with its own
// ClusterClient, share a limit of 200 a second on three keys that three
// masters own, for 3 seconds, each transport offering about 330 calls a
// second on each key. While they run, each key is on its own master.
// Each key gets no more than its limit allows: 600, plus its burst of 20
// and a lease per transport; with timing() (make redis), at least 90% of
// the 600.
func TestClusterSharesLimits(t *testing.T) {
	c := startCluster(t)
	const transports, rate, burst, duration = 3, 200, 20, 3 * time.Second
	var hosts []string
	masters := c.masters()
	for _, m := range masters {
		hosts = append(hosts, c.hostsOn(m, 1)[0])
	}
	t.Logf("keys %q on masters %q", hosts, masters)

	perSecond := float64(rate) / transports
	lease := policy.RateLimit{PerSecond: perSecond, Shared: nopStore{}}.WithDefaults().Lease
	admitted := make([]map[string]int, transports)
	stores := make([]*countingStore, transports)
	start := time.Now().Add(200 * time.Millisecond)
	var wg sync.WaitGroup
	for i := range transports {
		stores[i] = &countingStore{SharedLimiter: mustNew(t, newClusterClient(t, c.addrs()), Limit{Rate: rate, Burst: burst})}
		tr, err := transport.New(transport.Config{Base: okBase{}, Policies: policy.Set{
			RateLimit: &policy.RateLimit{PerSecond: perSecond, Shared: stores[i]},
		}})
		if err != nil {
			t.Fatal(err)
		}
		admitted[i] = map[string]int{}
		wg.Go(func() {
			time.Sleep(time.Until(start))
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for n := 0; time.Since(start) < duration; n++ {
				h := hosts[n%len(hosts)]
				ok, limited, err := getOn(tr, h)
				if ok {
					admitted[i][h]++
				} else if !limited {
					t.Errorf("transport %d, %s: %v", i, h, err)
					return
				}
				<-tick.C
			}
		})
	}
	// While they run, each key is where the slots say: on its own
	// master. (A key lives while its bucket is not full, so a busy
	// machine that holds the transports back may let it expire a while.)
	time.Sleep(time.Until(start))
	for i, h := range hosts {
		c.await(DefaultPrefix+h+" on "+masters[i], time.Until(start.Add(duration)), func() error {
			n, err := c.admin[masters[i]].Exists(t.Context(), DefaultPrefix+h).Result()
			if err != nil || n != 1 {
				return fmt.Errorf("EXISTS = %d, %v", n, err)
			}
			return nil
		})
	}
	wg.Wait()
	time.Sleep(2 * policy.DefaultStoreTimeout) // the last asks answer

	want := rate * int(duration/time.Second)
	for _, h := range hosts {
		total, each := 0, make([]int, transports)
		for i := range transports {
			each[i] = admitted[i][h]
			total += each[i]
		}
		hi := want + burst + transports*lease
		t.Logf("%s: %d admitted (%v by transport), want %d to %d", h, total, each, want*9/10, hi)
		if total > hi || timing() && total < want*9/10 {
			t.Errorf("%s: %d admitted in %v at %d/s, want %d to %d (burst %d, a lease of %d per transport)",
				h, total, duration, rate, want*9/10, hi, burst, lease)
		}
	}
	for i, s := range stores {
		t.Logf("transport %d: %d store round trips", i, len(s.all()))
	}
}

// TestClusterMasterFails calls through two transports, each with its own
// ClusterClient, one with FailOpen and one failing closed, on two keys of
// one master, each with a shared limit of 100 a second and offering 1000
// calls a second, while that master is killed (SIGKILL) or hangs
// (SIGSTOP) until its replica has taken over, as CLUSTER SLOTS and
// CLUSTER INFO of another master say. As with one Redis (TestFailover):
// the first ask after the failure fails, no call waits for the whole
// failover, FailOpen calls go on under the local limit, and failing closed
// none is let through; each client then finds the new master by itself,
// and the clients leave no goroutine behind. With timing() (make redis):
// the first ask fails within StoreTimeout, no call waits longer, the
// rates are within 20% of the limits (the local one, 300 a second, while
// the master is down), and the shared limit is back within 2.5s of the
// failover.
func TestClusterMasterFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		hang bool
	}{{"killed", false}, {"hung", true}} {
		t.Run(tc.name, func(t *testing.T) { testClusterMasterFails(t, tc.hang) })
	}
}

// clusterDriver is one transport of testClusterMasterFails and what it saw.
type clusterDriver struct {
	failOpen bool
	host     string
	client   *redis.ClusterClient
	store    *countingStore
	tr       *transport.Transport

	mu    sync.Mutex
	moves []move
	calls []call // the driving goroutine's until it is done
}

func testClusterMasterFails(t *testing.T, hang bool) {
	const shared, local, timeout = 100, 300, policy.DefaultStoreTimeout
	c := startCluster(t)
	victim := c.masters()[0]
	var witness string // a master that stays up
	for _, m := range c.masters() {
		if m != victim {
			witness = m
			break
		}
	}
	hosts := c.hostsOn(victim, 2)
	goroutines := runtime.NumGoroutine()

	var drivers []*clusterDriver
	for i, failOpen := range []bool{true, false} {
		d := &clusterDriver{failOpen: failOpen, host: hosts[i], client: newClusterClient(t, c.addrs())}
		d.store = &countingStore{SharedLimiter: mustNew(t, d.client, Limit{Rate: shared, Burst: 10})}
		var err error
		d.tr, err = transport.New(transport.Config{
			Base: okBase{},
			Policies: policy.Set{RateLimit: &policy.RateLimit{
				PerSecond: local, Burst: local / 10, Shared: d.store, Lease: 10, FailOpen: failOpen,
			}},
			Observer: &policy.Observer{StoreTransition: func(e policy.StoreTransition) {
				d.mu.Lock()
				d.moves = append(d.moves, move{time.Now(), e.From, e.To, e.Err})
				d.mu.Unlock()
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		drivers = append(drivers, d)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, d := range drivers {
		wg.Go(func() {
			d.calls = drive(t, stop, func() (bool, bool, error) { return getOn(d.tr, d.host) })
		})
	}

	start := time.Now()
	time.Sleep(time.Second)
	failed := time.Now()
	if hang {
		s := c.node(victim)
		s.freeze()
		t.Cleanup(s.thaw) // before the kill, which the cleanups do last
	} else {
		c.node(victim).kill()
	}
	took := c.await("the failover", time.Minute, func() error {
		m, err := c.master(witness, DefaultPrefix+hosts[0])
		if err != nil {
			return err
		}
		if m == victim {
			return fmt.Errorf("%s still owns the slot", victim)
		}
		return c.clusterOK(witness)
	})
	over := time.Now()
	t.Logf("the replica took over %v after the failure", took.Round(time.Millisecond))
	// Each client finds the new master by itself: wait until each has
	// heard its store come back, and then for the 3.5s the timing
	// checks look at.
	c.await("the stores back after the failover", time.Minute, func() error {
		for _, d := range drivers {
			if !d.back(failed) {
				return fmt.Errorf("the store of %s not back yet", d.host)
			}
		}
		return nil
	})
	time.Sleep(time.Until(over.Add(3500 * time.Millisecond)))
	close(stop)
	wg.Wait()
	time.Sleep(2 * timeout) // the last asks answer

	for _, d := range drivers {
		d.mu.Lock()
		d.check(t, start, failed, over, shared, local, timeout)
		d.mu.Unlock()
		d.client.Close()
	}

	// The clients closed, their goroutines end.
	var now int
	c.await("the clients' goroutines to end", 5*time.Second, func() error {
		if now = runtime.NumGoroutine(); now > goroutines {
			return fmt.Errorf("%d goroutines, %d before the clients", now, goroutines)
		}
		return nil
	})
	t.Logf("%d goroutines before the clients, %d after", goroutines, now)
}

// back reports whether d's store has been up again since t.
func (d *clusterDriver) back(t time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.ContainsFunc(d.moves, func(m move) bool { return m.to == policy.StoreUp && m.at.After(t) })
}

// check is testFailover's, for one driver of testClusterMasterFails.
func (d *clusterDriver) check(t *testing.T, start, failed, over time.Time, shared, local float64, timeout time.Duration) {
	t.Helper()
	name := "failing closed"
	failing := policy.StoreRefusing
	if d.failOpen {
		name, failing = "FailOpen", policy.StoreFallback
	}
	down, up, err := outage(d.moves, failed, failing)
	if err != nil {
		var errs []string
		for _, a := range d.store.all() {
			if a.err != nil && !slices.Contains(errs, a.err.Error()) {
				errs = append(errs, a.err.Error())
			}
		}
		t.Errorf("%s: %v; the store's errors: %q", name, err, errs)
		return
	}

	asks := d.store.all()
	i := 0
	for i < len(asks) && !asks[i].start.After(failed) {
		i++
	}
	if i == len(asks) {
		t.Errorf("%s: no ask after the failure", name)
		return
	}
	first := asks[i]
	took := first.end.Sub(first.start)
	var errs []string
	for _, a := range asks[i:] {
		if a.err != nil && !slices.Contains(errs, a.err.Error()) {
			errs = append(errs, a.err.Error())
		}
	}
	t.Logf("%s: first ask %v after the failure failed after %v; the observer heard it %v after; %d transitions; errors %q",
		name, first.start.Sub(failed).Round(time.Millisecond), took.Round(time.Millisecond),
		down.at.Sub(failed).Round(time.Millisecond), len(d.moves), errs)
	if first.err == nil || took > bound(timeout) {
		t.Errorf("%s: first ask after the failure: %v after %v, want an error within %v", name, first.err, took, bound(timeout))
	}

	var longest time.Duration
	for _, c := range d.calls {
		longest = max(longest, c.took)
	}
	if longest > bound(timeout) {
		t.Errorf("%s: a call took %v, want at most %v (StoreTimeout is %v)", name, longest, bound(timeout), timeout)
	}

	rate := func(from, to time.Time) (float64, int) { return admittedRate(d.calls, from, to) }
	settle := 200 * time.Millisecond
	before, _ := rate(start.Add(settle), failed)
	during, inDown := rate(down.at.Add(settle), minTime(over, up.at))
	after, inAfter := rate(up.at.Add(settle), d.calls[len(d.calls)-1].at)
	t.Logf("%s: %d calls, longest %v; admitted a second: %.0f before, %.0f while the master was down (%d calls), %.0f after; back %v after the failover",
		name, len(d.calls), longest.Round(time.Microsecond), before, during, inDown, after, up.at.Sub(over).Round(time.Millisecond))
	within := func(what string, got, want float64) {
		if timing() && (got < 0.8*want || got > 1.2*want) {
			t.Errorf("%s, %s: %.0f admitted a second, want %v ± 20%%", name, what, got, want)
		}
	}
	within("before", before, shared)
	if d.failOpen {
		within("master down", during, local)
		if inDown == 0 {
			t.Errorf("%s, master down: no call admitted", name)
		}
	} else if inDown > 0 {
		t.Errorf("%s, master down: %d calls admitted, want none", name, inDown)
	}
	if inAfter == 0 {
		t.Errorf("%s: no call admitted after the store was back", name)
	}
	// The asks fail a backoff apart (up to 500ms, jittered), each failed
	// one reloads the map of the slots, within the client's ReadTimeout
	// (500ms) when a node hangs, and an ask after a map of the new master
	// finds it: two backoffs and a reload at most.
	if back := up.at.Sub(over); timing() && back > 2500*time.Millisecond {
		t.Errorf("%s: the shared limit was back %v after the failover, want within 2.5s", name, back)
		return
	}
	within("after", after, shared)
}
