package balancer

import (
	"math"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/rules"
)

func burstRule(t *testing.T, rate, burst float64) *rules.Compiled {
	t.Helper()
	snap, err := rules.Compile(&rules.Set{Rules: []rules.Rule{{ID: "tail",
		Limits: []rules.LimitSpec{{Name: "second", Rate: rate, Per: time.Second, Burst: burst}}}}}, rules.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return snap.Rule("tail")
}

// cost is BurstCost of c's limits.
func cost(c *rules.Compiled, shares, demand []float64) ([]float64, *BurstAdvice) {
	return BurstCost(c.Global, c.MaxCost(), shares, demand)
}

// A 4/s key of burst 4 offered 2/s over three regions: each region's 4/3 tokens refuse a
// fifth of its traffic; the advice is the least burst that brings every region under 3%.
func TestBurstCostNamesTheBurstThatServes(t *testing.T) {
	c := burstRule(t, 4, 4)
	shares, demand := []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, []float64{2.0 / 3, 2.0 / 3, 2.0 / 3}
	refused, advice := cost(c, shares, demand)
	for r, f := range refused {
		if math.Abs(f-0.257) > 0.002 {
			t.Errorf("region %d refuses %.4f, want about 0.257 (4/3 tokens at 4/3 a second, offered 2/3)", r, f)
		}
	}
	if advice == nil || advice.Limit != "tail/second" || advice.Now != 4 {
		t.Fatalf("advice %+v, want one for limit second from burst 4", advice)
	}
	at := func(burst float64) float64 { // what a region refuses at that global burst
		l := rules.ScaleLimit(bucket.Limit{Name: "second", Rate: 4, Burst: burst}, 1.0/3, 1)
		return bucket.PoissonRefused(l.Rate, l.Burst, 2.0/3)
	}
	// One bucket of 4/s at burst b refuses some of 2/s: a region may refuse 3 points more.
	bound := func(b float64) float64 { return bucket.PoissonRefused(4, b, 2) + BurstShortAbove }
	if at(advice.Burst) > bound(advice.Burst) || at(advice.Burst-1) <= bound(advice.Burst-1) {
		t.Fatalf("advised burst %g refuses %.4f (%g refuses %.4f): not the least within 3 points of one bucket",
			advice.Burst, at(advice.Burst), advice.Burst-1, at(advice.Burst-1))
	}
	if _, again := cost(burstRule(t, 4, advice.Burst), shares, demand); again != nil {
		t.Fatalf("at the advised burst %g, advice again: %+v", advice.Burst, again)
	}
	t.Logf("burst 4 over three regions refuses %.3f a region; a burst of %g: %.4f", refused[0], advice.Burst, at(advice.Burst))
}

// The same key from one region holds the whole limit there: one bucket of 4/s, burst 4,
// offered 2/s, refuses under 1%, and nothing is advised. A 2/s key of burst 2 offered 1/s
// from one region refuses a tenth of it, and nothing is advised either: that is the limit
// as written. A region over its rate is the balancer's (its share is short, not its
// burst): no advice.
func TestBurstCostQuietWhereTheBurstIsNotShort(t *testing.T) {
	c := burstRule(t, 4, 4)
	refused, advice := cost(c, []float64{1, 0, 0}, []float64{2, 0, 0})
	if advice != nil || len(refused) != 3 || refused[0] > 0.01 || !math.IsNaN(refused[1]) {
		t.Fatalf("one region: refused %v advice %+v", refused, advice)
	}
	refused, advice = cost(burstRule(t, 2, 2), []float64{1, 0, 0}, []float64{1, 0, 0})
	if advice != nil || refused[0] < 0.09 {
		t.Fatalf("a 2/s key of burst 2 offered 1/s from one region: refused %v advice %+v, want a tenth and no advice", refused, advice)
	}
	refused, advice = cost(c, []float64{0.5, 0.5, 0}, []float64{3, 0, 0})
	if advice != nil || refused[0] < 0.3 {
		t.Fatalf("a region over its rate: refused %v advice %+v, want a third refused and no advice", refused, advice)
	}
	if r, a := cost(c, []float64{1}, []float64{1, 1}); r != nil || a != nil {
		t.Fatalf("shares of the wrong length: %v %+v", r, a)
	}
}

// A region whose part of the burst is under a token refuses everything whatever its rate:
// that is the burst's doing too. Near its rate it needs a burst past any bound: the advice
// then says none would do.
func TestBurstCostBoundsTheAdvice(t *testing.T) {
	c := burstRule(t, 4, 4)
	refused, advice := cost(c, []float64{0.2, 0.8, 0}, []float64{0.3, 0, 0})
	if refused[0] != 1 || advice == nil || advice.Burst < 5 {
		t.Fatalf("a region holding under a token of the burst: refused %v advice %+v, want everything and a burst of 5 or more", refused, advice)
	}
	l := rules.ScaleLimit(bucket.Limit{Name: "second", Rate: 4, Burst: advice.Burst}, 0.2, 1)
	if p := bucket.PoissonRefused(l.Rate, l.Burst, 0.3); p > BurstShortAbove {
		t.Fatalf("the advised burst %g refuses %.4f", advice.Burst, p)
	}
	_, advice = cost(c, []float64{0.05, 0.95, 0}, []float64{0.199, 0, 0})
	if advice == nil || advice.Burst != 0 {
		t.Fatalf("advice %+v, want none within %d times the burst", advice, MaxAdvisedFactor)
	}
}
