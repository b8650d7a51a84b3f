package enforcer

import (
	"math"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Source is bucket.Source, the one Source of the check path (an alias, not a second type:
// a store's answer carries its source into the Decision unchanged). The names below are
// kept for the packages that spell them enforcer.SourceX.
type Source = bucket.Source

// The sources of a decision (see bucket.Source).
const (
	SourceNone         = bucket.SourceNone
	SourceMemory       = bucket.SourceMemory
	SourceRedis        = bucket.SourceRedis
	SourceLease        = bucket.SourceLease
	SourceRefusalCache = bucket.SourceRefusalCache
	SourceFallback     = bucket.SourceFallback
	SourceFailClosed   = bucket.SourceFailClosed
	SourceFailOpen     = bucket.SourceFailOpen
	SourceTooLarge     = bucket.SourceTooLarge
	SourceShadow       = bucket.SourceShadow
	numSources         = bucket.NumSources
)

// maxShadowNames is how many refusing shadow rules a Decision names; more are counted.
const maxShadowNames = 4

// Decision is the answer to one check. Its budget fields describe one limit — the one
// that refused, or when allowed the enforcing limit with the fewest whole tokens left —
// and only the caller's own buckets. It holds no pointers into mutable state; strings
// point into the immutable rules snapshot. The zero Decision is "allowed, no rule".
type Decision struct {
	// Allowed says whether the request may pass.
	Allowed bool
	// Rule is the deciding rule's id; "" when no enforcing rule applied.
	Rule string
	// Limit is the deciding limit's name ("<rule id>/<limit name>"); the IETF policy name.
	Limit string
	// Quota and Window state the deciding limit the way RateLimit-Policy does: for a token
	// bucket the quota is its burst and the window the time it takes to refill from empty,
	// in whole seconds rounded up.
	Quota  int64
	Window int64
	// Remaining is the whole tokens left in the deciding bucket.
	Remaining int64
	// Reset is how long until the deciding bucket is full again, jittered per identity
	// (later only; see Config.ResetJitterMax): the JSON answer's reset_ms, allot.v1's and
	// Envoy's duration until reset.
	Reset time.Duration
	// Effective is the RateLimit field's effective window (draft-ietf-httpapi-ratelimit-
	// headers-11, t): the time the Remaining tokens last at the deciding limit's rate,
	// Remaining ÷ rate, jittered per identity like Reset (later only). Within it the
	// caller may use the Remaining tokens; the bucket refills meanwhile, so the statement
	// errs under, and Remaining over Effective is never more than the limit's rate.
	Effective time.Duration
	// RetryAfter, when refused, is how long until the request could pass; 0 when allowed
	// or when it never can (SourceTooLarge).
	RetryAfter time.Duration
	// Source says where the deciding answer came from.
	Source Source
	// Share is the part of the deciding rule's global limits this region enforced for the
	// identity (its default share, or the balancer's; see Config.Shares); Quota is already
	// scaled by it. 0 when no enforcing rule applied.
	Share float64
	// CountedBy names what the deciding rule counted this request by (rules.CountedBy):
	// "api_key", "ip" (also for a keyless request under a rule counted by api_key),
	// "anonymous" (neither key nor IP), "org", "endpoint", "global" or "descriptor"; ""
	// when no rule.
	CountedBy string
	// Handle, when the check holds in-flight slots (rules with an in-flight limit), names
	// them for Enforcer.Release once the response is done; "" when it holds none.
	Handle string
	// Penalized says the deciding rule's penalty for abuse refuses the identity outright
	// (rules.Rule.Penalty): RetryAfter and Reset run to the end of the block.
	Penalized bool
	// SettleHandle, when the check asked to settle (Request.Settle) and was allowed, names
	// what it took for Enforcer.Settle once the actual cost is known; "" otherwise (then,
	// or when the window passes, the estimate stands).
	SettleHandle string

	shadowN     int
	shadowNames [maxShadowNames]string
	identity    string // the deciding rule's identity (for the sampled refusal log)
	quota       bool   // the deciding rule is a quota rule (rules.Rule.Quota)
}

// QuotaRule reports whether the deciding rule is a quota rule (rules.Rule.Quota,
// envoyproxy/ratelimit's quota_mode): an Envoy RLS front end refuses a request it refuses
// only with the request's other descriptors.
func (d *Decision) QuotaRule() bool { return d.quota }

// ShadowRefused returns the shadow rules that would have refused this request (at most
// four are named; ShadowRefusedCount counts them all). The slice aliases d.
func (d *Decision) ShadowRefused() []string {
	n := d.shadowN
	if n > maxShadowNames {
		n = maxShadowNames
	}
	return d.shadowNames[:n]
}

// ShadowRefusedCount is how many shadow rules would have refused this request.
func (d *Decision) ShadowRefusedCount() int { return d.shadowN }

func (d *Decision) addShadow(id string) {
	if d.shadowN < maxShadowNames {
		d.shadowNames[d.shadowN] = id
	}
	d.shadowN++
}

// RetryAfterSeconds is RetryAfter in whole seconds rounded up, at least 1 on a refusal
// that can be retried; 0 when allowed or when retrying cannot help.
func (d *Decision) RetryAfterSeconds() int64 {
	if d.Allowed || d.RetryAfter <= 0 {
		return 0
	}
	return ceilSeconds(d.RetryAfter)
}

// ResetSeconds is Reset in whole seconds rounded up.
func (d *Decision) ResetSeconds() int64 { return ceilSeconds(d.Reset) }

// EffectiveSeconds is the RateLimit field's t: Effective in whole seconds rounded up (a
// longer window for the same tokens: the caller errs under), and on a refusal that can
// be retried never past Retry-After, which the draft says must not point earlier than
// the end of the effective window.
func (d *Decision) EffectiveSeconds() int64 {
	t := ceilSeconds(d.Effective)
	if ra := d.RetryAfterSeconds(); ra > 0 && t > ra {
		t = ra
	}
	return t
}

// effectiveWindow is how long remaining whole tokens last at rate tokens a second; at
// most maxEffective.
func effectiveWindow(remaining int64, rate float64) time.Duration {
	if remaining <= 0 || !(rate > 0) {
		return 0
	}
	secs := float64(remaining) / rate
	if secs > maxEffective.Seconds() {
		return maxEffective
	}
	return time.Duration(secs * float64(time.Second))
}

// maxEffective bounds an effective window (a burst of millions at one a day would
// overflow a Duration): about 31 years, beyond any window a client plans with.
const maxEffective = 1 << 30 * time.Second

func ceilSeconds(t time.Duration) int64 {
	if t <= 0 {
		return 0
	}
	return int64((t + time.Second - 1) / time.Second)
}

// quotaWindow states a token bucket as an IETF quota policy: q = burst (whole tokens),
// w = burst / rate seconds rounded up (at least 1).
func quotaWindow(l *bucket.Limit) (q, w int64) {
	if !(l.Rate > 0) {
		return 0, 1 // a limit of nothing (a refuse rule's)
	}
	q = int64(math.Floor(l.Burst))
	secs := math.Ceil(l.Burst/l.Rate - 1e-9)
	if secs < 1 {
		secs = 1
	}
	if secs > math.MaxInt32 {
		secs = math.MaxInt32
	}
	return q, int64(secs)
}

// jitter returns the per-identity reset jitter: f × min(max, ratio × reset) with f in
// [0, 1) from an FNV-1a hash of the identity, so every enforcer says the same for a key.
func jitter(identity string, reset time.Duration, max time.Duration, ratio float64) time.Duration {
	if max <= 0 || ratio <= 0 || reset <= 0 {
		return 0
	}
	span := time.Duration(float64(reset) * ratio)
	if span > max {
		span = max
	}
	h := uint64(14695981039346656037)
	for i := 0; i < len(identity); i++ {
		h ^= uint64(identity[i])
		h *= 1099511628211
	}
	f := float64(h>>11) / (1 << 53)
	return time.Duration(f * float64(span))
}
