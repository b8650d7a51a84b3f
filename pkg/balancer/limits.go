package balancer

import (
	"fmt"
	"math"
	"sync"

	"github.com/allot-dev/allot/pkg/rules"
)

// RuleTable answers a Core's LimitsFunc from the rules the enforcers load, compiled for
// no region with the deployment's region weights (CompileOptionsFor). An identity's rate
// is the binding one of its rule's global limits: the smallest in tokens/s (a per-minute
// limit's rate/60), since every limit takes the same tokens per request and one share
// scales them all, so that is the limit a steady demand runs into first and the one its
// demand must be judged against; Requests is the smallest burst in requests of the
// rule's largest cost. Its default split is the rule's Compiled.Split — computed by
// rules.DefaultShare, the same function every enforcer compiles its own default share
// with, so the balancer and the enforcers agree on what "the default split" is (the
// rule's shares: where it names a region, the rest divided by weight among the regions
// it leaves out). The result per rule is cached until the holder's snapshot changes.
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
	l  Limits
	ok bool
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
func (t *RuleTable) Limits(rule, _ string) (Limits, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur := t.holder.Current(); cur != t.snap {
		t.snap = cur
		clear(t.cache)
	}
	if t.snap == nil {
		return Limits{}, false
	}
	if l, ok := t.cache[rule]; ok {
		return l.l, l.ok
	}
	l := t.compute(rule)
	t.cache[rule] = l
	return l.l, l.ok
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
	if g == nil || len(g.Global) == 0 {
		return ruleLimits{}
	}
	rate, burst := math.Inf(1), math.Inf(1)
	for _, l := range g.Global {
		rate, burst = min(rate, l.Rate), min(burst, l.Burst)
	}
	if !(rate > 0) || math.IsInf(rate, 0) {
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
	return ruleLimits{l: Limits{Rate: rate, Requests: burst / g.MaxCost(), Default: def, Global: g.Global}, ok: true}
}
