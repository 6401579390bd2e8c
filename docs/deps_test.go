package docs

// The packages outside the standard library that snippets may use (see
// packages in snippets_test.go), imported here so that they are in this
// module's build list and go mod tidy keeps them.
import (
	_ "github.com/hashicorp/go-cleanhttp"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/resilix/resilix/admission"
	_ "github.com/resilix/resilix/attempt"
	_ "github.com/resilix/resilix/estimator"
	_ "github.com/resilix/resilix/httptestutil"
	_ "github.com/resilix/resilix/otelmetrics"
	_ "github.com/resilix/resilix/oteltrace"
	_ "github.com/resilix/resilix/policy"
	_ "github.com/resilix/resilix/redisrate"
	_ "github.com/resilix/resilix/shedding"
	_ "github.com/resilix/resilix/slogobserver"
	_ "github.com/resilix/resilix/tenant"
	_ "github.com/resilix/resilix/transport"
	_ "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	_ "go.opentelemetry.io/otel/metric"
	_ "go.opentelemetry.io/otel/sdk/metric"
	_ "go.opentelemetry.io/otel/trace"
)
