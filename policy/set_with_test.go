package policy_test

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// setValue returns a value of field f of Set, set as With reads it, and
// different for each n: a new pointer, a func, a non-zero number or
// struct, true. A field of a kind it does not know fails the test, so a
// field added to Set must be added here, and With must handle it.
func setValue(t *testing.T, f reflect.StructField, n int) reflect.Value {
	t.Helper()
	v := reflect.New(f.Type).Elem()
	switch f.Type.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(f.Type.Elem()))
	case reflect.Int:
		v.SetInt(int64(2 + n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Func:
		v.Set(reflect.ValueOf(policy.Classify(func(*http.Response, error) policy.Outcome {
			return policy.Outcome(n)
		})))
	case reflect.Struct:
		if f.Type.NumField() == 0 || f.Type.Field(0).Type.Kind() != reflect.Float64 {
			t.Fatalf("Set.%s: a struct without a float64 first field; teach setValue its type", f.Name)
		}
		v.Field(0).SetFloat(0.1 * float64(1+n))
	default:
		t.Fatalf("Set.%s: a field of kind %v; teach setValue and With about it", f.Name, f.Type.Kind())
	}
	return v
}

// same reports whether a and b are the same value of a field: the same
// pointer or func, or equal.
func same(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Pointer, reflect.Func:
		return a.Pointer() == b.Pointer()
	}
	return a.Equal(b)
}

// TestWithReplacesEachFieldSet: for every field of Set, a change that sets
// it replaces the base's, and every other field keeps the base's; a change
// that sets nothing keeps the whole base.
func TestWithReplacesEachFieldSet(t *testing.T) {
	typ := reflect.TypeFor[policy.Set]()
	var base policy.Set
	bv := reflect.ValueOf(&base).Elem()
	for i := range typ.NumField() {
		bv.Field(i).Set(setValue(t, typ.Field(i), 0))
	}
	got := reflect.ValueOf(base.With(policy.Set{}))
	for i := range typ.NumField() {
		if !same(got.Field(i), bv.Field(i)) {
			t.Errorf("With(Set{}) changed %s", typ.Field(i).Name)
		}
	}
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type.Kind() == reflect.Bool {
			continue // true either way: TestWithPropagate
		}
		var changes policy.Set
		cv := reflect.ValueOf(&changes).Elem()
		cv.Field(i).Set(setValue(t, f, 1))
		got := reflect.ValueOf(base.With(changes))
		for j := range typ.NumField() {
			want, from := bv.Field(j), "the base's"
			if j == i {
				want, from = cv.Field(j), "the change"
			}
			if !same(got.Field(j), want) {
				t.Errorf("With(Set{%s: ...}).%s is not %s", f.Name, typ.Field(j).Name, from)
			}
		}
	}
}

// TestWithPropagate: true in the change turns Propagate on; false keeps the
// base's, and only an assignment turns it off.
func TestWithPropagate(t *testing.T) {
	for _, tc := range []struct{ base, change, want bool }{
		{false, false, false}, {false, true, true}, {true, false, true}, {true, true, true},
	} {
		got := policy.Set{Propagate: tc.base}.With(policy.Set{Propagate: tc.change}).Propagate
		if got != tc.want {
			t.Errorf("Set{Propagate: %v}.With(Set{Propagate: %v}).Propagate = %v, want %v", tc.base, tc.change, got, tc.want)
		}
	}
}

// TestWithLeavesBothAlone: With changes neither the base nor the changes.
func TestWithLeavesBothAlone(t *testing.T) {
	breaker := &policy.Breaker{FailureRatio: 0.3}
	base := policy.Set{Attempts: 3, Retry: &policy.Retry{}, Breaker: breaker}
	changes := policy.Set{Attempts: 2, RateLimit: &policy.RateLimit{PerSecond: 50}}
	s := base.With(changes)
	s.Breaker = nil
	s.Retry.MaxDelay = time.Second // shared with the base, as documented
	if base.Breaker != breaker || base.Attempts != 3 || base.RateLimit != nil {
		t.Errorf("the base changed: %+v", base)
	}
	if changes.Retry != nil || changes.Breaker != nil || changes.Attempts != 2 {
		t.Errorf("the changes changed: %+v", changes)
	}
}

// TestWithIsValidatedLikeAnySet: a change can make a valid base invalid,
// and Validate names the field.
func TestWithIsValidatedLikeAnySet(t *testing.T) {
	base := policy.Set{Retry: &policy.Retry{}, Breaker: &policy.Breaker{}}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		changes policy.Set
		want    string
	}{
		{policy.Set{Attempts: 1}, "policy: Attempts is 1 but Retry is set"},
		{policy.Set{Breaker: &policy.Breaker{FailureRatio: 2}}, "policy: Breaker.FailureRatio"},
		{policy.Set{RateLimit: &policy.RateLimit{}}, "policy: RateLimit.PerSecond must be > 0"},
	} {
		s := base.With(tc.changes)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("base.With(%+v).Validate() = %v, want an error containing %q", tc.changes, err, tc.want)
		}
	}
}

// A key's set written as the common set plus what differs: the key keeps
// the common Retry and Breaker and adds a rate limit, and another has no
// breaker.
func ExampleSet_With() {
	base := policy.Set{
		Retry:   &policy.Retry{},
		Breaker: &policy.Breaker{},
		Timeout: &policy.Timeout{PerAttempt: 2 * time.Second},
	}
	api := base.With(policy.Set{RateLimit: &policy.RateLimit{PerSecond: 50}})
	batch := base.With(policy.Set{Timeout: &policy.Timeout{PerAttempt: 30 * time.Second}})
	batch.Breaker = nil // With keeps what a change leaves nil: turn it off by assignment

	for _, s := range []policy.Set{api, batch} {
		fmt.Println(s.Retry != nil, s.Breaker != nil, s.RateLimit != nil, s.Timeout.PerAttempt, s.Validate())
	}
	// Output:
	// true true true 2s <nil>
	// true false false 30s <nil>
}
