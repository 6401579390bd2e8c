// Package fleetops holds the fleet-operations harness of policy.Replicas
// (make fleet-ops): real nginx replicas on loopback addresses named by a
// real DNS server (dnsmasq), a net/http client and a resilix client each
// in a process of its own, put through a fleet's daily life (a rolling
// restart, a crash, a frozen replica, scaling out and in, a slow replica,
// the client's own stalls) and checked against targets. Its files are
// tests; TestFleetOps runs only when FLEETOPS is set (see its doc).
package fleetops
