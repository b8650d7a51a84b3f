package grpcapi

// How the Envoy RLS answer is put together from the descriptors' decisions, where it
// follows envoyproxy/ratelimit (src/service/ratelimit.go): the overall code under
// quota_mode and the global shadow mode, the header fields they add, and the descriptor's
// current_limit in their units.

import (
	"math"
	"strconv"

	"github.com/allot-dev/allot/pkg/enforcer"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// HeaderStyle says which header fields an Envoy RLS answer adds to
// response_headers_to_add.
type HeaderStyle uint8

const (
	// HeadersIETF (the zero value) adds allot's fields on every answer a rule decided:
	// RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-11),
	// X-RateLimit-Counted-By, and on a refusal Retry-After and X-RateLimit-Rule
	// (enforcer.Decision.AppendHeaders), of the deciding descriptor.
	HeadersIETF HeaderStyle = iota
	// HeadersEnvoyRatelimit adds envoyproxy/ratelimit's three fields, as their
	// LIMIT_RESPONSE_HEADERS_ENABLED does: the limit (current_limit's requests_per_unit),
	// the remaining (limit_remaining) and the reset (duration_until_reset, whole seconds)
	// of the descriptor closest to its limit — the last non-quota descriptor over its limit,
	// else the one with the least remaining — under the names in Headers.
	HeadersEnvoyRatelimit
	// HeadersNone adds no header field (their default: LIMIT_RESPONSE_HEADERS_ENABLED off).
	HeadersNone
)

// Headers configures the header fields of an Envoy RLS answer. The zero value is allot's
// fields (HeadersIETF).
type Headers struct {
	Style HeaderStyle
	// Limit, Remaining and Reset name HeadersEnvoyRatelimit's fields; empty means their
	// defaults, RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset
	// (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER).
	Limit, Remaining, Reset string
}

// The default names of HeadersEnvoyRatelimit's fields.
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// withDefaults returns h with empty names set to the defaults.
func (h Headers) withDefaults() Headers {
	if h.Limit == "" {
		h.Limit = DefaultLimitHeader
	}
	if h.Remaining == "" {
		h.Remaining = DefaultRemainingHeader
	}
	if h.Reset == "" {
		h.Reset = DefaultResetHeader
	}
	return h
}

// verdict gathers the descriptors' decisions into the request's overall code, as
// envoyproxy/ratelimit does: OVER_LIMIT when a non-quota descriptor is over its limit, or
// when the request has quota descriptors and every one of them is.
type verdict struct {
	over, quota, quotaOver int
	decider, quotaDecider  enforcer.Decision // the deciding descriptor's; quotaDecider: the first refused quota one
	have, haveQuota        bool
}

// add counts one descriptor's decision d (one a rule decided); quota says whether the
// descriptor is a quota one.
func (v *verdict) add(d *enforcer.Decision, quota bool) {
	if quota {
		v.quota++
	}
	switch {
	case !d.Allowed && quota:
		v.quotaOver++
		if !v.haveQuota {
			v.quotaDecider, v.haveQuota = *d, true
		}
	case !d.Allowed && (!v.have || v.decider.Allowed):
		v.over++
		v.decider, v.have = *d, true
	case !d.Allowed:
		v.over++
	case !v.have || v.decider.Allowed && d.Remaining < v.decider.Remaining:
		v.decider, v.have = *d, true
	}
}

// refused says whether the request is OVER_LIMIT, and makes the decider a refused one
// when it is only for its quota descriptors.
func (v *verdict) refused() bool {
	if v.over > 0 {
		return true
	}
	if v.quota > 0 && v.quotaOver == v.quota {
		v.decider, v.have = v.quotaDecider, true
		return true
	}
	return false
}

// units are Envoy's units, shortest first, with their length as envoyproxy/ratelimit
// counts it (a month 30 days, a year 365).
var units = [...]struct {
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	secs int64
}{
	{rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, 60},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, 3600},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 86400},
	{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 86400},
	{rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * 86400},
	{rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * 86400},
}

// unitSeconds returns the length of Envoy unit u in seconds; 0 for UNKNOWN or a value
// that is no unit.
func unitSeconds(u rlsv3.RateLimitResponse_RateLimit_Unit) int64 {
	for _, c := range units {
		if c.unit == u {
			return c.secs
		}
	}
	return 0
}

// setCurrentLimit states d's limit in l as requests per unit. A token bucket whose burst
// refills in exactly one unit (the limits of envoyproxy/ratelimit's configuration: burst
// R, rate R per unit) is stated as written: R per that unit, week, month and year
// included; a limit of nothing (a refuse rule's) as 0 a second. Any other is stated by its rate, in the largest unit up to a day in which it
// is at least one whole request, rounded down.
func setCurrentLimit(l *rlsv3.RateLimitResponse_RateLimit, d *enforcer.Decision) {
	l.Name = d.Limit
	for _, c := range units {
		if d.Window == c.secs && d.Quota >= 0 { // a limit of nothing (requests_per_unit 0) reads 0 a second
			l.RequestsPerUnit, l.Unit = uint32(min(d.Quota, math.MaxUint32)), c.unit
			return
		}
	}
	// The policy says quota tokens per window seconds; Envoy wants requests per unit.
	rate := float64(d.Quota) / float64(max(d.Window, 1))
	u := units[0]
	for _, c := range units[:4] {
		u = c
		if rate*float64(c.secs) >= 1 {
			break
		}
	}
	rpu := math.Floor(rate * float64(u.secs))
	l.RequestsPerUnit, l.Unit = uint32(min(max(rpu, 1), math.MaxUint32)), u.unit
}

// envoyHeaders sets envoyproxy/ratelimit's header fields in r from its statuses (quota[i]:
// status i is a quota descriptor's), as their service picks the descriptor: the one with
// the least limit_remaining among those with a current_limit, and any non-quota one over
// its limit over that (the last such). Nothing when no status has a limit.
func (r *reply) envoyHeaders(h *Headers, quota []bool) {
	var pick *rlsv3.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for i, st := range r.resp.Statuses {
		if st.CurrentLimit == nil {
			continue
		}
		if st.LimitRemaining < least {
			pick, least = st, st.LimitRemaining
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && !quota[i] {
			pick, least = st, 0
		}
	}
	if pick == nil {
		return
	}
	var buf [48]byte
	b := strconv.AppendUint(buf[:0], uint64(pick.CurrentLimit.RequestsPerUnit), 10)
	lim := len(b)
	b = strconv.AppendUint(b, uint64(pick.LimitRemaining), 10)
	rem := len(b)
	b = strconv.AppendInt(b, pick.DurationUntilReset.GetSeconds(), 10)
	v := string(b) // one allocation for the three values
	hs := [...]enforcer.Header{{Name: h.Limit, Value: v[:lim]}, {Name: h.Remaining, Value: v[lim:rem]}, {Name: h.Reset, Value: v[rem:]}}
	r.setHeaders(hs[:])
}

// setHeaders makes hs the response's header fields, in r's room.
func (r *reply) setHeaders(hs []enforcer.Header) {
	ptrs, values := r.headerPtrs[:], r.headerValues[:]
	if len(hs) > maxHeaders { // not today; cheaper than a panic if a field is added
		ptrs, values = make([]*corev3.HeaderValue, len(hs)), make([]corev3.HeaderValue, len(hs))
	}
	r.resp.ResponseHeadersToAdd = ptrs[:len(hs)]
	for i := range hs {
		values[i].Key, values[i].Value = hs[i].Name, hs[i].Value
		r.resp.ResponseHeadersToAdd[i] = &values[i]
	}
}
