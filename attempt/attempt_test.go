package attempt

import (
	"context"
	"testing"
)

func TestWithFrom(t *testing.T) {
	ctx := context.Background()
	if n, ok := From(ctx); ok || n != 0 || Repeated(ctx) {
		t.Fatalf("empty context: From = %d, %v; Repeated = %v", n, ok, Repeated(ctx))
	}
	for _, tc := range []struct {
		in, want int
		repeated bool
	}{
		{1, 1, false},
		{2, 2, true},
		{7, 7, true},
		{0, 1, false},
		{-3, 1, false},
	} {
		c := With(ctx, tc.in)
		n, ok := From(c)
		if !ok || n != tc.want || Repeated(c) != tc.repeated {
			t.Errorf("With(%d): From = %d, %v; Repeated = %v; want %d, true, %v",
				tc.in, n, ok, Repeated(c), tc.want, tc.repeated)
		}
	}
	// The innermost wins, as context values do.
	if n, _ := From(With(With(ctx, 3), 1)); n != 1 {
		t.Errorf("nested With: From = %d, want 1", n)
	}
}
