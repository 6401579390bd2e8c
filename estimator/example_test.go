package estimator_test

import (
	"fmt"
	"time"

	"github.com/resilix/resilix/estimator"
)

func ExampleLatencyWindow() {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	w := estimator.NewLatencyWindow(estimator.LatencyConfig{}, start) // p95 over 30s

	now := start
	for i := range 100 {
		w.Record(now, time.Duration(i+1)*time.Millisecond)
	}
	fmt.Println(w.Threshold(now)) // the p95 is 95ms; the answer is its bucket's upper bound

	fmt.Println(w.Threshold(now.Add(30 * time.Second))) // idle for a whole window
	// Output:
	// 100.663296ms true
	// 0s false
}

func ExampleCounters() {
	const requests, accepts = 0, 1
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	c := estimator.NewCounters(time.Minute, 2, start)

	c.Add(start, requests, 10)
	c.Add(start, accepts, 7)
	c.Add(start.Add(20*time.Second), requests, 5)

	sums := make([]uint64, 2)
	c.Sums(start.Add(30*time.Second), sums)
	fmt.Println(sums)
	c.Sums(start.Add(60*time.Second), sums) // the first 15s slice has left the window
	fmt.Println(sums)
	// Output:
	// [15 7]
	// [5 0]
}
