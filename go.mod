module github.com/resilix/resilix

go 1.25.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/hashicorp/go-cleanhttp v0.5.2
	go.uber.org/goleak v1.3.0
)
