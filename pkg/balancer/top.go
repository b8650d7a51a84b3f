package balancer

import "slices"

// What the core says of its identities, for tools and dashboards: one identity's state
// (Identity) and the most demanded ones (Top).

// IdentityState is one tracked identity as the core sees it, by region (copies).
type IdentityState struct {
	Rate      float64   // global rate, tokens/s
	Default   []float64 // default split
	Published []float64 // in the newest version
	Target    []float64 // where the plan is going
	Smoothed  []float64 // smoothed demand, tokens/s (nil before the first recompute)
	Pending   bool      // the plan has not finished (or a region may still apply an older version)
	// Version is the version Published took its value at: a region whose acknowledged
	// version (RegionStats.Acked) is below it may still apply an older share.
	Version uint64
}

// Identity returns the state of (rule, identity); ok is false when it is not tracked
// (it has the default split). For tools (explain) and simulations.
func (c *Core) Identity(rule, identity string) (IdentityState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.ids[key{rule, identity}]
	if id == nil {
		return IdentityState{}, false
	}
	return IdentityState{
		Rate: id.rate, Default: slices.Clone(id.def), Published: slices.Clone(id.published(c.n)),
		Target: slices.Clone(id.target(c.n)), Smoothed: slices.Clone(id.st.Smoothed), Pending: id.pending,
		Version: id.pubVer,
	}, true
}

// TopIdentity is one of the most demanded identities (Core.Top).
type TopIdentity struct {
	Rule, Identity string
	Demand         float64 // Σ over regions of the smoothed demand, tokens/s
	IdentityState
}

// Top returns at most n tracked identities with the largest total smoothed demand (> 0),
// most demanded first, ties by (rule, identity). For dashboards: it walks every tracked
// identity under the mutex (O(tracked × log n), no allocation beyond the n results;
// BenchmarkTop20Of1M), holding reports back meanwhile, so call it about once an interval,
// not per request.
func (c *Core) Top(n int) []TopIdentity {
	if n <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	less := func(a, b ranked) bool { // a ranks below b
		if a.d != b.d {
			return a.d < b.d
		}
		return a.id.k.rule > b.id.k.rule || (a.id.k.rule == b.id.k.rule && a.id.k.identity > b.id.k.identity)
	}
	h := make([]ranked, 0, min(n, len(c.all))) // a min-heap on less: h[0] ranks lowest
	for _, id := range c.all {
		x := ranked{id, demandOf(id)}
		if !(x.d > 0) {
			continue
		}
		switch {
		case len(h) < n:
			h = append(h, x)
			for i := len(h) - 1; i > 0 && less(h[i], h[(i-1)/2]); i = (i - 1) / 2 {
				h[i], h[(i-1)/2] = h[(i-1)/2], h[i]
			}
		case less(h[0], x):
			h[0] = x
			for i := 0; ; {
				m, l, r := i, 2*i+1, 2*i+2
				if l < len(h) && less(h[l], h[m]) {
					m = l
				}
				if r < len(h) && less(h[r], h[m]) {
					m = r
				}
				if m == i {
					break
				}
				h[i], h[m] = h[m], h[i]
				i = m
			}
		}
	}
	slices.SortFunc(h, func(a, b ranked) int {
		switch {
		case less(b, a):
			return -1
		case less(a, b):
			return 1
		}
		return 0
	})
	out := make([]TopIdentity, len(h))
	for i, x := range h {
		id := x.id
		out[i] = TopIdentity{Rule: id.k.rule, Identity: id.k.identity, Demand: x.d, IdentityState: IdentityState{
			Rate: id.rate, Default: slices.Clone(id.def), Published: slices.Clone(id.published(c.n)),
			Target: slices.Clone(id.target(c.n)), Smoothed: slices.Clone(id.st.Smoothed), Pending: id.pending,
			Version: id.pubVer,
		}}
	}
	return out
}
