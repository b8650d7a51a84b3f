// Package grpcapi serves the enforcer over gRPC: Envoy's rate limit service v3
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) so an Envoy, or any RLS
// client, can point at allot unchanged; and allot's own allot.v1.Allot/Check.
//
// # Envoy descriptors
//
// Each descriptor of a RateLimitRequest is one check. Its entries are mapped to request
// attributes by key (KeyMap; the defaults are DefaultKeyMap):
//
//	api_key, x-api-key, apikey          → api key
//	plan                                → plan
//	org, organization, tenant           → org
//	endpoint, route, generic_key        → endpoint (the route, "GET /v1/search")
//	method, path                        → endpoint "<method> <path>" when no endpoint entry
//	                                      (the query string dropped from path)
//	remote_address, ip, client_ip       → client IP (IPv6 limited by prefix)
//
// Keys not in the map fill no attribute (an Envoy config may carry descriptors meant for
// another service). A key of the map given twice in one descriptor, or an unparsable
// address, is InvalidArgument. Put every attribute of a request in one descriptor: a rule
// that applies to two descriptors of one request is taken from twice.
//
// Besides, every descriptor goes whole to the descriptor rules (rules.Match.Descriptor,
// envoyproxy/ratelimit's model): the request's domain and all the descriptor's entries,
// mapped or not, in order (rules.Attrs.Domain and Entries). So one descriptor is matched
// by the rules of the named dimensions through the key map and by the descriptor rules of
// its domain through its entries. When a rule matching one descriptor replaces others
// (rules.Rule.Replaces), they apply to none of the request's descriptors.
//
// Hits, as envoyproxy/ratelimit counts them: a descriptor's hits_addend when it is set,
// zero included, else the request's hits_addend, else 1. A descriptor's hits_addend of 0
// is a check that takes nothing (enforcer.Request.Peek): OVER_LIMIT when its buckets hold
// less than one request's cost now, else OK with what they hold. A descriptor with
// is_negative_hits (Envoy sends it when the stream is done, apply_on_stream_done) takes
// nothing and is answered OK with no limit; it releases one in-flight slot of every
// enforcing rule with an in-flight limit that it matches — the oldest slot of that
// identity, since Envoy has no handle to send (enforcer.ReleaseOldest, which says the
// error this brings) — whatever its hits, as a check holds one slot whatever its hits —
// and gives hits × cost tokens back to every other enforcing rule with rate limits that
// it matches, never above the burst (enforcer.Refund). A descriptor matching a rule
// marked settle: true (Envoy's hits sent on stream done) is taken whatever the buckets
// hold and answered OK (enforcer.Request, rules.Rule.Settle). A descriptor's own limit
// override is honoured only
// with Config.LimitOverrides (see there); otherwise the rules decide. The domain is checked
// for length (and, when Config.Domain is set, must equal it) and selects the descriptor
// rules of that domain.
//
// Every descriptor is checked, even after one is over its limit (as envoyproxy/ratelimit
// does), so a refused request may still spend tokens of its other descriptors: this
// errs under, by at most one request's cost per descriptor.
package grpcapi

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// Field is the request attribute a descriptor entry fills.
type Field uint8

// The fields a descriptor entry can fill.
const (
	FieldIgnore Field = iota
	FieldAPIKey
	FieldPlan
	FieldOrg
	FieldEndpoint
	FieldMethod
	FieldPath
	FieldIP
)

// KeyMap maps descriptor entry keys to fields. Keys are matched exactly (Envoy keys are
// lower case by convention).
type KeyMap map[string]Field

// DefaultKeyMap returns the mapping documented in the package comment.
func DefaultKeyMap() KeyMap {
	return KeyMap{
		"api_key": FieldAPIKey, "x-api-key": FieldAPIKey, "apikey": FieldAPIKey,
		"plan": FieldPlan,
		"org":  FieldOrg, "organization": FieldOrg, "tenant": FieldOrg,
		"endpoint": FieldEndpoint, "route": FieldEndpoint, "generic_key": FieldEndpoint,
		"method": FieldMethod, "path": FieldPath,
		"remote_address": FieldIP, "ip": FieldIP, "client_ip": FieldIP,
	}
}

// FieldByName parses a field name as written in configuration.
func FieldByName(s string) (Field, error) {
	for f, n := range fieldNames {
		if n == s {
			return Field(f), nil
		}
	}
	return 0, fmt.Errorf("grpcapi: unknown descriptor field %q (want one of api_key, plan, org, endpoint, method, path, ip, ignore)", s)
}

var fieldNames = [...]string{"ignore", "api_key", "plan", "org", "endpoint", "method", "path", "ip"}

// appendEntries appends d's entries to buf, in order, for the descriptor rules; the
// strings are shared, not copied. descriptorRequest has checked their number and sizes.
func appendEntries(buf []rules.Entry, d *ratelimitv3.RateLimitDescriptor) []rules.Entry {
	for _, e := range d.GetEntries() {
		buf = append(buf, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return buf
}

// descriptorRequest turns one descriptor into a check. reqHits is the request-level
// hits_addend. skip is true for a negative-hits descriptor, which is answered OK without a
// check. Errors wrap enforcer.ErrInvalid and name the descriptor index and field.
func descriptorRequest(km KeyMap, lim *enforcer.InputLimits, i int, d *ratelimitv3.RateLimitDescriptor, reqHits uint32, out *enforcer.Request) (skip bool, err error) {
	*out = enforcer.Request{}
	entries := d.GetEntries()
	if len(entries) == 0 {
		return false, fmt.Errorf("%w: descriptor %d has no entries", enforcer.ErrInvalid, i)
	}
	if len(entries) > lim.MaxEntries {
		return false, fmt.Errorf("%w: descriptor %d has %d entries, more than %d", enforcer.ErrInvalid, i, len(entries), lim.MaxEntries)
	}
	var seen [len(fieldNames)]bool
	var method, path string
	for j, e := range entries {
		k, v := e.GetKey(), e.GetValue()
		if k == "" {
			return false, fmt.Errorf("%w: descriptor %d entry %d: key is empty", enforcer.ErrInvalid, i, j)
		}
		if len(k) > lim.MaxKeyLen {
			return false, fmt.Errorf("%w: descriptor %d entry %d: key is %d bytes, more than %d", enforcer.ErrInvalid, i, j, len(k), lim.MaxKeyLen)
		}
		if len(v) > lim.MaxValueLen {
			return false, fmt.Errorf("%w: descriptor %d entry %d (%.64q): value is %d bytes, more than %d", enforcer.ErrInvalid, i, j, k, len(v), lim.MaxValueLen)
		}
		f := km[k]
		if f == FieldIgnore {
			continue
		}
		if seen[f] {
			return false, fmt.Errorf("%w: descriptor %d: %s given twice (entry %d, key %.64q)", enforcer.ErrInvalid, i, fieldNames[f], j, k)
		}
		seen[f] = true
		switch f {
		case FieldAPIKey:
			out.Attrs.APIKey = v
		case FieldPlan:
			out.Attrs.Plan = v
		case FieldOrg:
			out.Attrs.Org = v
		case FieldEndpoint:
			out.Attrs.Endpoint = v
		case FieldMethod:
			method = v
		case FieldPath:
			if k := strings.IndexAny(v, "?#"); k >= 0 {
				v = v[:k] // Envoy's :path carries the query; routes do not
			}
			path = v
		case FieldIP:
			ip, err := netip.ParseAddr(v)
			if err != nil {
				return false, fmt.Errorf("%w: descriptor %d entry %d (%.64q): %.64q is not an IP address", enforcer.ErrInvalid, i, j, k, v)
			}
			out.Attrs.IP = ip.Unmap()
		}
	}
	if out.Attrs.Endpoint == "" && (method != "" || path != "") {
		if len(method)+1+len(path) > lim.MaxValueLen {
			return false, fmt.Errorf("%w: descriptor %d: method and path make an endpoint of %d bytes, more than %d", enforcer.ErrInvalid, i, len(method)+1+len(path), lim.MaxValueLen)
		}
		switch {
		case method == "":
			out.Attrs.Endpoint = path
		case path == "":
			out.Attrs.Endpoint = method
		default:
			out.Attrs.Endpoint = method + " " + path
		}
	}
	hits := int64(reqHits)
	if h := d.GetHitsAddend(); h != nil {
		// Set, it wins, zero included: zero is a check that takes nothing (Peek), as
		// envoyproxy/ratelimit counts zero hits. Unset, the request's applies (0 there: 1).
		if h.GetValue() > uint64(lim.MaxHits) {
			return false, fmt.Errorf("%w: descriptor %d: hits_addend %d, more than %d", enforcer.ErrInvalid, i, h.GetValue(), lim.MaxHits)
		}
		hits = int64(h.GetValue())
		out.Peek = hits == 0
	}
	if hits > lim.MaxHits {
		return false, fmt.Errorf("%w: hits_addend %d, more than %d", enforcer.ErrInvalid, hits, lim.MaxHits)
	}
	out.Hits = hits
	return d.GetIsNegativeHits(), nil
}
