// Package redisrate keeps a rate limit that a whole fleet shares in
// Redis: a policy.SharedLimiter for policy.RateLimit.Shared, so that the
// processes calling an API with a quota (N requests a second across all
// replicas) keep to it together.
//
//	client := redis.NewClient(&redis.Options{
//		Addr:                  "redis:6379",
//		ContextTimeoutEnabled: true, // required: see New
//		MaxRetries:            -1,   // the rate limit retries on its own schedule
//	})
//	quota, err := redisrate.New(client, redisrate.Limit{Rate: 200}) // 200 a second, fleet-wide
//	...
//	rt, err := transport.New(transport.Config{Policies: policy.Set{
//		RateLimit: &policy.RateLimit{PerSecond: 200.0 / 3, Shared: quota}, // 3 replicas
//	}})
//
// The transport asks Redis for tokens in leases, a few times a second per
// busy process, never once per call; policy.RateLimit says how, and what
// calls get when Redis fails. It is its own module so that resilix's other
// users never download a Redis client.
//
// # The algorithm
//
// Each key is one GCRA bucket (the generic cell rate algorithm of ATM
// networks, ITU-T I.371; https://brandur.org/rate-limiting explains it for
// web APIs): Redis keeps one number per key, the time at which the bucket
// will be full again, and a Lua script reads and moves it atomically. It
// is a token bucket of Burst tokens that fills at Rate per Period and
// starts full. Time is the Redis server's (its TIME command), so the
// fleet's clocks do not have to agree. An ask for n tokens grants what the
// bucket holds up to n, in whole tokens, and says how long until the rest
// would be there. A key lives only until its bucket would be full again.
//
// # Why a script of its own
//
// github.com/go-redis/redis_rate/v10 runs the same algorithm, and is small
// and correct for one token at a time. A lease needs "up to n", its
// AllowAtMost, and that charges the bucket for the fractional tokens it
// had (say 3.7) while granting their integer part (3): each partial grant
// loses up to a token. Under contention many grants are partial: four
// goroutines asking for 7 to 13 tokens of a limit of 2000 a second for
// half a second on a local Redis 7.0 get from it 6% to 12% fewer tokens
// than the server's clock made, and every token from this package's
// script (TestTakeIsExact checks it; TestPeerGrants prints the two side
// by side, as README.md says). Its key prefix is
// also fixed ("rate:"), a partial grant comes with no retry-after, and
// its last release is from 2023. The script here is thirty lines; the
// client is github.com/redis/go-redis/v9, which Redis maintains.
//
// # Redis
//
// Redis 5.0 or later (a script that reads the clock before it writes needs
// the effects replication that 5.0 made the default; the tests run 7.0),
// standalone, behind a Ring, or a Redis Cluster, through
// redis.UniversalClient: a call touches one key. Keys are Limit.Prefix
// followed by the transport's key for the upstream, "resilix:rate:" and
// "api.example.com" by default; Redis Cluster spreads the keys over its
// slots. Nothing needs persisting: a Redis that restarts empty starts every
// bucket full, which is what a limit that is not persisted can do. A reply
// lost on the way back (a dropped connection) loses the tokens it granted,
// which errs on the side of the quota. A replica promoted by failover may
// not have the last moves of the buckets, and may let one more burst
// through.
//
// # Redis Cluster
//
// Each ask is one script call on one key, so it runs on the master of the
// key's slot, and the keys of different upstreams spread over the masters
// (a Prefix with a hash tag, "{quota}:", would put them all on one). When
// a master fails, the limits of its keys are failing until its replica has
// taken over, about twice cluster-node-timeout, and the client knows it:
// after an ask fails otherwise than by a node's answer, Take has a
// *redis.ClusterClient reload its map of the slots, which go-redis would
// otherwise do only once a minute. That reload has no deadline but the
// client's ReadTimeout, and a hung master can hold it that long, so give
// the client a short one, a few hundred milliseconds:
//
//	client := redis.NewClusterClient(&redis.ClusterOptions{
//		Addrs:                 []string{"redis-0:6379", "redis-1:6379", "redis-2:6379"},
//		ContextTimeoutEnabled: true,
//		MaxRetries:            -1,
//		ReadTimeout:           500 * time.Millisecond, // bounds the reload of the slots
//	})
//
// With cluster-require-full-coverage, Redis's default, the other masters
// refuse every key from when the failed master is marked failed until its
// replica is promoted, so the other keys' limits fail for that moment too.
package redisrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/resilix/resilix/policy"
)

// DefaultPrefix is the Prefix used when Limit.Prefix is empty.
const DefaultPrefix = "resilix:rate:"

// Limit is a rate that every process asking for the same key shares, and
// where in Redis it is kept.
type Limit struct {
	// Rate is how many tokens the bucket gains per Period. Required: it
	// must be > 0, and at most one per microsecond.
	Rate int

	// Period is the time Rate is counted over. If zero, one second is
	// used.
	Period time.Duration

	// Burst is the most tokens the bucket holds, and so the most one ask
	// is granted: give it at least the RateLimit.Lease of the processes
	// sharing it, or each ask is cut to Burst and the processes ask more
	// often. If zero, max(1, ceil(Rate/10)) is used: a tenth of a Period's
	// tokens at once, as policy.RateLimit's own Burst.
	Burst int

	// Prefix starts the name of every key the limit keeps in Redis. If
	// empty, DefaultPrefix is used.
	Prefix string
}

// Limiter is a Limit kept in Redis, for policy.RateLimit.Shared. Build one
// with New. It holds no state of its own besides its configuration: every
// process, and every Limiter, that uses the same client database, prefix
// and key shares one bucket, and should use the same Rate, Period and
// Burst. It is safe for concurrent use.
type Limiter struct {
	client   redis.UniversalClient
	prefix   string
	interval float64 // microseconds per token
	burst    int
}

var _ policy.SharedLimiter = (*Limiter)(nil)

// New returns the Limiter of limit on client. It reports every bad field
// of limit, one per line, naming it.
//
// client must stop a command at its context's deadline, or an ask would
// outlive policy.RateLimit.StoreTimeout when Redis hangs: go-redis does
// only when built with ContextTimeoutEnabled, and New refuses a
// *redis.Client, *redis.ClusterClient or *redis.Ring without it.
// MaxRetries: -1 is recommended too: go-redis's own retries only spend the
// StoreTimeout of the ask, and the rate limit retries with a backoff of
// its own. For a *redis.ClusterClient, a short ReadTimeout too: see "Redis
// Cluster" above.
func New(client redis.UniversalClient, limit Limit) (*Limiter, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("redisrate: "+format, args...)) }
	switch {
	case client == nil:
		bad("nil client")
	case !contextTimeouts(client):
		bad("the client's ContextTimeoutEnabled is false, so a command would outlive RateLimit.StoreTimeout, up to the client's ReadTimeout, when Redis hangs; set it")
	}
	if limit.Rate <= 0 {
		bad("Limit.Rate must be > 0, got %d", limit.Rate)
	}
	if limit.Period < 0 {
		bad("Limit.Period must be >= 0, got %v", limit.Period)
	}
	if limit.Burst < 0 {
		bad("Limit.Burst must be >= 0, got %d", limit.Burst)
	}
	period := limit.Period
	if period == 0 {
		period = time.Second
	}
	interval := float64(period) / float64(time.Microsecond) / float64(limit.Rate)
	if limit.Rate > 0 && period > 0 && interval < 1 {
		bad("Limit.Rate per Limit.Period must be at most one token a microsecond, got %d per %v", limit.Rate, period)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	l := &Limiter{client: client, prefix: limit.Prefix, interval: interval, burst: limit.Burst}
	if l.prefix == "" {
		l.prefix = DefaultPrefix
	}
	if l.burst == 0 {
		l.burst = max(1, int(math.Ceil(float64(limit.Rate)/10)))
	}
	return l, nil
}

// contextTimeouts reports whether client stops a command at its context's
// deadline, when its type says.
func contextTimeouts(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// Take asks the bucket of key for n tokens, n >= 1, in one round trip to
// Redis, and returns how many it granted. An ask for more than Burst is an
// ask for Burst. When it grants fewer, retryAfter is how long until the
// bucket would hold the rest, if nobody else took them. An error is
// Redis's, or the context's: then nothing was granted, as far as this
// process knows.
func (l *Limiter) Take(ctx context.Context, key string, n int) (granted int, retryAfter time.Duration, err error) {
	if n < 1 {
		return 0, 0, fmt.Errorf("redisrate: Take of %d tokens, want at least 1", n)
	}
	n = min(n, l.burst)
	r, err := gcra.Run(ctx, l.client, []string{l.prefix + key}, l.interval, l.burst, n).Int64Slice()
	if err != nil {
		l.reload(err)
		return 0, 0, err
	}
	if len(r) != 2 || r[0] < 0 || r[0] > int64(n) || r[1] < 0 {
		return 0, 0, fmt.Errorf("redisrate: the script answered %v to an ask for %d", r, n)
	}
	return int(r[0]), time.Duration(r[1]) * time.Microsecond, nil
}

// reload has a cluster client reload its map of the slots, in the
// background, after err, unless err is a node's answer. go-redis reloads
// it by itself only on a MOVED or READONLY answer, or once a
// ClusterStateReloadInterval (a minute by default): without this, a
// master killed or hung would be asked for a key's tokens for up to that
// minute after its replica took over, with the limit failing all along
// (TestClusterMasterFails). go-redis runs one reload at a time, at most
// every 200ms, with no deadline but the client's ReadTimeout.
func (l *Limiter) reload(err error) {
	c, ok := l.client.(interface{ ReloadState(context.Context) })
	if !ok {
		return
	}
	if reply := redis.Error(nil); errors.As(err, &reply) {
		return
	}
	c.ReloadState(context.Background())
}

// gcra is the bucket's move: KEYS[1] holds the time, in microseconds of
// the server's clock, at which the bucket will be full again (absent: it
// is full). ARGV is the microseconds per token (a float), the burst and
// the tokens asked for, at most the burst. It returns the tokens granted
// and, when fewer than asked, the microseconds until the rest would be
// there. Times stay exact in a double: 2^53 microseconds is 285 years.
var gcra = redis.NewScript(`
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[3])

local full = tonumber(redis.call('GET', KEYS[1]) or 0)
if full < now then
	full = now
end
-- Each token held is one interval between now and full.
local held = math.floor(burst - (full - now) / interval)
local granted = math.max(0, math.min(n, held))
if granted > 0 then
	full = full + granted * interval
	redis.call('SET', KEYS[1], full, 'PX', math.ceil((full - now) / 1000))
end
local retry = 0
if granted < n then
	-- The rest, n - granted, is held once full - now is down to
	-- (burst - (n - granted)) intervals.
	retry = math.ceil(full - (burst - (n - granted)) * interval - now)
end
return {granted, retry}
`)
