package tenant_test

import (
	"fmt"
	"time"

	"github.com/resilix/resilix/tenant"
)

// Three tenants share a dependency; acme makes most of the calls. With 100
// admissions among three active tenants the fair share is 33⅓: acme, at 80,
// is 1.4 fair shares above it, the others below.
func ExampleTracker() {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tr := tenant.NewTracker(0, time.Minute, now)
	for i := range 100 {
		switch {
		case i%10 < 8:
			tr.Add(now, "acme")
		case i%10 == 8:
			tr.Add(now, "globex")
		default:
			tr.Add(now, "initech")
		}
	}
	fmt.Println("active:", tr.Active(now))
	for _, id := range []string{"acme", "globex", "initech", "unknown"} {
		fmt.Printf("%-8s %+.2f\n", id, tr.Excess(now, id))
	}
	// Output:
	// active: 3
	// acme     +1.40
	// globex   -0.70
	// initech  -0.70
	// unknown  -1.00
}
