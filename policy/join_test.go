package policy

import (
	"reflect"
	"testing"
)

// TestJoinObserversCoversEveryFunc sets every func field of two observers
// by reflection and checks that the joined observer calls both: a field
// added to Observer and forgotten in JoinObservers fails here.
func TestJoinObserversCoversEveryFunc(t *testing.T) {
	calls := map[string]int{}
	mk := func() *Observer {
		o := &Observer{}
		v := reflect.ValueOf(o).Elem()
		for i := range v.NumField() {
			name := v.Type().Field(i).Name
			ft := v.Field(i).Type()
			v.Field(i).Set(reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
				calls[name]++
				return nil
			}))
		}
		return o
	}
	j := reflect.ValueOf(JoinObservers(mk(), nil, mk())).Elem()
	for i := range j.NumField() {
		name := j.Type().Field(i).Name
		f := j.Field(i)
		if f.IsNil() {
			t.Errorf("JoinObservers drops %s", name)
			continue
		}
		f.Call([]reflect.Value{reflect.Zero(f.Type().In(0))})
		if calls[name] != 2 {
			t.Errorf("%s called %d times, want 2", name, calls[name])
		}
	}
}

func TestJoinObserversKeepsNilCheap(t *testing.T) {
	if JoinObservers() != nil || JoinObservers(nil, nil) != nil {
		t.Error("no observers should join to nil")
	}
	one := &Observer{CallDone: func(CallInfo) {}}
	if JoinObservers(nil, one) != one {
		t.Error("a single observer should be returned as is")
	}
	j := JoinObservers(one, &Observer{AttemptDone: func(AttemptInfo) {}})
	if j.Refused != nil || j.CallDone == nil || j.AttemptDone == nil {
		t.Error("a func no observer sets must stay nil")
	}
}
