package httpx

import (
	"net/http"
	"testing"
)

// TestFirstReadsAnySpelling: First finds the header under any spelling,
// the canonical one's first value first, else the first other spelling in
// byte order that has a value; Spells matches other spellings alone.
func TestFirstReadsAnySpelling(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    http.Header
		want string
		ok   bool
	}{
		{"none", http.Header{"X-Other": {"1"}}, "", false},
		{"canonical", http.Header{"Resilix-Tenant": {"a", "b"}}, "a", true},
		{"lower case", http.Header{"resilix-tenant": {"victim"}}, "victim", true},
		{"canonical first", http.Header{"resilix-tenant": {"victim"}, "Resilix-Tenant": {"a"}}, "a", true},
		{"byte order", http.Header{"resilix-tenant": {"c"}, "RESILIX-TENANT": {"b"}, "rESILIX-TENANT": {"d"}}, "b", true},
		{"empty values are none", http.Header{"Resilix-Tenant": {}, "resilix-tenant": {"v"}, "RESILIX-TENANT": nil}, "v", true},
		{"a longer name is another", http.Header{"resilix-tenants": {"x"}}, "", false},
	} {
		v, ok := First(tc.h, TenantHeader)
		if v != tc.want || ok != tc.ok {
			t.Errorf("%s: First = %q, %v; want %q, %v", tc.name, v, ok, tc.want, tc.ok)
		}
		if Has(tc.h, TenantHeader) != tc.ok {
			t.Errorf("%s: Has = %v, want %v", tc.name, !tc.ok, tc.ok)
		}
	}
	if Spells(TenantHeader, TenantHeader) || !Spells("resilix-TENANT", TenantHeader) || Spells("resilix-tenant!", TenantHeader) {
		t.Error("Spells matches the canonical name or misses another spelling")
	}
	h := http.Header{"resilix-tenant": {"v"}, "X-A": {"1"}}
	if n := testing.AllocsPerRun(100, func() { First(h, TenantHeader) }); n != 0 {
		t.Errorf("%v allocations, want none", n)
	}
}
