package admin

import (
	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/rules"
)

// What a rule's bursts, cut between the regions, cost an identity (SharesEntry.Refused and
// BurstAdvice). Each region enforces its share of every limit's rate and burst; a key far
// under its limit whose burst, cut two or three ways, leaves each region a token or two
// is refused its Poisson clumps whatever the shares (4/s, burst 4, offered 2/s over three
// regions: about 20% where one bucket would refuse 0.8%). The design keeps the regions'
// bursts within the global burst and makes no call across regions per check
// (docs/design.md §9, "Slack and the long tail"), so the remedy is the rule's: a larger
// burst. These figures tell an operator which keys need one and how large.

// BurstShortAbove is the refused fraction of a region's demand, under its rate, above
// which its cut of the burst is named short (the steady_ratio 0.97 regionsim judges by).
const BurstShortAbove = 0.03

// maxAdvisedFactor bounds the burst advice: a burst more than this many times the
// rule's is not advised (BurstAdvice.Burst 0).
const maxAdvisedFactor = 64

// BurstAdvice names the smallest burst for one of the rule's limits at which no region's
// bucket refuses more than BurstShortAbove of a demand under its rate, at the shares and
// demands the leader holds now.
type BurstAdvice struct {
	Limit string  `json:"limit"`
	Now   float64 `json:"now"`   // the limit's global burst
	Burst float64 `json:"burst"` // advised; 0 when none up to 64 times Now would do
}

// underRate: demand is under the region's share of g's rate, so what its bucket refuses
// is its burst's doing (a part of the burst under one token holds nothing, and refuses
// everything, at any rate).
func underRate(g bucket.Limit, share, demand float64) bool { return demand < g.Rate*share }

// burstCost returns, by region with demand, the fraction of its demand (tokens/s, one
// token a request, Poisson) that its bucket at its share refuses (every limit alone, the
// largest kept: it errs under where two limits refuse different requests), and the burst
// advice when a region under its rate refuses more than BurstShortAbove.
func burstCost(c *rules.Compiled, regions []string, shares, demand []float64) (map[string]float64, *BurstAdvice) {
	if len(shares) != len(regions) || len(demand) != len(regions) || len(c.Global) == 0 {
		return nil, nil
	}
	refused := map[string]float64{}
	worst, worstLimit := 0.0, -1
	for i, region := range regions {
		if !(demand[i] > 0) {
			continue
		}
		r := 0.0
		for j, g := range c.Global {
			l := rules.ScaleLimit(g, shares[i], c.MaxCost())
			p := bucket.PoissonRefused(l.Rate, l.Burst, demand[i])
			r = max(r, p)
			if underRate(g, shares[i], demand[i]) && p > BurstShortAbove && p > worst {
				worst, worstLimit = p, j
			}
		}
		refused[region] = r
	}
	if worstLimit < 0 {
		return refused, nil
	}
	g := c.Global[worstLimit]
	advice := &BurstAdvice{Limit: g.Name, Now: g.Burst}
	served := func(burst float64) bool {
		h := g
		h.Burst = burst
		for i := range regions {
			l := rules.ScaleLimit(h, shares[i], c.MaxCost())
			if demand[i] > 0 && underRate(g, shares[i], demand[i]) && bucket.PoissonRefused(l.Rate, l.Burst, demand[i]) > BurstShortAbove {
				return false
			}
		}
		return true
	}
	// Refusals fall as the burst grows (each region's part of it does, whole tokens from
	// rules.FractionBelow up), so: double to a burst that serves, then halve the gap. A
	// part that loses its fraction as the global burst reaches FractionBelow (6.6 tokens
	// become 6) is the one place they do not: there the advice may be a few tokens over
	// the least that would do.
	lo, hi := g.Burst, g.Burst
	for !served(hi) {
		lo, hi = hi, hi*2
		if hi > g.Burst*maxAdvisedFactor {
			return refused, advice
		}
	}
	for hi-lo > 1 {
		mid := lo + float64(int64((hi-lo)/2))
		if served(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	advice.Burst = hi
	return refused, advice
}
