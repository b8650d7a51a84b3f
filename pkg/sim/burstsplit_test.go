package sim

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// predictedSplit is steady_split as bucket.PoissonRefused predicts it for a key of one
// phase: each region's bucket at its part of the traffic (rate × w, burst × w) refuses
// PoissonRefused of its arrivals, and the judge divides what is admitted by
// Σ min(arrivals in a second, rate), whose mean is E[min(N, rate)] for N Poisson with the
// key's total rate.
func predictedSplit(k scenario.Key) float64 {
	total := 0.0
	for _, o := range k.Phases[0].Offered {
		total += o
	}
	refused := 0.0
	for _, o := range k.Phases[0].Offered {
		if o > 0 {
			w := o / total
			refused += o * bucket.PoissonRefused(k.Limit.PerSecond()*w, k.Limit.Burst*w, o)
		}
	}
	capped, p := 0.0, math.Exp(-total) // E[min(N, rate)]
	for n := 0; n < 1000 && (float64(n) < 4*total+20); n++ {
		capped += p * math.Min(float64(n), k.Limit.PerSecond())
		p *= total / float64(n+1)
	}
	return (total - refused) / capped
}

// The balancer's burst figures (`balancer shares`: bucket.PoissonRefused at each region's
// share) say what the simulator's split reference measures: over the 10,000-key
// population's tail keys k03000–k03999 used from two or three regions (long-tail.yaml's
// own lines and arrivals, ten minutes), PoissonRefused's prediction of steady_split is
// within sampling error of it (a key of a few requests a second brings a few thousand to
// its 570 steady seconds: about ±1%), and the two agree on which keys fall under 0.97.
func TestPoissonRefusedPredictsTheSplitReference(t *testing.T) {
	t.Parallel()
	sc := load(t, "long-tail.yaml")
	sc.Keys = slices.DeleteFunc(sc.Keys, func(k scenario.Key) bool {
		return k.Name < "k03000" || k.Name >= "k04000" || len(k.Phases) != 1 || k.Phases[0].Regions() < 2
	})
	res, err := Run(sc, Options{Policy: PolicyStatic, SummaryOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var diffs []float64
	disagree := []string{}
	under := 0
	for i, v := range res.Verdicts {
		want := predictedSplit(sc.Keys[i])
		diffs = append(diffs, want-v.SteadySplit)
		if (want < 0.97) != (v.SteadySplit < 0.97) {
			disagree = append(disagree, fmt.Sprintf("%s %.3f/%.3f", v.Key, want, v.SteadySplit))
		}
		if v.SteadySplit < 0.97 {
			under++
		}
	}
	slices.Sort(diffs)
	n := len(diffs)
	t.Logf("%d keys, %d under 0.97 by the split reference; predicted − measured: 10th percentile %.4f, median %.4f, 90th %.4f; %d disagree on 0.97",
		n, under, diffs[n/10], diffs[n/2], diffs[9*n/10], len(disagree))
	if n < 300 || math.Abs(diffs[n/2]) > 0.005 || diffs[n/10] < -0.02 || diffs[9*n/10] > 0.02 || len(disagree) > n/20 {
		t.Errorf("prediction off: %d keys, median %.4f, 10th–90th percentile %.4f–%.4f, %d disagree: %v",
			n, diffs[n/2], diffs[n/10], diffs[9*n/10], len(disagree), disagree)
	}
}
