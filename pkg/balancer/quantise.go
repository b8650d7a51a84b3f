package balancer

import (
	"cmp"
	"math"
	"slices"

	"github.com/allot-dev/allot/pkg/rules"
)

// SmallBurst is the burst, in requests of a rule's largest cost, below which an
// identity's target shares go through quantise. Above it the enforcers' rounding of each
// region's burst down to whole tokens costs at most one token a region — under 1% of the
// burst per region, nothing of the rate — and shares are left as the policy computed
// them.
const SmallBurst = 100

// quantEps absorbs float error in share ÷ unit (3 × 1/3 is 0.999…).
const quantEps = 1e-9

// quantise hands the targets of the free regions (held[r] NaN) out so that each holds
// one request of the burst or more, or none, in place, keeping their sum.
//
// An enforcer holds burst × share tokens of an identity's burst, and none when that is
// under one request (rules.Compiled.LimitsFor), so a share under one request is wasted:
// 1/3 of a burst of 1 holds nothing in any of three regions. With u = 1/requests, the
// share of one request, the holders are chosen in whole requests:
//
//	A   = floor(Σ_free target_r / u)             requests to hand out
//	m_r = floor(target_r / u)                    each region's whole requests
//	the A − Σ m_r left go one each to the regions with demand (smoothed > 0) before
//	the idle ones (an idle region's slack is a reserve, a request of burst is what a
//	region with traffic refuses without), each group by the largest remainder
//	target_r / u − m_r (a region with demand that holds that request now, pub_r ≥
//	(m_r + 1) u, ranks 0.25 higher so noise does not move a token back and forth; an
//	idle holder does not; ties: the larger smoothed demand, then the first region);
//
// the regions with m_r ≥ 1 hold, and the others get 0. Under rules.FractionBelow
// requests the holders share Σ_free target: one request each, and the rest in
// proportion to how far each one's target is above one request (equally when none is),
// as the enforcers keep such a burst's fractions: a 5/s key offered about 1.2/s in each
// of two regions holds 2.5 requests of burst in each, where whole requests (3 and 2) left
// the region with two refusing its Poisson bursts. From rules.FractionBelow up, where
// the enforcers round bursts down to whole tokens, target_r = m_r × u, plus the fraction
// Σ_free target − A × u (under one request) to the region holding the most, so the rate
// is not lost: whole requests are hysteresis there, a target that moves by less than a
// request publishes nothing.
//
// Example: burst 1, targets (0.98, 0.01, 0.01): A = 1, m = (0, 0, 0), the request goes
// to the first region: (1, 0, 0). Targets (0.5, 0.25, 0.25) of a burst of 4: A = 4,
// m = (2, 1, 1): unchanged. Targets (0.6, 0.3, 0.1) of a burst of 6: m = (4, 2, 0)
// after the two left over; the 0.1 goes to the holders: (0.676, 0.324, 0); of a burst of
// 60, (0.6, 0.3, 0.1) as they are.
//
// Which way it errs: under, never over. The sum does not grow, so share.Step's invariant
// (Σ ≤ 1 at every instant) holds as before, and a region whose part is under one request
// refuses until a request is moved to it; its traffic still counts as demand (its
// refusals are reported), so the request moves to where it is asked for. Held regions
// keep their targets.
func quantise(tgt, held, smoothed, pub []float64, requests float64) {
	u := 1 / requests
	var free []int
	sum := 0.0
	for r := range tgt {
		if math.IsNaN(held[r]) {
			free = append(free, r)
			sum += tgt[r]
		}
	}
	a := math.Floor(sum/u + quantEps)
	if a < 1 || len(free) == 0 {
		return // not one request to hand out: every free region holds none whatever
	}
	m := make([]float64, len(tgt))
	rank := make([]float64, len(tgt))
	holds := make([]bool, len(tgt)) // holds a leftover request now (pub)
	given := 0.0
	for _, r := range free {
		x := tgt[r] / u
		m[r] = math.Floor(x + quantEps)
		rank[r] = max(x-m[r], 0)
		holds[r] = r < len(pub) && pub[r]/u >= m[r]+1-quantEps
		given += m[r]
		// Sticky to a holder that has demand, never to an idle one: a 2/s key's token
		// stayed with an idle region while the region its traffic came from refused all
		// of it, and a 6/s key's sixth token stayed with an idle region while a region
		// offered 1.2/s held one (steady_ratio 0.85; 0.98 without).
		if holds[r] && r < len(smoothed) && smoothed[r] > 0 {
			rank[r] += 0.25
		}
	}
	for given > a { // float error only: Σ m_r can pass A by n × quantEps
		low := -1
		for _, r := range free {
			if m[r] > 0 && (low < 0 || rank[r] < rank[low]) {
				low = r
			}
		}
		m[low]--
		given--
	}
	dem := func(r int) float64 {
		if r < len(smoothed) && !math.IsNaN(smoothed[r]) {
			return smoothed[r]
		}
		return 0
	}
	order := slices.Clone(free)
	has := func(r int) int { // 1: the region has demand
		if dem(r) > 0 {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(order, func(p, q int) int {
		return cmp.Or(cmp.Compare(has(q), has(p)), cmp.Compare(rank[q], rank[p]), cmp.Compare(dem(q), dem(p)))
	})
	for _, r := range order {
		if given >= a {
			break
		}
		m[r]++
		given++
	}
	if requests >= rules.FractionBelow {
		top := free[0]
		for _, r := range free {
			tgt[r] = m[r] * u
			if m[r] > m[top] || m[r] == m[top] && dem(r) > dem(top) {
				top = r
			}
		}
		tgt[top] += max(sum-a*u, 0)
		return
	}
	// The holders (m_r ≥ 1) share the free regions' sum: one request each, and what is
	// left in proportion to how far each target is above one request.
	holders, excess := 0.0, 0.0
	for _, r := range free {
		if m[r] >= 1 {
			holders++
			excess += max(tgt[r]-u, 0)
		}
	}
	left := max(sum-holders*u, 0)
	for _, r := range free {
		switch {
		case m[r] < 1:
			tgt[r] = 0
		case excess > 0:
			tgt[r] = u + left*max(tgt[r]-u, 0)/excess
		default:
			tgt[r] = u + left/holders
		}
	}
}
