package redisrate_test

import (
	"log"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/redisrate"
	"github.com/resilix/resilix/transport"
)

// Three replicas share an API's quota of 200 requests a second. Each falls
// back to its third of it while Redis is down (FailOpen); without
// FailOpen, calls would be refused until Redis is back.
func Example() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "redis:6379",
		ContextTimeoutEnabled: true, // required: an ask must stop at RateLimit.StoreTimeout
		MaxRetries:            -1,   // the rate limit retries Redis with a backoff of its own
	})
	defer client.Close()
	quota, err := redisrate.New(client, redisrate.Limit{Rate: 200, Prefix: "billing:quota:"})
	if err != nil {
		log.Fatal(err)
	}
	rt, err := transport.New(transport.Config{
		PerKey: map[string]policy.Set{
			"api.partner.example": {RateLimit: &policy.RateLimit{
				PerSecond: 200.0 / 3,
				Shared:    quota,
				FailOpen:  true,
			}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	partner := &http.Client{Transport: rt}
	_ = partner // calls to api.partner.example now keep to the fleet's quota
}
