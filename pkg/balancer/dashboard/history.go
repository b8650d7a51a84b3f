package dashboard

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/balancer"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// History is the dashboard's memory: a ring of at most Samples samples, each holding the
// regions' state and the Top most demanded identities at one instant, plus the admitted
// and refused counts of the reports accepted since the previous sample (per region, and
// per identity for the identities of the previous sample's top only). Its size is bounded
// by the configuration alone (see the package doc), whatever the reports name: an
// identity enters only by being among the Core's Top by demand. Safe for concurrent use
// (one mutex, never held while calling the Core). Build it with NewHistory.
type History struct {
	mu sync.Mutex // mu guards ring, next, n, last, regAcc, tracked

	ring    []sample
	next, n int // next slot to write; samples held
	last    time.Time
	regAcc  []counts           // per region, since last
	tracked map[idKey][]counts // the last sample's top: per region, since last

	top       int
	regions   []string
	regionIdx map[string]int
}

type idKey struct{ rule, identity string }

type counts struct{ admitted, refused float64 }

// sample is one instant. Once in the ring it is never modified, so readers share it.
type sample struct {
	at                       time.Time
	term                     int64
	version, landed          uint64
	learning                 bool
	tracked, listed, pending int
	regions                  []regionSample
	ids                      []idSample
}

type regionSample struct {
	balancer.RegionStats
	admitted, refused float64 // tokens/s since the previous sample; NaN: unknown
}

// idSample is one identity in one sample; vals holds, per region, its published share,
// smoothed demand (tokens/s), admitted/s and refused/s (NaN: not tracked then).
type idSample struct {
	k       idKey
	rate    float64
	demand  float64 // Σ smoothed demand
	version uint64
	pending bool
	vals    []float64
}

func (s *idSample) share(n int) []float64    { return s.vals[:n:n] }
func (s *idSample) smoothed(n int) []float64 { return s.vals[n : 2*n : 2*n] }
func (s *idSample) admitted(n int) []float64 { return s.vals[2*n : 3*n : 3*n] }
func (s *idSample) refused(n int) []float64  { return s.vals[3*n : 4*n : 4*n] }

// NewHistory keeps samples samples of the top identities over regions (the Core's
// order). samples and top must be > 0 (Config.Validate checks them).
func NewHistory(regions []string, samples, top int) *History {
	h := &History{ring: make([]sample, samples), top: top, regions: slices.Clone(regions),
		regionIdx: make(map[string]int, len(regions)), regAcc: make([]counts, len(regions)), tracked: map[idKey][]counts{}}
	for i, r := range regions {
		h.regionIdx[r] = i
	}
	return h
}

// Observe counts one accepted report's admitted and refused tokens: per region always,
// per identity only for the identities of the last sample's top (others are ignored, so
// keys invented by a client cost nothing here). A retried report the Core deduplicated is
// counted again: the figures are for reading, the Core's are the ones that decide.
func (h *History) Observe(r *allotv1.ReportRequest) {
	if r == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ri, ok := h.regionIdx[r.GetRegion()]
	if !ok {
		return
	}
	for _, u := range r.GetUsage() {
		a, x := u.GetAdmitted(), u.GetRefused()
		if !count(a) || !count(x) {
			continue
		}
		h.regAcc[ri].admitted += a
		h.regAcc[ri].refused += x
		if c := h.tracked[idKey{u.GetRule(), u.GetIdentity()}]; c != nil {
			c[ri].admitted += a
			c[ri].refused += x
		}
	}
}

func count(v float64) bool { return v >= 0 && !math.IsInf(v, 0) }

// Sample records core's state at now as the newest sample (the oldest drops out when
// the ring is full). A nil core (a standby) records nothing and forgets the counts since
// the last sample: a replica's history holds its own terms only.
func (h *History) Sample(now time.Time, core *balancer.Core) {
	if core == nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		clear(h.regAcc)
		clear(h.tracked)
		h.last = time.Time{}
		return
	}
	st := core.Stats(now) // the Core's mutex, then ours: never both at once
	top := core.Top(h.top)
	n := len(h.regions)
	h.mu.Lock()
	defer h.mu.Unlock()
	dt := math.NaN()
	if !h.last.IsZero() && now.After(h.last) {
		dt = now.Sub(h.last).Seconds()
	}
	s := sample{at: now, term: st.LeaderRev, version: st.Version, landed: st.Landed, learning: st.Learning,
		tracked: st.Tracked, listed: st.Listed, pending: st.Pending}
	for i, rs := range st.Regions {
		x := regionSample{RegionStats: rs, admitted: math.NaN(), refused: math.NaN()}
		if i < n {
			x.admitted, x.refused = h.regAcc[i].admitted/dt, h.regAcc[i].refused/dt
		}
		s.regions = append(s.regions, x)
	}
	vals := make([]float64, 4*n*len(top))
	tracked := make(map[idKey][]counts, len(top))
	accs := make([]counts, n*len(top))
	for i, t := range top {
		x := idSample{k: idKey{t.Rule, t.Identity}, rate: t.Rate, demand: t.Demand, version: t.Version,
			pending: t.Pending, vals: vals[4*n*i : 4*n*(i+1) : 4*n*(i+1)]}
		copy(x.share(n), t.Published)
		sm := x.smoothed(n)
		for r := range sm {
			sm[r] = math.NaN()
			if r < len(t.Smoothed) {
				sm[r] = t.Smoothed[r]
			}
		}
		c := h.tracked[x.k]
		for r := range n {
			x.admitted(n)[r], x.refused(n)[r] = math.NaN(), math.NaN()
			if c != nil {
				x.admitted(n)[r], x.refused(n)[r] = c[r].admitted/dt, c[r].refused/dt
			}
		}
		s.ids = append(s.ids, x)
		tracked[x.k] = accs[n*i : n*(i+1) : n*(i+1)]
	}
	h.tracked = tracked
	clear(h.regAcc)
	h.last = now
	h.ring[h.next] = s
	h.next = (h.next + 1) % len(h.ring)
	h.n = min(h.n+1, len(h.ring))
}

// samples returns the samples held, oldest first (shared: never modify them).
func (h *History) samples() []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]sample, 0, h.n)
	start := (h.next - h.n + len(h.ring)) % len(h.ring)
	for i := range h.n {
		out = append(out, h.ring[(start+i)%len(h.ring)])
	}
	return out
}

// Len is the number of samples held (≤ Samples).
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}
