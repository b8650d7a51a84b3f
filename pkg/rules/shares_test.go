package rules

import (
	"math"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
)

var threeRegions = map[string]float64{"us-east": 1, "eu-west": 1, "ap-south": 1}

func TestDefaultShare(t *testing.T) {
	weighted := map[string]float64{"us-east": 2, "eu-west": 1, "ap-south": 1}
	for _, tc := range []struct {
		name    string
		region  string
		regions map[string]float64
		shares  map[string]float64
		want    float64
	}{
		{"one region", "us-east", nil, nil, 1},
		{"one region, no name", "", nil, nil, 1},
		{"one region, rule names it", "us-east", nil, map[string]float64{"us-east": 0.3}, 0.3},
		{"one region, rule names others", "ap-south", nil, map[string]float64{"us-east": 0.3}, 1},
		{"equal weights", "eu-west", threeRegions, nil, 1.0 / 3},
		{"weights", "us-east", weighted, nil, 0.5},
		{"weights, small region", "ap-south", weighted, nil, 0.25},
		{"rule's own share", "us-east", threeRegions, map[string]float64{"us-east": 0.6, "eu-west": 0.4}, 0.6},
		{"rule names every other region", "ap-south", threeRegions, map[string]float64{"us-east": 0.6, "eu-west": 0.4}, 0},
		{"rest split by weight", "ap-south", weighted, map[string]float64{"us-east": 0.6}, 0.2},
		{"rest split by weight, other", "eu-west", weighted, map[string]float64{"us-east": 0.6}, 0.2},
		{"named zero", "eu-west", threeRegions, map[string]float64{"eu-west": 0}, 0},
	} {
		got := DefaultShare(tc.region, tc.regions, tc.shares)
		if math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: DefaultShare = %g, want %g", tc.name, got, tc.want)
		}
	}
}

// The default split never hands out more than the whole limit, whatever a rule names.
func TestDefaultShareSumsToAtMostOne(t *testing.T) {
	weighted := map[string]float64{"us-east": 5, "eu-west": 1, "ap-south": 0.5}
	for _, shares := range []map[string]float64{
		nil, {"us-east": 0.2}, {"us-east": 0.2, "eu-west": 0.1}, {"us-east": 0.5, "eu-west": 0.5},
		{"us-east": 0.1, "eu-west": 0.1, "ap-south": 0.1}, {"ap-south": 1},
	} {
		sum := 0.0
		for r := range weighted {
			sum += DefaultShare(r, weighted, shares)
		}
		if sum > 1+1e-12 {
			t.Errorf("shares %v: default split sums to %g", shares, sum)
		}
	}
}

func TestDefaultSplitInSnapshot(t *testing.T) {
	in := `
rules:
  - id: default
    limits:
      - {name: second, rate: 30, per: 1s, burst: 60}
`
	c := mustCompile(t, in, CompileOptions{Region: "eu-west", Regions: threeRegions}).Rule("default")
	if math.Abs(c.Share-1.0/3) > 1e-12 || math.Abs(c.Limits[0].Rate-10) > 1e-9 || math.Abs(c.Limits[0].Burst-20) > 1e-9 {
		t.Fatalf("three equal regions: %+v", c)
	}
	if g := c.Global[0]; g.Rate != 30 || g.Burst != 60 {
		t.Fatalf("global: %+v", g)
	}
	if len(c.Split) != 3 || !near(c.Split["ap-south"], 1.0/3) {
		t.Fatalf("split: %v", c.Split)
	}
	// No region (the balancer, tools): the global limits, and the split over the regions.
	in2 := in + "  - id: pro\n    match: {plan: pro}\n    limits: [{name: second, rate: 10, per: 1s}]\n    shares: {us-east: 0.5}\n"
	snap := mustCompile(t, in2, CompileOptions{Regions: threeRegions})
	c = snap.Rule("pro")
	if c.Share != 1 || c.Limits[0].Rate != 10 || !near(c.Split["us-east"], 0.5) || !near(c.Split["eu-west"], 0.25) || !near(c.Split["ap-south"], 0.25) {
		t.Fatalf("no region: share %g, limits %+v, split %v", c.Share, c.Limits, c.Split)
	}
	if mustCompile(t, in, CompileOptions{Region: "us-east"}).Rule("default").Split != nil {
		t.Fatal("split without regions")
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestSharesValidation(t *testing.T) {
	in := `rules:
  - id: over
    limits:
      - {name: second, rate: 30, per: 1s}
    shares: {us-east: 0.6, eu-west: 0.5}
`
	s, err := parseSet([]byte(in), "rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := `rules: rules.yaml:5: rule "over": shares: {eu-west: 0.5, us-east: 0.6} sum to 1.1, more than 1`
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("sum above 1: got %v, want %s", err, want)
	}
	// Decimal shares that add to 1 up to rounding are fine.
	s = mustParse(t, "rules:\n  - id: ok\n    limits: [{name: s, rate: 1, per: 1s}]\n    shares: {us-east: 0.1, eu-west: 0.2, ap-south: 0.7}\n")
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}

	in = `rules:
  - id: typo
    limits:
      - {name: second, rate: 30, per: 1s}
    shares: {us-east: 0.5, eu-wst: 0.5}
`
	s, err = parseSet([]byte(in), "rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("a region name is only checked against the configured regions: %v", err)
	}
	want = `rules: rules.yaml:5: rule "typo": shares: region "eu-wst" is not one of the configured regions (ap-south, eu-west, us-east)`
	if _, err := Compile(s, CompileOptions{Region: "us-east", Regions: threeRegions}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("unknown region: got %v, want %s", err, want)
	}
	if _, err := Compile(s, CompileOptions{Region: "us-east"}); err != nil {
		t.Fatalf("one region: nothing to check the names against: %v", err)
	}
}

func TestLimitsFor(t *testing.T) {
	in := `
rules:
  - id: r
    limits:
      - {name: second, rate: 100, per: 1s, burst: 200}
      - {name: day, rate: 86400, per: 24h}
    cost: {"POST /big": 10}
`
	c := mustCompile(t, in, CompileOptions{Region: "us-east", Regions: threeRegions}).Rule("r")
	got := c.LimitsFor(c.Share, nil)
	for i := range got {
		if got[i] != c.Limits[i] {
			t.Fatalf("LimitsFor(Share)[%d] = %+v, Limits %+v", i, got[i], c.Limits[i])
		}
	}
	half := c.LimitsFor(0.5, nil)
	if half[0].Rate != 50 || half[0].Burst != 100 || half[0].Name != "r/second" {
		t.Fatalf("half: %+v", half[0])
	}
	// Near zero the same clamps as Compile: burst fits the largest cost, refill bounded.
	zero := c.LimitsFor(0, nil)
	if zero[0].Burst != 10 || zero[0].Rate != 10/MaxRefill.Seconds() {
		t.Fatalf("zero: %+v", zero[0])
	}
	dst := make([]bucket.Limit, 0, bucket.MaxLimits)
	if n := testing.AllocsPerRun(100, func() { dst = c.LimitsFor(0.25, dst[:0]) }); n != 0 {
		t.Fatalf("LimitsFor allocates %v times with room in dst", n)
	}
}
