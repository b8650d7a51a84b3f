package rules

import (
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Bounds on the values of a rule, checked by Validate.
const (
	// MaxPer is the longest limit period.
	MaxPer = 366 * 24 * time.Hour
	// MaxRefill bounds how long an empty bucket takes to fill (burst / per-second rate), so
	// every wait and expiry a store computes stays far inside int64 microseconds.
	MaxRefill = 400 * 24 * time.Hour
	// MaxMatchLen is the longest match value, in bytes.
	MaxMatchLen = 256
	// MaxDescriptorDepth is the most entries a descriptor rule's match may have.
	MaxDescriptorDepth = 64
	// MaxReplaces is the most rules one rule may replace.
	MaxReplaces = 64
	// MaxQuota is the largest calendar quota, in tokens.
	MaxQuota = 1 << 50
	// MaxInflightTimeout is the longest an in-flight request may hold its slot without a
	// release.
	MaxInflightTimeout = time.Hour
)

var (
	idRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,79}$`)
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$`)
	regionRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)
)

// Validate checks every rule of the set, whatever region it will be compiled for, and
// returns all problems found (at most 20 listed), each an *Error wrapping ErrInvalid that
// names the rule, the field and, when the set was parsed, the line. nil means Compile will
// succeed for any valid CompileOptions.
//
// An override whose expires_at has passed is not an error: it simply no longer applies, so
// a set never becomes invalid with time.
func (s *Set) Validate() error {
	var errs errList
	if len(s.Rules) > MaxRules {
		errs.add(&Error{File: s.file, Msg: fmt.Sprintf("%d rules, more than %d", len(s.Rules), MaxRules)})
		return errs.err()
	}
	seen := make(map[string]int, len(s.Rules))
	for i := range s.Rules {
		r := &s.Rules[i]
		validateRule(r, i, s.file, &errs)
		if r.ID != "" {
			if j, dup := seen[r.ID]; dup {
				errs.add(ruleErr(r, i, s.file, "id", "%q is also the id of rule #%d; ids must be unique", r.ID, j+1))
			} else {
				seen[r.ID] = i
			}
		}
	}
	for i := range s.Rules {
		r := &s.Rules[i]
		for j, id := range r.Replaces {
			if _, ok := seen[id]; !ok && id != r.ID {
				errs.add(ruleErr(r, i, s.file, fmt.Sprintf("replaces[%d]", j), "%.100q is the id of no rule of the set", id))
			}
		}
	}
	return errs.err()
}

func ruleErr(r *Rule, index int, file, field, format string, a ...any) *Error {
	if r.pos != nil && r.pos.file != "" {
		file = r.pos.file
	}
	return &Error{File: file, Line: r.pos.lineOf(field), Rule: r.ID, Index: index, Field: field, Msg: fmt.Sprintf(format, a...)}
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func validateRule(r *Rule, i int, file string, errs *errList) {
	bad := func(field, format string, a ...any) { errs.add(ruleErr(r, i, file, field, format, a...)) }

	if r.ID == "" {
		bad("id", "missing; every rule needs a unique id")
	} else if !idRE.MatchString(r.ID) {
		bad("id", "%.100q: want 1-80 of A-Z a-z 0-9 . _ : @ - (starting with a letter or digit)", r.ID)
	}
	m := r.Match
	for _, f := range [...]struct{ name, v string }{
		{"match.api_key", m.APIKey}, {"match.plan", m.Plan}, {"match.org", m.Org},
		{"match.endpoint", m.Endpoint}, {"match.ip", m.IP},
	} {
		if len(f.v) > MaxMatchLen {
			bad(f.name, "%d bytes, more than %d", len(f.v), MaxMatchLen)
		}
	}
	if m.IP != "" {
		if _, err := parseIPMatch(m.IP); err != nil {
			bad("match.ip", "%v", err)
		}
	}
	if m.APIKey != "" && r.ExpiresAt.IsZero() {
		bad("expires_at", "missing; a per-key override (match.api_key %.40q) must expire", m.APIKey)
	}
	validateDescriptor(r, bad)
	for j, id := range r.Replaces {
		if id == r.ID {
			bad(fmt.Sprintf("replaces[%d]", j), "%q is the rule itself", id)
		}
	}
	if len(r.Replaces) > MaxReplaces {
		bad("replaces", "%d rules, more than %d", len(r.Replaces), MaxReplaces)
	}
	if r.Mode > ModeShadow {
		bad("mode", "%d is not enforce or shadow", r.Mode)
	}
	if r.FailMode > FailClosed {
		bad("fail_mode", "%d is not open or closed", r.FailMode)
	}
	if r.By >= numBy {
		bad("by", "%d is not api_key, ip, org, endpoint, global or descriptor", r.By)
	}

	switch n := len(r.Limits); {
	case r.Unlimited && r.Refuse:
		bad("refuse", "beside unlimited: true; a rule is one or the other")
	case r.Unlimited && n > 0:
		bad("limits", "%d limits beside unlimited: true; an unlimited rule has none", n)
	case r.Refuse && n > 0:
		bad("limits", "%d limits beside refuse: true; a rule that refuses everything has none", n)
	case r.Settle && (r.Unlimited || r.Refuse):
		bad("settle", "beside unlimited or refuse: true; a rule that settles needs rate limits")
	case r.Unlimited || r.Refuse:
	case n == 0:
		bad("limits", "missing; a rule needs at least one limit (or unlimited: true, or refuse: true)")
	case n > bucket.MaxLimits:
		bad("limits", "%d limits, more than %d", n, bucket.MaxLimits)
	}
	minBurst := math.Inf(1)
	names := make(map[string]bool, len(r.Limits))
	inflight := -1
	for j, l := range r.Limits {
		f := func(s string) string { return fmt.Sprintf("limits[%d].%s", j, s) }
		switch {
		case l.Name == "":
			bad(f("name"), "missing")
		case !nameRE.MatchString(l.Name):
			bad(f("name"), "%.60q: want 1-40 of A-Z a-z 0-9 . _ - (starting with a letter or digit)", l.Name)
		case names[l.Name]:
			bad(f("name"), "%q appears twice in the rule; limit names must be unique", l.Name)
		}
		names[l.Name] = true
		if l.IsQuota() {
			validateQuota(l, f, bad)
			continue
		}
		if l.IsInflight() {
			if inflight >= 0 {
				bad(f("concurrent"), "a second in-flight limit (limits[%d] is one); a rule has at most one", inflight)
			}
			inflight = j
			validateInflight(l, f, bad)
			continue
		}
		okRate := finite(l.Rate) && l.Rate > 0
		if !okRate {
			bad(f("rate"), "%g, must be finite and > 0", l.Rate)
		}
		okPer := l.Per > 0 && l.Per <= MaxPer
		if !okPer {
			bad(f("per"), "%v, must be > 0 and <= %v", l.Per, MaxPer)
		}
		burst := l.Burst
		if burst == 0 {
			burst = l.Rate
		}
		okBurst := finite(burst) && burst >= 1 && burst <= bucket.MaxBurst
		if !okBurst && l.Burst == 0 && !okRate {
			// rate is already reported; a missing burst only repeats it
		} else if !okBurst {
			if l.Burst == 0 {
				bad(f("burst"), "missing, and rate %g is not a valid burst (want >= 1 and <= %g)", l.Rate, float64(bucket.MaxBurst))
			} else {
				bad(f("burst"), "%g, must be finite, >= 1 and <= %g", l.Burst, float64(bucket.MaxBurst))
			}
		} else if burst < minBurst {
			minBurst = burst
		}
		if okRate && okPer {
			perSec := l.Rate / l.Per.Seconds()
			switch {
			case perSec > bucket.MaxRate:
				bad(f("rate"), "%g per %v is %g a second, more than %g", l.Rate, l.Per, perSec, float64(bucket.MaxRate))
			case okBurst && burst/perSec > MaxRefill.Seconds():
				bad(f("rate"), "%g per %v refills burst %g in %.0fh, longer than %v", l.Rate, l.Per, burst, burst/perSec/3600, MaxRefill)
			}
		}
	}
	if p := r.Penalty; p != nil {
		switch {
		case r.Unlimited || r.Refuse:
			bad("penalty", "beside unlimited or refuse: true; a penalty counts a rule's refusals of its limits")
		case inflight >= 0 && len(r.Limits) == 1:
			bad("penalty", "on a rule of only an in-flight limit; a penalty counts the refusals of a rate limit")
		}
		if p.Refusals < 1 || p.Refusals > bucket.MaxPenaltyRefusals {
			bad("penalty.refusals", "%d, must be in [1, %d]", p.Refusals, bucket.MaxPenaltyRefusals)
		}
		if p.Within < bucket.MinPenaltyTime || p.Within > bucket.MaxPenaltyTime {
			bad("penalty.within", "%v, must be in [%v, %v] (the window the refusals are counted in)", p.Within, bucket.MinPenaltyTime, bucket.MaxPenaltyTime)
		}
		if p.Block < bucket.MinPenaltyTime || p.Block > bucket.MaxPenaltyTime {
			bad("penalty.block", "%v, must be in [%v, %v] (how long the identity is then refused)", p.Block, bucket.MinPenaltyTime, bucket.MaxPenaltyTime)
		}
	}
	if r.Settle && inflight >= 0 && len(r.Limits) == 1 {
		bad("settle", "beside only an in-flight limit; a rule that settles needs rate limits")
	}
	for _, ep := range sortedKeys(r.Cost) {
		c := r.Cost[ep]
		switch {
		case c < 1:
			bad("cost", "endpoint %q: %d, must be >= 1", ep, c)
		case !math.IsInf(minBurst, 1) && float64(c) > minBurst:
			bad("cost", "endpoint %q: %d is more than the smallest burst %g, so such a request could never pass", ep, c, minBurst)
		}
		if len(ep) > MaxMatchLen {
			bad("cost", "endpoint is %d bytes, more than %d", len(ep), MaxMatchLen)
		}
	}
	sum, sumOK := 0.0, true
	for _, region := range sortedKeys(r.Shares) {
		sh := r.Shares[region]
		if !regionRE.MatchString(region) {
			bad("shares", "region %.60q: want a name like us-east (a-z, 0-9, -)", region)
		}
		if !finite(sh) || sh < 0 || sh > 1 {
			bad("shares", "region %q: %g, must be in [0, 1]", region, sh)
			sumOK = false
		}
		sum += sh
	}
	if sumOK && sum > 1+shareSumSlack {
		bad("shares", "%s sum to %g, more than 1: the regions would admit more than the global limit", formatShares(r.Shares), sum)
	}
}

// validateDescriptor checks a descriptor rule's match, and that only descriptor rules
// count by descriptor.
func validateDescriptor(r *Rule, bad func(field, format string, a ...any)) {
	m := &r.Match
	d := m.Descriptor
	switch {
	case len(d) == 0 && m.Domain != "":
		bad("match.domain", "%.60q without match.descriptor; a domain only selects descriptor rules", m.Domain)
	case len(d) == 0 && r.By == ByDescriptor:
		bad("by", "descriptor without match.descriptor; only a descriptor rule counts by descriptor")
	case len(d) == 0:
		return
	case m.Domain == "":
		bad("match.domain", "missing; a descriptor rule names the Envoy RLS domain it serves")
	case len(m.Domain) > MaxMatchLen:
		bad("match.domain", "%d bytes, more than %d", len(m.Domain), MaxMatchLen)
	}
	if len(d) > MaxDescriptorDepth {
		bad("match.descriptor", "%d entries, more than %d", len(d), MaxDescriptorDepth)
	}
	for i, e := range d {
		f := func(s string) string { return fmt.Sprintf("match.descriptor[%d].%s", i, s) }
		switch {
		case e.Key == "":
			bad(f("key"), "missing")
		case len(e.Key) > MaxMatchLen:
			bad(f("key"), "%d bytes, more than %d", len(e.Key), MaxMatchLen)
		}
		if len(e.Value) > MaxMatchLen {
			bad(f("value"), "%d bytes, more than %d", len(e.Value), MaxMatchLen)
		}
		if e.Shared && !strings.Contains(e.Value, "*") {
			bad(f("shared"), "only with a wildcard value (containing '*'), not %.60q", e.Value)
		}
	}
}

// shareSumSlack forgives the rounding of decimal shares (0.1 + 0.2 + 0.7).
const shareSumSlack = 1e-9

func formatShares(m map[string]float64) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range sortedKeys(m) {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %g", k, m[k])
	}
	b.WriteByte('}')
	return b.String()
}

// validateRegions checks the regions every rule's shares: names against the deployment's
// regions (CompileOptions.Regions; nothing to check when there are none).
func (s *Set) validateRegions(regions map[string]float64) error {
	if len(regions) == 0 {
		return nil
	}
	var errs errList
	for i := range s.Rules {
		r := &s.Rules[i]
		for _, region := range sortedKeys(r.Shares) {
			if _, ok := regions[region]; !ok {
				errs.add(ruleErr(r, i, s.file, "shares", "region %q is not one of the configured regions (%s)", region, strings.Join(sortedKeys(regions), ", ")))
			}
		}
	}
	return errs.err()
}

// validateInflight checks an in-flight limit ({name, concurrent, timeout}).
func validateInflight(l LimitSpec, f func(string) string, bad func(field, format string, a ...any)) {
	if l.Concurrent < 1 || l.Concurrent > bucket.MaxConcurrent {
		bad(f("concurrent"), "%d, must be in [1, %d]", l.Concurrent, bucket.MaxConcurrent)
	}
	if l.Timeout < time.Second || l.Timeout > MaxInflightTimeout {
		bad(f("timeout"), "%v, must be in [1s, %v] (how long a request holds its slot if its release is lost)", l.Timeout, MaxInflightTimeout)
	}
	if l.Rate != 0 || l.Per != 0 || l.Burst != 0 {
		bad(f("concurrent"), "beside rate, per or burst; an in-flight limit has concurrent and timeout only")
	}
}

// validateQuota checks a calendar quota ({name, quota, period, time_zone}).
func validateQuota(l LimitSpec, f func(string) string, bad func(field, format string, a ...any)) {
	if l.Quota < 1 || l.Quota > MaxQuota {
		bad(f("quota"), "%d, must be in [1, %d]", l.Quota, int64(MaxQuota))
	}
	if l.Period.String() == "" {
		bad(f("period"), "missing (day, week or month)")
	}
	if _, err := loadZone(l.TimeZone); err != nil {
		bad(f("time_zone"), "%v", err)
	}
	if l.Rate != 0 || l.Per != 0 || l.Burst != 0 || l.Concurrent != 0 || l.Timeout != 0 {
		bad(f("quota"), "beside rate, per, burst, concurrent or timeout; a calendar quota has quota, period and time_zone only")
	}
}
