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
	// Under one request's largest cost (10 tokens) a region holds none of the burst.
	for _, s := range []float64{0, 0.01, 0.049} {
		if l := c.LimitsFor(s, nil); l[0].Burst != 0 || l[0].Rate != 0 || !NoTokens(l) {
			t.Fatalf("share %g: %+v", s, l)
		}
	}
	if l := c.LimitsFor(0.05, nil); l[0].Burst != 10 || l[0].Rate != 5 || NoTokens(l) {
		t.Fatalf("share 0.05: %+v", l)
	}
	dst := make([]bucket.Limit, 0, bucket.MaxLimits)
	if n := testing.AllocsPerRun(100, func() { dst = c.LimitsFor(0.25, dst[:0]) }); n != 0 {
		t.Fatalf("LimitsFor allocates %v times with room in dst", n)
	}
}

// Small limits (docs/design.md §9, issue 21 §1c): the regions' bursts sum to at most the global
// burst, and a region whose part is under one request holds none. Rounding a region's
// part of the burst up to one request let a 1-a-minute, burst-1 rule admit one request in
// each of five regions at once.
func TestSmallLimitsNeverOver(t *testing.T) {
	in := `
rules:
  - id: reset
    limits:
      - {name: minute, rate: 1, per: 1m, burst: 1}
  - id: otp
    limits:
      - {name: minute, rate: 6, per: 1m, burst: 1}
  - id: login
    limits:
      - {name: minute, rate: 10, per: 1m, burst: 5}
    cost: {"POST /sms": 2}
`
	five := map[string]float64{"us-east": 1, "eu-west": 1, "ap-south": 1, "sa-east": 1, "af-south": 1}
	for _, id := range []string{"reset", "otp", "login"} {
		global := mustCompile(t, in, CompileOptions{Regions: five}).Rule(id).Global[0]
		burst, rate := 0.0, 0.0
		for r := range five {
			c := mustCompile(t, in, CompileOptions{Region: r, Regions: five}).Rule(id)
			l := c.Limits[0]
			if l.Burst != 0 && l.Burst < c.MaxCost() {
				t.Fatalf("%s in %s: burst %g is under one request of cost %g", id, r, l.Burst, c.MaxCost())
			}
			burst += l.Burst
			rate += l.Rate
		}
		if burst > global.Burst || rate > global.Rate*(1+1e-12) {
			t.Fatalf("%s: five regions hold bursts %g and rates %g/s of a global %g, %g/s", id, burst, rate, global.Burst, global.Rate)
		}
	}
	// The default split of burst 1 over five regions is 0.2 each: nobody holds a token
	// until the balancer moves one (under, never over).
	c := mustCompile(t, in, CompileOptions{Region: "eu-west", Regions: five}).Rule("reset")
	if !NoTokens(c.Limits) {
		t.Fatalf("reset at 1/5: %+v", c.Limits)
	}
	// login, burst 5 and a cost of 2: 5/5 = 1 token is under one request of cost 2.
	if c := mustCompile(t, in, CompileOptions{Region: "eu-west", Regions: five}).Rule("login"); !NoTokens(c.Limits) {
		t.Fatalf("login at 1/5: %+v", c.Limits)
	}
	// A part of one request or more is held as it is (0.5 of a burst of 3 is 1.5
	// tokens); one under a request is none, and 3 × 1/3 of a burst of 3 is one token
	// each, float error or not.
	c = mustCompile(t, in, CompileOptions{Region: "eu-west", Regions: five}).Rule("otp")
	for _, tc := range []struct{ share, burst, rate float64 }{
		{1, 1, 0.1}, {0.999, 0, 0}, {0.5, 0, 0}, {0, 0, 0},
	} {
		if l := c.LimitsFor(tc.share, nil)[0]; l.Burst != tc.burst || math.Abs(l.Rate-tc.rate) > 1e-12 {
			t.Errorf("otp at share %g: %+v, want burst %g rate %g", tc.share, l, tc.burst, tc.rate)
		}
	}
	three := mustCompile(t, "rules:\n  - id: r\n    limits: [{name: s, rate: 3, per: 1s, burst: 3}]\n", CompileOptions{Region: "eu-west", Regions: threeRegions}).Rule("r")
	if l := three.Limits[0]; l.Burst != 1 || math.Abs(l.Rate-1) > 1e-12 {
		t.Fatalf("burst 3 over three regions: %+v", l)
	}
	for _, tc := range []struct{ share, burst float64 }{{0.5, 1.5}, {0.4, 1.2}, {0.3, 0}, {0.9, 2.7}} {
		if l := three.LimitsFor(tc.share, nil)[0]; math.Abs(l.Burst-tc.burst) > 1e-9 || tc.burst > 0 && math.Abs(l.Rate-3*tc.share) > 1e-12 {
			t.Errorf("burst 3 at share %g: %+v, want burst %g", tc.share, l, tc.burst)
		}
	}
	// One region (no balancer): the global limit as written, as before.
	if l := mustCompile(t, in, CompileOptions{Region: "eu-west"}).Rule("reset").Limits[0]; l.Burst != 1 || l.Rate != 1.0/60 {
		t.Fatalf("one region: %+v", l)
	}
}
