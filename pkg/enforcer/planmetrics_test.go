package enforcer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/allot-dev/allot/pkg/rules"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const planRules = `
rules:
  - id: default
    limits: [{name: second, rate: 2, per: 1s}]
  - id: pro
    match: {plan: pro}
    limits: [{name: second, rate: 3, per: 1s}]
  - id: pro-search
    match: {plan: pro, endpoint: "GET /v1/search"}
    limits: [{name: second, rate: 3, per: 1s}]
  - id: free
    match: {plan: free}
    limits: [{name: second, rate: 1, per: 1s}]
`

func TestPlanDecisionsAreCountedByBoundedPlan(t *testing.T) {
	r := newRig(t, planRules, nil)
	for i := 0; i < 4; i++ { // pro: 3 allowed, 1 refused
		r.check(t, rules.Attrs{APIKey: "a", Plan: "pro"})
	}
	r.check(t, rules.Attrs{APIKey: "b", Plan: "free"})       // allowed
	r.check(t, rules.Attrs{APIKey: "b", Plan: "free"})       // refused
	r.check(t, rules.Attrs{APIKey: "c", Plan: "enterprise"}) // not in the rules: other
	r.check(t, rules.Attrs{APIKey: "c", Plan: "x-\u00e9\n"}) // any caller string: other
	r.check(t, rules.Attrs{APIKey: "d"})                     // no plan: none
	want := `
# HELP allot_enforcer_plan_decisions_total Check decisions by the request's plan (bounded: plans the rules name, at most 32, else "other"; "none" when no plan was given) and result (allowed, refused).
# TYPE allot_enforcer_plan_decisions_total counter
allot_enforcer_plan_decisions_total{plan="free",result="allowed"} 1
allot_enforcer_plan_decisions_total{plan="free",result="refused"} 1
allot_enforcer_plan_decisions_total{plan="none",result="allowed"} 1
allot_enforcer_plan_decisions_total{plan="none",result="refused"} 0
allot_enforcer_plan_decisions_total{plan="other",result="allowed"} 2
allot_enforcer_plan_decisions_total{plan="other",result="refused"} 0
allot_enforcer_plan_decisions_total{plan="pro",result="allowed"} 3
allot_enforcer_plan_decisions_total{plan="pro",result="refused"} 1
`
	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(want), "allot_enforcer_plan_decisions_total"); err != nil {
		t.Fatal(err)
	}
}

// manyPlans is a rule set naming n plans p000 … p(n-1).
func manyPlans(n int) string {
	var b strings.Builder
	b.WriteString("rules:\n  - id: default\n    limits: [{name: second, rate: 1000000, per: 1s}]\n")
	for i := n - 1; i >= 0; i-- { // written in reverse: the bound keeps the sorted first
		fmt.Fprintf(&b, "  - id: plan-%03d\n    match: {plan: p%03d}\n    limits: [{name: second, rate: 1000000, per: 1s}]\n", i, i)
	}
	return b.String()
}

func TestPlanLabelsAreBounded(t *testing.T) {
	r := newRig(t, manyPlans(MaxPlanLabels+8), nil)
	for i := 0; i < MaxPlanLabels+8; i++ {
		r.check(t, rules.Attrs{APIKey: "k", Plan: fmt.Sprintf("p%03d", i)})
	}
	for i := 0; i < 1000; i++ { // a caller inventing plans
		r.check(t, rules.Attrs{APIKey: "k", Plan: fmt.Sprintf("made-up-%d", i)})
	}
	n, err := testutil.GatherAndCount(r.reg, "allot_enforcer_plan_decisions_total")
	if err != nil {
		t.Fatal(err)
	}
	if want := (MaxPlanLabels + 2) * 2; n != want {
		t.Fatalf("%d series, want the bound (%d named + other + none) × 2 results = %d", n, MaxPlanLabels, want)
	}
	m := r.e.metrics.plans
	snap := r.h.Current()
	if got := testutil.ToFloat64(m.counter(snap, "p000", 1)); got != 1 {
		t.Errorf("p000 (first sorted) allowed %v, want 1", got)
	}
	last := fmt.Sprintf("p%03d", MaxPlanLabels-1)
	if got := testutil.ToFloat64(m.counter(snap, last, 1)); got != 1 {
		t.Errorf("%s (last within the bound) allowed %v, want 1", last, got)
	}
	if got := testutil.ToFloat64(m.other[1]); got != 8+1000 {
		t.Errorf("other allowed %v, want 8 past the bound + 1000 made up = 1008", got)
	}
}

func TestPlanLabelsFollowTheRules(t *testing.T) {
	r := newRig(t, planRules, nil)
	r.check(t, rules.Attrs{APIKey: "a", Plan: "free"})
	r.h.Store(compile(t, `
rules:
  - id: default
    limits: [{name: second, rate: 2, per: 1s}]
  - id: team
    match: {plan: team}
    limits: [{name: second, rate: 5, per: 1s}]
`, t0))
	r.check(t, rules.Attrs{APIKey: "a", Plan: "free"}) // no longer named: other
	r.check(t, rules.Attrs{APIKey: "a", Plan: "team"})
	want := `
# HELP allot_enforcer_plan_decisions_total Check decisions by the request's plan (bounded: plans the rules name, at most 32, else "other"; "none" when no plan was given) and result (allowed, refused).
# TYPE allot_enforcer_plan_decisions_total counter
allot_enforcer_plan_decisions_total{plan="none",result="allowed"} 0
allot_enforcer_plan_decisions_total{plan="none",result="refused"} 0
allot_enforcer_plan_decisions_total{plan="other",result="allowed"} 1
allot_enforcer_plan_decisions_total{plan="other",result="refused"} 0
allot_enforcer_plan_decisions_total{plan="team",result="allowed"} 1
allot_enforcer_plan_decisions_total{plan="team",result="refused"} 0
`
	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(want), "allot_enforcer_plan_decisions_total"); err != nil {
		t.Fatal(err)
	}
}

func TestPlanLabelsWithoutRules(t *testing.T) {
	r := newRig(t, planRules, nil)
	r.e.cfg.Rules = rules.NewHolder(nil)
	r.check(t, rules.Attrs{APIKey: "a", Plan: "pro"})
	if got := testutil.ToFloat64(r.e.metrics.plans.other[1]); got != 1 {
		t.Fatalf("no rules: plan pro counted as other %v times, want 1", got)
	}
}

// The check path must not allocate for the plan counter: a table lookup and an atomic add.
func TestPlanCounterDoesNotAllocate(t *testing.T) {
	r := newRig(t, planRules, nil)
	snap := r.h.Current()
	m := r.e.metrics.plans
	m.counter(snap, "pro", 1).Inc() // builds the table for snap
	plans := []string{"pro", "free", "enterprise", ""}
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		m.counter(snap, plans[i&3], i&1).Inc()
		i++
	}); n != 0 {
		t.Fatalf("%v allocations per plan count, want 0", n)
	}
	// And a whole check of a known identity allocates nothing.
	ctx := context.Background()
	req := &Request{Attrs: rules.Attrs{APIKey: "a", Plan: "pro"}}
	if n := testing.AllocsPerRun(100, func() { _, _ = r.e.Check(ctx, req) }); n != 0 {
		t.Fatalf("%v allocations per check, want 0", n)
	}
}

// Checks racing rules swaps: the table is rebuilt once per snapshot and never torn (run
// with -race).
func TestPlanTableUnderRulesSwaps(t *testing.T) {
	r := newRig(t, manyPlans(4), nil)
	snaps := []*rules.Snapshot{compile(t, manyPlans(2), t0), compile(t, manyPlans(6), t0)}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				req := &Request{Attrs: rules.Attrs{APIKey: "k", Plan: fmt.Sprintf("p%03d", i%6)}}
				if _, err := r.e.Check(ctx, req); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for i := 0; i < 50; i++ {
		r.h.Store(snaps[i%2])
		r.e.metrics.plans.counter(snaps[i%2], "p000", 1) // this goroutine rebuilds too
	}
	close(done)
	wg.Wait()
	n, err := testutil.GatherAndCount(r.reg, "allot_enforcer_plan_decisions_total")
	if err != nil {
		t.Fatal(err)
	}
	if n > (6+2)*2 {
		t.Fatalf("%d series after the swaps, want at most (6 plans + other + none) × 2", n)
	}
}

// BenchmarkPlanCounter is what the plan label adds to a check: the table load, the map
// lookup and the atomic add.
func BenchmarkPlanCounter(b *testing.B) {
	r := newRig(b, planRules, nil)
	snap := r.h.Current()
	m := r.e.metrics.plans
	plans := []string{"pro", "free", "enterprise", ""}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m.counter(snap, plans[i&3], i&1).Inc()
	}
}
