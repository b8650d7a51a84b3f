package enforcer

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/allot-dev/allot/pkg/rules"
	"github.com/prometheus/client_golang/prometheus"
)

// The plan label of allot_enforcer_plan_decisions_total, and its bound.
//
// The plan a request names is client input: counting it as it came would let any caller
// create series. So the label takes one of a bounded set of values, fixed by the rules
// snapshot in use and never by the request:
//
//   - the plans the rule set names in match.plan, sorted, the first MaxPlanLabels of them;
//   - PlanOther for a plan not among those (unknown to the rules, or past the bound);
//   - PlanNone for a request that names no plan.
//
// So an enforcer exports at most (MaxPlanLabels + 2) × 2 results = 68 series of it,
// whatever its callers send. When a snapshot with other plans comes in, the next check
// rebuilds the table (once per snapshot, off the common path) and the series of plans no
// longer named are deleted; a rule naming a plan literally "other" or "none" shares that
// series. It errs towards PlanOther: a plan is named only when the rules name it.
const (
	MaxPlanLabels = 32
	PlanOther     = "other"
	PlanNone      = "none"
)

// planCounters are one plan's [refused, allowed] children.
type planCounters [2]prometheus.Counter

// planTable maps the plans of one snapshot to their counters. Immutable once published.
type planTable struct {
	snap  *rules.Snapshot
	named map[string]*planCounters
}

// planMetrics counts decisions by bounded plan. The check path loads the table for its
// snapshot and looks the plan up in a map: no allocation, no lock. Safe for concurrent use.
type planMetrics struct {
	mu  sync.Mutex // mu guards rebuilding cur and the vector's children
	vec *prometheus.CounterVec
	cur atomic.Pointer[planTable]

	none, other planCounters
}

func newPlanMetrics() *planMetrics {
	p := &planMetrics{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_enforcer_plan_decisions_total",
		Help: "Check decisions by the request's plan (bounded: plans the rules name, at most 32, else \"other\"; \"none\" when no plan was given) and result (allowed, refused).",
	}, []string{"plan", "result"})}
	p.none = p.children(PlanNone)
	p.other = p.children(PlanOther)
	p.cur.Store(&planTable{})
	return p
}

func (p *planMetrics) children(plan string) planCounters {
	return planCounters{p.vec.WithLabelValues(plan, "refused"), p.vec.WithLabelValues(plan, "allowed")}
}

// counter returns the counter of plan's result (allowed 1, refused 0) under snap.
func (p *planMetrics) counter(snap *rules.Snapshot, plan string, allowed int) prometheus.Counter {
	if plan == "" {
		return p.none[allowed]
	}
	t := p.cur.Load()
	if t.snap != snap {
		t = p.rebuild(snap)
	}
	if c, ok := t.named[plan]; ok {
		return c[allowed]
	}
	return p.other[allowed]
}

// rebuild publishes the table of snap, unless another check already did. Checks racing a
// rules swap may still count against the previous table for an instant; a plan dropped
// by the swap is then counted on a deleted child, which no scrape sees.
func (p *planMetrics) rebuild(snap *rules.Snapshot) *planTable {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.cur.Load()
	if old.snap == snap {
		return old
	}
	t := &planTable{snap: snap, named: make(map[string]*planCounters)}
	for _, plan := range planLabels(snap) {
		if c, ok := old.named[plan]; ok {
			t.named[plan] = c
			continue
		}
		c := p.children(plan)
		t.named[plan] = &c
	}
	for plan := range old.named {
		if _, ok := t.named[plan]; !ok && plan != PlanNone && plan != PlanOther {
			p.vec.DeleteLabelValues(plan, "refused")
			p.vec.DeleteLabelValues(plan, "allowed")
		}
	}
	p.cur.Store(t)
	return t
}

// planLabels are the plans snap's rules name, sorted, at most MaxPlanLabels.
func planLabels(snap *rules.Snapshot) []string {
	if snap == nil {
		return nil
	}
	var plans []string
	for _, r := range snap.Rules() {
		if r.Match.Plan != "" {
			plans = append(plans, r.Match.Plan)
		}
	}
	slices.Sort(plans)
	plans = slices.Compact(plans)
	if len(plans) > MaxPlanLabels {
		plans = plans[:MaxPlanLabels]
	}
	return plans
}
