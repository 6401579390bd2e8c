package shedding_test

import (
	"fmt"

	"github.com/resilix/resilix/shedding"
)

// A gate must shed 30% of its traffic. Bulk (20% of the traffic) goes
// first, then half of BestEffort (another 10%); Degraded and Critical are
// untouched.
func ExampleSplit() {
	mix := [shedding.NumPriorities]float64{
		shedding.Critical:   50,
		shedding.Degraded:   10,
		shedding.BestEffort: 20,
		shedding.Bulk:       20,
	}
	p := shedding.Split(0.3, mix)
	for b := shedding.Critical; b < shedding.NumPriorities; b++ {
		fmt.Printf("%-11s %.2f\n", b, p[b])
	}
	// Output:
	// critical    0.00
	// degraded    0.00
	// best_effort 0.50
	// bulk        1.00
}
