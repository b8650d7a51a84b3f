package balancer

import (
	"fmt"
	"sync"

	"github.com/allot-dev/allot/pkg/rules"
)

// RuleTable answers a Core's LimitsFunc from rules snapshots, the same rules the
// enforcers load. It needs one Holder compiled for no region with DefaultShare 1 (the
// global limits) and one per region compiled for that region with DefaultShare its weight
// share (CompileOptionsFor builds both): a rule's default split is then its `shares:`
// where it names a region and the region weights elsewhere, scaled down to sum to 1 when
// it sums to more. An identity's rate is its rule's first limit in tokens/s. The result
// per rule is cached until any holder's snapshot changes.
//
// Safe for concurrent use (its own mutex; it never calls a Core). Build it with
// NewRuleTable.
type RuleTable struct {
	mu    sync.Mutex // mu guards snaps and cache
	snaps []*rules.Snapshot
	cache map[string]ruleLimits

	global  *rules.Holder
	regions []*rules.Holder
}

type ruleLimits struct {
	rate float64
	def  []float64
	ok   bool
}

// CompileOptionsFor returns the options for the global holder and for each region's.
// weights nil means equal; otherwise one > 0 weight per region.
func CompileOptionsFor(regions []string, weights []float64, base rules.CompileOptions) (global rules.CompileOptions, perRegion []rules.CompileOptions, err error) {
	cc := CoreConfig{Regions: regions, Weights: weights}
	if weights != nil && len(weights) != len(regions) {
		return global, nil, fmt.Errorf("balancer: %d weights for %d regions", len(weights), len(regions))
	}
	split := cc.weightSplit()
	global = base
	global.Region, global.DefaultShare = "", 1
	for i, r := range regions {
		o := base
		o.Region, o.DefaultShare = r, split[i]
		perRegion = append(perRegion, o)
	}
	return global, perRegion, nil
}

// NewRuleTable reads global (limits) and perRegion (shares, in CoreConfig.Regions order).
func NewRuleTable(global *rules.Holder, perRegion []*rules.Holder) *RuleTable {
	return &RuleTable{global: global, regions: perRegion, cache: map[string]ruleLimits{}}
}

// Limits is a LimitsFunc.
func (t *RuleTable) Limits(rule, _ string) (float64, []float64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fresh := len(t.snaps) == 1+len(t.regions) && t.snaps[0] == t.global.Current()
	for i, h := range t.regions {
		fresh = fresh && t.snaps[i+1] == h.Current()
	}
	if !fresh {
		t.snaps = append(t.snaps[:0], t.global.Current())
		for _, h := range t.regions {
			t.snaps = append(t.snaps, h.Current())
		}
		clear(t.cache)
	}
	if l, ok := t.cache[rule]; ok {
		return l.rate, l.def, l.ok
	}
	l := t.compute(rule)
	t.cache[rule] = l
	return l.rate, l.def, l.ok
}

func (t *RuleTable) compute(rule string) ruleLimits {
	g := t.snaps[0].Rule(rule)
	if g == nil || len(g.Limits) == 0 || !(g.Limits[0].Rate > 0) {
		return ruleLimits{}
	}
	def := make([]float64, len(t.regions))
	sum := 0.0
	for i := range t.regions {
		c := t.snaps[i+1].Rule(rule)
		if c == nil {
			return ruleLimits{} // not in every region's rules yet: wait for the rollout
		}
		def[i] = c.Share
		sum += c.Share
	}
	if sum > 1 {
		for i := range def {
			def[i] /= sum
		}
	}
	return ruleLimits{rate: g.Limits[0].Rate, def: def, ok: true}
}
