package balancer

import (
	"math"
	"slices"
	"testing"

	"github.com/allot-dev/allot/pkg/rules"
)

const tableRules = `
rules:
  - id: default
    limits:
      - {name: second, rate: 20, per: 1s, burst: 40}
      - {name: minute, rate: 1000, per: 1m}
  - id: pro
    match: {plan: pro}
    limits:
      - {name: minute, rate: 6000, per: 1m}
    shares: {us-east: 0.5, eu-west: 0.3, ap-south: 0.2}
  - id: partial
    match: {plan: partial}
    limits:
      - {name: second, rate: 10, per: 1s}
    shares: {us-east: 0.9}
`

func ruleTable(t *testing.T, src string, weights []float64) (*RuleTable, *rules.Holder) {
	t.Helper()
	set, err := rules.ParseYAML([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	opt, err := CompileOptionsFor(regions3, weights, rules.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := rules.Compile(set, opt)
	if err != nil {
		t.Fatal(err)
	}
	h := rules.NewHolder(snap)
	return NewRuleTable(h, regions3), h
}

func near(a, b []float64) bool {
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-9 {
			return false
		}
	}
	return len(a) == len(b)
}

func TestRuleTableRateAndDefaultSplit(t *testing.T) {
	tab, h := ruleTable(t, tableRules, []float64{2, 1, 1})
	for _, tc := range []struct {
		rule string
		rate float64
		def  []float64
	}{
		{"default", 20, []float64{0.5, 0.25, 0.25}}, // weights: no shares listed
		{"pro", 100, []float64{0.5, 0.3, 0.2}},      // its own shares; 6000/min = 100/s
		// us-east listed at 0.9; the rest, 0.1, split by weight between the other two
		// (rules.DefaultShare, what every enforcer compiles).
		{"partial", 10, []float64{0.9, 0.05, 0.05}},
	} {
		rate, def, ok := tab.Limits(tc.rule, "key:x")
		if !ok || rate != tc.rate || !near(def, tc.def) {
			t.Errorf("%s: rate %g def %v ok %v, want %g %v", tc.rule, rate, def, ok, tc.rate, tc.def)
		}
	}
	if _, _, ok := tab.Limits("nope", "key:x"); ok {
		t.Error("unknown rule known")
	}
	// A new snapshot is seen at once.
	set, _ := rules.ParseYAML([]byte(`rules: [{id: default, limits: [{name: s, rate: 7, per: 1s}]}]`))
	opt, _ := CompileOptionsFor(regions3, nil, rules.CompileOptions{})
	snap, err := rules.Compile(set, opt)
	if err != nil {
		t.Fatal(err)
	}
	h.Store(snap)
	if rate, _, ok := tab.Limits("default", "key:x"); !ok || rate != 7 {
		t.Fatalf("after a new global snapshot: rate %g ok %v, want 7", rate, ok)
	}
}

func TestRuleTableRules(t *testing.T) {
	tab, _ := ruleTable(t, tableRules, nil)
	got := tab.Rules()
	slices.Sort(got)
	if want := []string{"default", "partial", "pro"}; !slices.Equal(got, want) {
		t.Fatalf("Rules() = %v, want %v", got, want)
	}
	if got := NewRuleTable(rules.NewHolder(nil), regions3).Rules(); len(got) != 0 {
		t.Fatalf("Rules() before any rules = %v, want none", got)
	}
}
