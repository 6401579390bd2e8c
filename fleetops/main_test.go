package fleetops

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain is also a client process of the harness: started with
// FLEETOPS_ROLE set (see fleet.startClient), it makes its calls, writes
// its records and exits, running no test.
func TestMain(m *testing.M) {
	if os.Getenv("FLEETOPS_ROLE") != "" {
		env, err := clientEnvFrom()
		if err == nil {
			err = runClient(env)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetops client:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
