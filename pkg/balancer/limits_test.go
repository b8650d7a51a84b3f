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
		rule           string
		rate, requests float64
		def            []float64
	}{
		// Two limits: 20/s burst 40, and 1000 a minute (16.7/s, burst 1000). A share
		// scales both and every request takes from both, so the minute's binds: a steady
		// 18/s is over the limit although under the first one.
		{"default", 1000.0 / 60, 40, []float64{0.5, 0.25, 0.25}}, // weights: no shares listed
		{"pro", 100, 6000, []float64{0.5, 0.3, 0.2}},             // its own shares; 6000/min = 100/s
		// us-east listed at 0.9; the rest, 0.1, split by weight between the other two
		// (rules.DefaultShare, what every enforcer compiles).
		{"partial", 10, 10, []float64{0.9, 0.05, 0.05}},
	} {
		l, ok := tab.Limits(tc.rule, "key:x")
		if !ok || math.Abs(l.Rate-tc.rate) > 1e-12 || l.Requests != tc.requests || !near(l.Default, tc.def) {
			t.Errorf("%s: %+v ok %v, want rate %g requests %g default %v", tc.rule, l, ok, tc.rate, tc.requests, tc.def)
		}
	}
	if _, ok := tab.Limits("nope", "key:x"); ok {
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
	if l, ok := tab.Limits("default", "key:x"); !ok || l.Rate != 7 {
		t.Fatalf("after a new global snapshot: %+v ok %v, want rate 7", l, ok)
	}
}

// A rule's binding limit is its smallest rate, wherever it is listed, and its burst in
// requests counts the largest cost.
func TestRuleTableBindingLimit(t *testing.T) {
	tab, _ := ruleTable(t, `
rules:
  - id: day-binds
    limits:
      - {name: second, rate: 100, per: 1s, burst: 200}
      - {name: day, rate: 86400, per: 24h, burst: 500}
  - id: sms
    limits:
      - {name: minute, rate: 6, per: 1m, burst: 6}
      - {name: hour, rate: 20, per: 1h, burst: 10}
    cost: {"POST /sms": 2}
`, nil)
	if l, ok := tab.Limits("day-binds", "k"); !ok || l.Rate != 1 || l.Requests != 200 {
		t.Fatalf("day-binds: %+v %v, want rate 1/s (the day's), 200 requests", l, ok)
	}
	if l, ok := tab.Limits("sms", "k"); !ok || math.Abs(l.Rate-20.0/3600) > 1e-15 || l.Requests != 3 {
		t.Fatalf("sms: %+v %v, want rate 20/h, 6 / cost 2 = 3 requests", l, ok)
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
