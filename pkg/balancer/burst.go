package balancer

import (
	"math"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/rules"
)

// What a rule's bursts, cut between the regions, cost an identity (the admin API's
// `shares`; `regionsim population -burst advised`). Each region enforces its share of
// every limit's rate and burst. A key far under its limit whose burst, cut two or three
// ways, leaves each region a token or two is refused its Poisson clumps whatever the
// shares: 4/s, burst 4, offered 2/s over three regions, 26% where one bucket of the limit
// would refuse 0.8%. The design keeps the regions' bursts within the global burst and
// makes no call across regions per check (docs/design.md §9, "Slack and the long tail"),
// so the remedy is the rule's: a larger burst. These figures tell an operator which keys
// need one and how large.
//
// What one bucket of the limit refuses of the key's whole traffic is the limit doing what
// it was written to do (a 2/s limit of burst 2 offered 1/s refuses a tenth of its clumps
// in a single region too); only the split's cost above that is named short.

// BurstShortAbove is how much more of a region's demand (a fraction of it) its bucket may
// refuse than one bucket of the global limit refuses of the key's whole demand before its
// cut of the burst is named short: the 3% regionsim's steady_ratio 0.97 allows.
const BurstShortAbove = 0.03

// MaxAdvisedFactor bounds the burst advice: a burst more than this many times the
// rule's is not advised (BurstAdvice.Burst 0).
const MaxAdvisedFactor = 64

// BurstAdvice names, for one of the rule's limits, the smallest burst at which no region
// under its rate refuses more than BurstShortAbove over what one bucket of the limit at
// that burst refuses of the key's whole demand, at the shares and demands given.
type BurstAdvice struct {
	Limit string  `json:"limit"`
	Now   float64 `json:"now"`   // the limit's global burst
	Burst float64 `json:"burst"` // advised; 0 when none up to MaxAdvisedFactor × Now would do
}

// underRate: demand is under the region's share of g's rate, so what its bucket refuses
// above the limit's own is its burst's doing (a part of the burst under one token holds
// nothing, and refuses everything, at any rate). A region over its rate is short of
// share, which is the balancer's to move.
func underRate(g bucket.Limit, share, demand float64) bool { return demand < g.Rate*share }

// BurstCost returns, for each region with demand (tokens/s, one token a request,
// Poisson), the fraction of it that region's bucket refuses at its share of the limits
// global (rules.ScaleLimit; maxCost is the rule's largest cost), NaN for a region
// without demand; and the advice, when a region under its rate refuses more than
// BurstShortAbove over what one bucket of the limit refuses of the key's whole demand.
// Each limit is taken alone and the largest refusal kept: it errs under where two limits
// refuse different requests. nil, nil when shares and demand differ in length or there
// is no limit.
func BurstCost(global []bucket.Limit, maxCost float64, shares, demand []float64) ([]float64, *BurstAdvice) {
	if len(shares) != len(demand) || len(global) == 0 {
		return nil, nil
	}
	total := 0.0
	for _, d := range demand {
		if d > 0 {
			total += d
		}
	}
	// allowed is what a region may refuse of limit g at burst: one bucket of g as
	// written refuses that much of the whole demand, and BurstShortAbove more.
	allowed := func(g bucket.Limit) float64 {
		l := rules.ScaleLimit(g, 1, maxCost)
		return bucket.PoissonRefused(l.Rate, l.Burst, total) + BurstShortAbove
	}
	// refusedAt is what region i's bucket refuses of its demand at its share of g.
	refusedAt := func(g bucket.Limit, i int) float64 {
		l := rules.ScaleLimit(g, shares[i], maxCost)
		return bucket.PoissonRefused(l.Rate, l.Burst, demand[i])
	}
	// short: region i, with demand under its rate of g, refuses p, past bound.
	short := func(g bucket.Limit, i int, p, bound float64) bool {
		return underRate(g, shares[i], demand[i]) && p > bound
	}
	refused := make([]float64, len(shares))
	for i := range refused {
		if !(demand[i] > 0) {
			refused[i] = math.NaN()
		}
	}
	worst, worstLimit := 0.0, -1
	for j, g := range global {
		bound := allowed(g)
		for i := range shares {
			if !(demand[i] > 0) {
				continue
			}
			p := refusedAt(g, i)
			refused[i] = max(refused[i], p)
			if short(g, i, p, bound) && p-bound > worst {
				worst, worstLimit = p-bound, j
			}
		}
	}
	if worstLimit < 0 {
		return refused, nil
	}
	g := global[worstLimit]
	advice := &BurstAdvice{Limit: g.Name, Now: g.Burst}
	// served: at burst, every region under its rate is within BurstShortAbove of one
	// bucket of the limit at that burst, so that BurstCost at the advised burst advises
	// nothing more.
	served := func(burst float64) bool {
		h := g
		h.Burst = burst
		bound := allowed(h)
		for i := range shares {
			if demand[i] > 0 && short(g, i, refusedAt(h, i), bound) {
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
		if hi > g.Burst*MaxAdvisedFactor {
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
