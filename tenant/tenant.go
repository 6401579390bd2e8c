// Package tenant carries the identity of the tenant a request is made for,
// so that when a gate must shed among requests of equal priority it can shed
// the tenant furthest above its fair share first.
//
// resilix sets no per-tenant quotas: a quota needs a number nobody knows and
// wastes capacity while tenants are idle. Fairness is relative to the recent
// admissions of the tenants that are active: a [Tracker] follows them in
// fixed memory (a Space-Saving heavy-hitter summary) and says how far a
// tenant is above its fair share, the window's admissions divided by the
// active tenants.
package tenant

import "context"

type key struct{}

// With returns a copy of ctx that carries the tenant id. A tenant in the
// context wins over one in a request header.
func With(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, key{}, id)
}

// From returns the tenant id carried by ctx, and whether there was one.
func From(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(key{}).(string)
	return id, ok
}
