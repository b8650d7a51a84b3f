package balancer

import "math"

// The caps on identities tracked and published: which to let go of when there are too many.

// demandOf is an identity's total smoothed demand (NaNs skipped), for eviction order.
func demandOf(id *ident) float64 {
	t := 0.0
	for _, d := range id.st.Smoothed {
		if !math.IsNaN(d) {
			t += d
		}
	}
	return t
}

type ranked struct {
	id *ident
	d  float64
}

// lowest returns the m least demanded of rs (in no particular order beyond that).
//
// It is a quickselect with median-of-three pivots and three-way partitions: O(len(rs))
// rather than a sort's O(n log n) — at 1,000,000 tracked identities the sort was 40% of a
// recompute — and deterministic (regionsim replays byte for byte). Ties at the boundary
// go to whichever the partitions leave first; NaN demands compare as ties.
func lowest(rs []ranked, m int) []ranked {
	lo, hi := 0, len(rs)
	for hi-lo > 1 {
		p := median3(rs[lo].d, rs[lo+(hi-lo)/2].d, rs[hi-1].d)
		lt, i, gt := lo, lo, hi // [lo,lt) < p, [lt,gt) == p, [gt,hi) > p
		for i < gt {
			switch d := rs[i].d; {
			case d < p:
				rs[lt], rs[i] = rs[i], rs[lt]
				lt++
				i++
			case d > p:
				gt--
				rs[i], rs[gt] = rs[gt], rs[i]
			default:
				i++
			}
		}
		switch {
		case m < lt:
			hi = lt
		case m > gt:
			lo = gt
		default: // the boundary falls in or at the edge of the block equal to p
			return rs[:m]
		}
	}
	return rs[:m]
}

func median3(a, b, c float64) float64 {
	if a > b {
		a, b = b, a
	}
	if b > c {
		b = c
	}
	return max(a, b)
}

// capPublished moves the least demanded targets back to the default split while more than
// MaxPublished targets differ from it.
func (c *Core) capPublished() {
	rs := c.rankBuf[:0]
	defer func() { clear(rs); c.rankBuf = rs[:0] }() // keep the space, not the identities
	for _, id := range c.all {
		if !equal(id.target(c.n), id.def) {
			rs = append(rs, ranked{id, demandOf(id)})
		}
	}
	if len(rs) <= c.cfg.MaxPublished {
		return
	}
	for _, x := range c.fairLowest(rs, len(rs)-c.cfg.MaxPublished, c.cfg.MaxPublished) {
		copy(x.id.target(c.n), x.id.def)
	}
}

// fairLowest returns the m of rs to let go of when rs holds m more than capacity: the
// least demanded, but only of regions holding more than their part of capacity
// (capacity / regions; an identity's region is the one with most of its smoothed demand),
// and never taking a region below its part. So each region keeps its most demanded
// identities up to its part whatever another region reports: identities one region
// invents (a certificate in an attacker's hands; refusals have no bound), or its own long
// tail, displace that region's identities only (issue 27 §1).
func (c *Core) fairLowest(rs []ranked, m, capacity int) []ranked {
	part := capacity / c.n
	byHome := make([][]ranked, c.n)
	for _, x := range rs {
		h := home(x.id)
		byHome[h] = append(byHome[h], x)
	}
	cand := rs[:0] // rs is copied out into byHome: its space is free
	for _, g := range byHome {
		if extra := len(g) - part; extra > 0 {
			cand = append(cand, lowest(g, extra)...)
		}
	}
	return lowest(cand, min(m, len(cand))) // Σ extra ≥ len(rs) − regions × part ≥ m
}

// home is the region with the most of id's smoothed demand (the first of a tie; region 0
// for an identity without any).
func home(id *ident) int {
	h, best := 0, 0.0
	for r, d := range id.st.Smoothed {
		if d > best {
			h, best = r, d
		}
	}
	return h
}

// capTracked marks the least demanded identities for eviction while more than
// MaxIdentities are tracked: those at the default split go at once (advance), the others
// once the plan has brought them back to it.
func (c *Core) capTracked() {
	over := len(c.ids) - c.cfg.MaxIdentities
	if over <= 0 {
		return
	}
	rs := c.rankBuf[:0]
	defer func() { clear(rs); c.rankBuf = rs[:0] }() // keep the space, not the identities
	for _, id := range c.all {
		rs = append(rs, ranked{id, demandOf(id)})
	}
	for _, x := range c.fairLowest(rs, over, c.cfg.MaxIdentities) {
		x.id.evict = true
		copy(x.id.target(c.n), x.id.def)
	}
}
