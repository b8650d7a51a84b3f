package balancer

import (
	"fmt"
	"sync"

	"github.com/allot-dev/allot/pkg/rules"
)

// RuleTable answers a Core's LimitsFunc from the rules the enforcers load, compiled for
// no region with the deployment's region weights (CompileOptionsFor). An identity's rate
// is its rule's first global limit in tokens/s; its default split is the rule's
// Compiled.Split — computed by rules.DefaultShare, the same function every enforcer
// compiles its own default share with, so the balancer and the enforcers agree on what
// "the default split" is (the rule's shares: where it names a region, the rest divided
// by weight among the regions it leaves out). The result per rule is cached until the
// holder's snapshot changes.
//
// Safe for concurrent use (its own mutex; it never calls a Core). Build it with
// NewRuleTable.
type RuleTable struct {
	mu    sync.Mutex // mu guards snap and cache
	snap  *rules.Snapshot
	cache map[string]ruleLimits

	holder  *rules.Holder
	regions []string
}

type ruleLimits struct {
	rate float64
	def  []float64
	ok   bool
}

// CompileOptionsFor returns the options the balancer compiles its rules with: no region
// (the global limits) and the region weights (nil: equal), so Compiled.Split is the
// default split over regions.
func CompileOptionsFor(regions []string, weights []float64, base rules.CompileOptions) (rules.CompileOptions, error) {
	if weights != nil && len(weights) != len(regions) {
		return base, fmt.Errorf("balancer: %d weights for %d regions", len(weights), len(regions))
	}
	base.Region = ""
	base.Regions = make(map[string]float64, len(regions))
	for i, r := range regions {
		w := 1.0
		if weights != nil {
			w = weights[i]
		}
		base.Regions[r] = w
	}
	return base, nil
}

// NewRuleTable reads h (compiled with CompileOptionsFor) for regions, in
// CoreConfig.Regions order.
func NewRuleTable(h *rules.Holder, regions []string) *RuleTable {
	return &RuleTable{holder: h, regions: regions, cache: map[string]ruleLimits{}}
}

// Limits is a LimitsFunc.
func (t *RuleTable) Limits(rule, _ string) (float64, []float64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur := t.holder.Current(); cur != t.snap {
		t.snap = cur
		clear(t.cache)
	}
	if t.snap == nil {
		return 0, nil, false
	}
	if l, ok := t.cache[rule]; ok {
		return l.rate, l.def, l.ok
	}
	l := t.compute(rule)
	t.cache[rule] = l
	return l.rate, l.def, l.ok
}

// Rules returns the ids of the rules in force (for tools that look an identity up under
// every rule); none before the first rules load.
func (t *RuleTable) Rules() []string {
	snap := t.holder.Current()
	if snap == nil {
		return nil
	}
	rs := snap.Rules()
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func (t *RuleTable) compute(rule string) ruleLimits {
	g := t.snap.Rule(rule)
	if g == nil || len(g.Global) == 0 || !(g.Global[0].Rate > 0) {
		return ruleLimits{}
	}
	def := make([]float64, len(t.regions))
	for i, r := range t.regions {
		s, ok := g.Split[r]
		if !ok {
			return ruleLimits{} // compiled for other regions: not ours to balance
		}
		def[i] = s
	}
	return ruleLimits{rate: g.Global[0].Rate, def: def, ok: true}
}
