package admin

import (
	"math"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/rules"
)

func compiled(t *testing.T, rate, burst float64) *rules.Compiled {
	t.Helper()
	snap, err := rules.Compile(&rules.Set{Rules: []rules.Rule{{ID: "tail",
		Limits: []rules.LimitSpec{{Name: "second", Rate: rate, Per: time.Second, Burst: burst}}}}}, rules.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return snap.Rule("tail")
}

var three = []string{"us-east", "eu-west", "ap-south"}

// A 4/s key of burst 4 offered 2/s over three regions: each region's 4/3 tokens refuse a
// fifth of its traffic; the advice is the least burst that brings every region under 3%.
func TestBurstCostNamesTheBurstThatServes(t *testing.T) {
	c := compiled(t, 4, 4)
	shares, demand := []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, []float64{2.0 / 3, 2.0 / 3, 2.0 / 3}
	refused, advice := burstCost(c, three, shares, demand)
	for _, r := range three {
		if math.Abs(refused[r]-0.257) > 0.002 {
			t.Errorf("%s refuses %.4f, want about 0.257 (4/3 tokens at 4/3 a second, offered 2/3)", r, refused[r])
		}
	}
	if advice == nil || advice.Limit != "tail/second" || advice.Now != 4 {
		t.Fatalf("advice %+v, want one for limit second from burst 4", advice)
	}
	at := func(burst float64) float64 { // what a region refuses at that global burst
		l := rules.ScaleLimit(bucket.Limit{Name: "second", Rate: 4, Burst: burst}, 1.0/3, 1)
		return bucket.PoissonRefused(l.Rate, l.Burst, 2.0/3)
	}
	if at(advice.Burst) > BurstShortAbove || at(advice.Burst-1) <= BurstShortAbove {
		t.Fatalf("advised burst %g refuses %.4f (%g refuses %.4f): not the least under %g",
			advice.Burst, at(advice.Burst), advice.Burst-1, at(advice.Burst-1), BurstShortAbove)
	}
	t.Logf("burst 4 over three regions refuses %.3f a region; a burst of %g: %.4f", refused["us-east"], advice.Burst, at(advice.Burst))
}

// The same key from one region holds the whole limit there: one bucket of 4/s, burst 4,
// offered 2/s, refuses under 1%, and nothing is advised. A region over its rate is the
// balancer's (its share is short, not its burst): no advice either.
func TestBurstCostQuietWhereTheBurstIsNotShort(t *testing.T) {
	c := compiled(t, 4, 4)
	refused, advice := burstCost(c, three, []float64{1, 0, 0}, []float64{2, 0, 0})
	if advice != nil || len(refused) != 1 || refused["us-east"] > 0.01 {
		t.Fatalf("one region: refused %v advice %+v", refused, advice)
	}
	refused, advice = burstCost(c, three, []float64{0.5, 0.5, 0}, []float64{3, 0, 0})
	if advice != nil || refused["us-east"] < 0.3 {
		t.Fatalf("a region over its rate: refused %v advice %+v, want a third refused and no advice", refused, advice)
	}
	if r, a := burstCost(c, three[:2], []float64{1}, []float64{1, 1}); r != nil || a != nil {
		t.Fatalf("shares of the wrong length: %v %+v", r, a)
	}
}

// A region whose part of the burst is under a token refuses everything whatever its rate:
// that is the burst's doing too. Near its rate it needs a burst past any bound: the advice
// then says none would do.
func TestBurstCostBoundsTheAdvice(t *testing.T) {
	c := compiled(t, 4, 4)
	refused, advice := burstCost(c, three, []float64{0.2, 0.8, 0}, []float64{0.3, 0, 0})
	if refused["us-east"] != 1 || advice == nil || advice.Burst < 5 {
		t.Fatalf("a region holding under a token of the burst: refused %v advice %+v, want everything and a burst of 5 or more", refused, advice)
	}
	l := rules.ScaleLimit(bucket.Limit{Name: "second", Rate: 4, Burst: advice.Burst}, 0.2, 1)
	if p := bucket.PoissonRefused(l.Rate, l.Burst, 0.3); p > BurstShortAbove {
		t.Fatalf("the advised burst %g refuses %.4f", advice.Burst, p)
	}
	_, advice = burstCost(c, three, []float64{0.05, 0.95, 0}, []float64{0.199, 0, 0})
	if advice == nil || advice.Burst != 0 {
		t.Fatalf("advice %+v, want none within %d times the burst", advice, maxAdvisedFactor)
	}
}
