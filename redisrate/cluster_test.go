//go:build unix

package redisrate

import (
	"context"
	"fmt"
	"os/exec"
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
// is ok and every replica is in sync with its master.
func startCluster(t testing.TB) *redisCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("these tests run a real Redis Cluster: put redis-cli in PATH (Debian: apt-get install redis-server): %v", err)
	}
	c := &redisCluster{t: t, admin: map[string]*redis.Client{}}
	addrs := make([]string, 6)
	for i := range addrs {
		s := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", fmt.Sprint(clusterNodeTimeout.Milliseconds()))
		c.nodes = append(c.nodes, s)
		addrs[i] = s.addr
		c.admin[s.addr] = newClient(t, s.addr)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	out, err := exec.CommandContext(ctx, "redis-cli", append(args, "--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.await("the cluster to come up", 15*time.Second, func() error {
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
// recommends it, closed when the test ends.
func newClusterClient(t testing.TB, addrs []string) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// getOn calls host through rt, as roundTrip does api.test.
func getOn(rt *transport.Transport, host string) (admitted, rateLimited bool, err error) {
	return roundTripURL(rt, "http://"+host+"/")
}

// TestClusterSharesLimits: three transports, each with its own
// ClusterClient, share a limit of 200 a second on three keys that three
// masters own, for 3 seconds, each transport offering about 330 calls a
// second on each key. Each key gets what its limit allows: 600, plus its
// burst of 20 and a lease per transport, at most, and at least 90% of the
// 600.
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
	// Midway, each key is where the slots say: on its own master.
	time.Sleep(time.Until(start.Add(duration / 2)))
	for i, h := range hosts {
		n, err := c.admin[masters[i]].Exists(t.Context(), DefaultPrefix+h).Result()
		if err != nil || n != 1 {
			t.Errorf("%s on %s: EXISTS = %d, %v; want it there", DefaultPrefix+h, masters[i], n, err)
		}
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
		if total > hi || total < want*9/10 {
			t.Errorf("%s: %d admitted in %v at %d/s, want %d to %d (burst %d, a lease of %d per transport)",
				h, total, duration, rate, want*9/10, hi, burst, lease)
		}
	}
	for i, s := range stores {
		t.Logf("transport %d: %d store round trips", i, len(s.all()))
	}
}
