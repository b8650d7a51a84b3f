package rules

// FromEnvoy: envoyproxy/ratelimit's configuration (pkg/envoyrl's model) as allot's rules.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/allot-dev/allot/pkg/envoyrl"
)

// FromEnvoy turns envoyproxy/ratelimit configurations — one per domain, as
// envoyrl.LoadDir, LoadDirMerged or ParseFiles give them, or as an xDS client builds them
// from RateLimitConfig resources — into the equivalent set of descriptor rules. Compile
// validates the set as it does any (an error names the file and line the limit was
// written at: a rate above bucket.MaxRate, a value longer than MaxMatchLen). It is pure:
// a source that loads their files, or receives them over xDS, calls it and Compile on
// every change and keeps the snapshot in force when they fail (EnvoyDirSource does). Each
// descriptor with a rate_limit becomes one rule, in file order:
//
//   - match: the domain, and the descriptor's path from the top (each level's key, its
//     value: exact, wildcard or none; shared for share_threshold); by: descriptor, so
//     every distinct descriptor has its own bucket, as in envoyproxy/ratelimit;
//   - requests_per_unit R per unit U: one token bucket, rate R per U, burst R (a limit
//     named after the unit: "second", ...); R = 0: refuse: true;
//   - unlimited: true stays unlimited; shadow_mode: true is mode: shadow; quota_mode:
//     true is quota: true;
//   - replaces: the ids of the rules of the same domain whose rate_limit has that name;
//   - the id: "<domain>.<key>_<value>.<key>..." (their stats key), with characters an id
//     cannot hold replaced and a hash of the path added when it had to be changed, was
//     too long, or repeats another's; the reason names the file and line, and the name.
//
// A descriptor without a rate_limit and without nested descriptors becomes an unlimited
// rule: it matches (so the walk takes it rather than a less specific sibling) and limits
// nothing, as in envoyproxy/ratelimit. detailed_metric, value_to_metric and metadata have
// no rule field: see docs/envoy-ratelimit.md for what allot does with them.
func FromEnvoy(cfgs []*envoyrl.Config) *Set {
	set := &Set{}
	used := map[string]bool{}
	for _, cfg := range cfgs {
		start := len(set.Rules)
		byName := map[string][]string{} // rate_limit name → rule ids, in this domain
		names := map[int]*envoyrl.RateLimit{}
		var walk func(ds []envoyrl.Descriptor, path []DescriptorEntry, key string)
		walk = func(ds []envoyrl.Descriptor, path []DescriptorEntry, key string) {
			for i := range ds {
				d := &ds[i]
				p := append(path[:len(path):len(path)], DescriptorEntry{
					Key: d.Key, Value: d.Value, Shared: d.ShareThreshold && strings.Contains(d.Value, "*"),
				})
				k := key + "." + d.CompositeKey()
				if d.RateLimit != nil || len(d.Descriptors) == 0 {
					r := envoyRule(cfg, d, p, k, used)
					if rl := d.RateLimit; rl != nil && rl.Name != "" {
						byName[rl.Name] = append(byName[rl.Name], r.ID)
					}
					names[len(set.Rules)] = d.RateLimit
					set.Rules = append(set.Rules, r)
				}
				walk(d.Descriptors, p, k)
			}
		}
		walk(cfg.Descriptors, nil, cfg.Domain)
		for i := start; i < len(set.Rules); i++ {
			rl := names[i]
			if rl == nil {
				continue
			}
			for _, n := range rl.Replaces {
				set.Rules[i].Replaces = append(set.Rules[i].Replaces, byName[n]...)
			}
		}
	}
	return set
}

// envoyRule is one descriptor's rule (replaces are filled by FromEnvoy).
func envoyRule(cfg *envoyrl.Config, d *envoyrl.Descriptor, path []DescriptorEntry, key string, used map[string]bool) Rule {
	r := Rule{
		ID:     envoyID(key, used),
		Match:  Match{Domain: cfg.Domain, Descriptor: path},
		By:     ByDescriptor,
		Reason: fmt.Sprintf("envoy-ratelimit %s:%d", d.File, d.Line),
	}
	pos := &rulePos{file: d.File, line: d.Line, fields: map[string]int{"match.domain": cfg.Line}}
	r.pos = pos
	if d.ShadowMode && d.RateLimit != nil {
		r.Mode = ModeShadow
	}
	r.Quota = d.QuotaMode && d.RateLimit != nil
	rl := d.RateLimit
	switch {
	case rl == nil:
		r.Unlimited = true
		r.Reason += " (no rate_limit: it matches and limits nothing)"
		return r
	case rl.Name != "":
		r.Reason += fmt.Sprintf(" (name %s)", rl.Name)
	}
	for _, f := range []string{"limits", "limits[0]", "limits[0].rate", "limits[0].burst", "limits[0].per", "unlimited", "refuse", "replaces"} {
		pos.fields[f] = rl.Line
	}
	switch {
	case rl.Unlimited:
		r.Unlimited = true
	case rl.RequestsPerUnit == 0:
		r.Refuse = true
	default:
		n := float64(rl.RequestsPerUnit)
		r.Limits = []LimitSpec{{Name: rl.Unit.String(), Rate: n, Per: rl.Unit.Duration(), Burst: n}}
	}
	return r
}

// envoyID is a rule id for the descriptor whose stats key (domain.key_value.key...) is
// key: the key itself when it is a valid id not used yet, else what of it an id can hold
// (up to 71 characters) and "@" and 8 hex digits of its hash.
func envoyID(key string, used map[string]bool) string {
	if idRE.MatchString(key) && !used[key] {
		used[key] = true
		return key
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	b := []byte(key)
	for i, c := range b {
		if !alnum(c) && strings.IndexByte("._:@-", c) < 0 {
			b[i] = '-'
		}
	}
	if len(b) == 0 || !alnum(b[0]) {
		b = append([]byte{'x'}, b...)
	}
	if len(b) > 71 {
		b = b[:71]
	}
	for n := 0; ; n++ {
		sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d", key, n))
		id := string(b) + "@" + hex.EncodeToString(sum[:4])
		if !used[id] {
			used[id] = true
			return id
		}
	}
}
