package balancer

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// planWorld drives one identity's change plan by hand: it publishes what plan.step
// returns as new versions and lets regions acknowledge, stay silent, fence or go. It keeps
// its own record of every version the identity's shares took (an old leader's too), and
// after every move checks, from that record alone, what each region may be enforcing.
type planWorld struct {
	t      *testing.T
	n      int
	def    []float64
	id     *ident
	p      plan
	vers   map[uint64][]float64 // the identity's shares at each version they changed
	latest uint64               // the newest version
	// from[r]: the oldest version some enforcer of region r may apply (every later one
	// may have reached it too); gone[r]: every enforcer of r fenced itself; fenced[r]:
	// one did, having last applied fencedFrom[r] or later, while the others report.
	from       []uint64
	gone       []bool
	fenced     []bool
	fencedFrom []uint64
	maxSum     float64
}

// newPlanWorld starts the identity at version 1 with the shares start (def when nil),
// which every region applies.
func newPlanWorld(t *testing.T, def, start []float64) *planWorld {
	t.Helper()
	if start == nil {
		start = def
	}
	n := len(def)
	w := &planWorld{t: t, n: n, def: def, vers: map[uint64][]float64{1: slices.Clone(start)}, latest: 1,
		from: make([]uint64, n), gone: make([]bool, n), fenced: make([]bool, n), fencedFrom: make([]uint64, n)}
	w.id = &ident{def: def, vals: make([]float64, valsPer*n), pubVer: 1}
	copy(w.id.published(n), start)
	copy(w.id.target(n), start)
	w.p = plan{n: n, ack: make([]uint64, n), gone: make([]bool, n), fenced: make([]bool, n), may: make([]float64, n)}
	for r := range n {
		w.from[r] = 1
	}
	w.check("start")
	return w
}

// restore makes this a new leader's plan: vs are an old leader's versions 1..len(vs), the
// last of which the new leader restored (published, no history), and region r's
// enforcers apply version at[r] of them or a later one.
func (w *planWorld) restore(at []uint64, vs ...[]float64) {
	w.t.Helper()
	w.vers = map[uint64][]float64{}
	for i, v := range vs {
		w.vers[uint64(i+1)] = slices.Clone(v)
	}
	w.latest = uint64(len(vs))
	copy(w.from, at)
	w.id.hist, w.id.pubVer = nil, w.latest
	copy(w.id.published(w.n), vs[len(vs)-1])
	copy(w.id.target(w.n), vs[len(vs)-1])
	w.p.restored, w.p.restoredVer = true, w.latest
	w.check("restored")
}

// sync gives the plan what Core.acks would have read from the reports.
func (w *planWorld) sync() {
	for r := range w.n {
		w.p.ack[r] = w.from[r]
		if w.gone[r] {
			w.p.ack[r] = w.latest // acks: a gone region acknowledges every version
		}
		w.p.gone[r], w.p.fenced[r] = w.gone[r], w.fenced[r]
	}
	w.p.next = w.latest + 1
}

func (w *planWorld) target(s ...float64) {
	w.t.Helper()
	if len(s) != w.n {
		w.t.Fatalf("target %v for %d regions", s, w.n)
	}
	copy(w.id.target(w.n), s)
}

// tick is one Tick's step of the plan; a change is published as the next version.
func (w *planWorld) tick() bool {
	w.t.Helper()
	w.sync()
	changed := w.p.step(w.id)
	if changed {
		w.latest = w.p.next
		w.vers[w.latest] = slices.Clone(w.id.published(w.n))
		if w.id.pubVer != w.latest {
			w.t.Fatalf("published at version %d, the plan's next was %d", w.id.pubVer, w.latest)
		}
	}
	w.check(fmt.Sprintf("tick to version %d", w.latest))
	return changed
}

// ack: every enforcer of each region (but a fenced one) reports applying the newest version.
func (w *planWorld) ack(regions ...int) {
	w.t.Helper()
	for _, r := range regions {
		w.from[r] = w.latest
	}
	w.check(fmt.Sprintf("ack %v", regions))
}

func (w *planWorld) ackAll() {
	w.t.Helper()
	for r := range w.n {
		w.from[r] = w.latest
	}
	w.check("ack all")
}

// fence: one enforcer of region r is cut off and has fenced itself: from now on it
// enforces min(its share, default) of a version it may have applied. Its region-mates
// keep reporting.
func (w *planWorld) fence(r int) {
	w.t.Helper()
	w.fenced[r], w.fencedFrom[r] = true, w.from[r]
	w.check(fmt.Sprintf("fence %d", r))
}

// goneRegion: every enforcer of region r fenced itself (silent Stale + AckTimeout).
func (w *planWorld) goneRegion(r int) {
	w.t.Helper()
	w.gone[r] = true
	w.check(fmt.Sprintf("region %d gone", r))
}

// sharesFrom returns, per version in force at or after v, the identity's share in r.
func (w *planWorld) sharesFrom(v uint64, r int) []float64 {
	var out []float64
	for u, s := range w.vers {
		next := w.latest + 1 // the version that replaced u's shares
		for u2 := range w.vers {
			if u2 > u && u2 < next {
				next = u2
			}
		}
		if next > v {
			out = append(out, s[r])
		}
	}
	return out
}

// enforcing is the most region r may be enforcing now, from the record alone.
func (w *planWorld) enforcing(r int) float64 {
	m := 0.0
	for _, s := range w.sharesFrom(w.from[r], r) {
		if w.gone[r] {
			s = min(s, w.def[r])
		}
		m = max(m, s)
	}
	if w.fenced[r] && !w.gone[r] {
		for _, s := range w.sharesFrom(w.fencedFrom[r], r) {
			m = max(m, min(s, w.def[r]))
		}
	}
	return m
}

// check: the shares any region may be enforcing sum to ≤ 1, so do the published ones, and
// the plan never takes a region to enforce less than it may.
func (w *planWorld) check(after string) {
	w.t.Helper()
	w.sync()
	may := make([]float64, w.n)
	w.p.mayApply(w.id, may)
	sum, pub := 0.0, 0.0
	for r := range w.n {
		e := w.enforcing(r)
		sum += e
		pub += w.id.published(w.n)[r]
		if may[r] < e-1e-9 {
			w.t.Fatalf("after %s: the plan takes region %d to apply at most %g; it may enforce %g", after, r, may[r], e)
		}
	}
	w.maxSum = max(w.maxSum, sum)
	if sum > 1+1e-9 || pub > 1+1e-9 {
		w.t.Fatalf("after %s: the shares the regions may enforce sum to %g (published %v: %g)", after, sum, w.id.published(w.n), pub)
	}
}

func (w *planWorld) want(s ...float64) {
	w.t.Helper()
	if got := w.id.published(w.n); !equal(got, s) {
		w.t.Fatalf("published %v, want %v", got, s)
	}
}

// settled: the target is published and no region may apply an older version.
func (w *planWorld) settled() {
	w.t.Helper()
	w.sync()
	w.p.mayApply(w.id, make([]float64, w.n)) // prunes the history, as the next step would
	if !equal(w.id.published(w.n), w.id.target(w.n)) || len(w.id.hist) != 0 {
		w.t.Fatalf("not settled: published %v, target %v, %d versions kept", w.id.published(w.n), w.id.target(w.n), len(w.id.hist))
	}
}

// TestPlanSumsAtMostOne drives the change plan through the cases of docs/design.md §9
// ("Changing shares safely", "Fencing", "Per enforcer, not per region", "Staleness") and
// checks, after every step and every acknowledgement, that for the identity the shares any
// region may be enforcing — whatever mix of versions its enforcers apply — sum to ≤ 1.
func TestPlanSumsAtMostOne(t *testing.T) {
	third := 1.0 / 3
	thirds := []float64{third, third, third}
	floor := ReserveTotal / 9 // ten regions: each idle one keeps 0.2 %
	tenths := make([]float64, 10)
	for r := range tenths {
		tenths[r] = 0.1
	}
	for _, tc := range []struct {
		name       string
		def, start []float64
		run        func(w *planWorld)
	}{
		{"decrease, then the increase once acknowledged", thirds, nil, func(w *planWorld) {
			w.target(0.98, 0.01, 0.01)
			w.tick()
			w.want(third, 0.01, 0.01) // the decreases alone
			if w.tick() {
				w.t.Fatal("a version without any acknowledgement")
			}
			w.ack(1, 2)
			w.tick()
			w.want(0.98, 0.01, 0.01)
			w.ackAll()
			w.tick()
			w.settled()
		}},
		{"an unacknowledged decrease holds the increase back", thirds, nil, func(w *planWorld) {
			w.target(0.98, 0.01, 0.01)
			w.tick()
			w.ack(1) // region 2 may still apply 1/3
			for range 3 {
				w.tick()
			}
			if got := w.id.published(3)[0]; got > 1-0.01-third+1e-9 {
				w.t.Fatalf("us-east raised to %g while ap-south may apply 1/3", got)
			}
			w.ack(2)
			w.tick()
			w.want(0.98, 0.01, 0.01)
		}},
		{"a silent region keeps its share; the others move around it", thirds, nil, func(w *planWorld) {
			w.target(0.6, 0.06, third) // region 2 silent: held at its share
			w.tick()
			w.ack(1)
			w.tick()
			w.want(0.6, 0.06, third)
			w.target(0.06, 0.6, third)
			w.tick()
			if pub := w.id.published(3); pub[0] != 0.06 || pub[1] > 0.06+(1-0.6-0.06-third)+1e-9 {
				w.t.Fatalf("published %v: want the decrease, and of the increase only the headroom", pub)
			}
			w.ack(0)
			w.tick()
			w.want(0.06, 0.6, third)
			w.target(0.5, 0.49, 0.01) // a decrease it never acknowledges: nothing above 2/3
			for range 3 {
				w.ack(0, 1)
				w.tick()
			}
		}},
		{"targets that turn back before the acknowledgements", thirds, nil, func(w *planWorld) {
			for _, tgt := range [][]float64{{0.98, 0.01, 0.01}, {0.01, 0.01, 0.98}, {0.98, 0.01, 0.01}, {0.2, 0.7, 0.1}} {
				w.target(tgt...)
				w.tick()
				w.tick()
			}
			w.ack(2)
			w.tick()
			w.ack(0)
			w.tick()
			w.ackAll()
			w.tick()
			w.ackAll()
			w.tick()
			w.ackAll()
			w.settled()
			w.want(0.2, 0.7, 0.1)
		}},
		{"a gone region is taken to enforce its default share", []float64{0.5, 0.25, 0.25}, []float64{0.2, 0.2, 0.6}, func(w *planWorld) {
			w.goneRegion(2) // its enforcers enforce min(0.6, 0.25)
			w.target(0.5, 0.25, 0.25)
			w.tick()
			w.ackAll()
			w.tick()
			w.want(0.5, 0.25, 0.25)
			w.target(0.73, 0.02, 0.25) // it can never move: the rest may
			w.tick()
			w.ack(1)
			w.tick()
			w.want(0.73, 0.02, 0.25)
		}},
		{"an enforcer that fenced itself keeps its default share reserved", thirds, []float64{0.2, 0.2, 0.6}, func(w *planWorld) {
			w.fence(2) // it enforces min(0.6, 1/3); its region-mates report
			w.target(0.6, 0.2, 0.2)
			w.tick()
			w.want(0.2, 0.2, 0.2)
			w.ack(2)
			w.tick()
			if got := w.id.published(3)[0]; got > 1-0.2-third+1e-9 {
				w.t.Fatalf("us-east raised to %g while a fenced enforcer of ap-south may enforce 1/3", got)
			}
			w.ackAll()
			w.tick()
		}},
		{"a new leader restored mid-plan", thirds, nil, func(w *planWorld) {
			// The old leader moved the key from us-east to ap-south: version 2 published the
			// decrease, and us-east had not acknowledged it when the new leader took over.
			w.restore([]uint64{1, 2, 2}, []float64{0.98, 0.01, 0.01}, []float64{0.01, 0.01, 0.01})
			w.target(0.01, 0.01, 0.98)
			if w.tick() {
				w.t.Fatalf("published %v while us-east may apply what the new leader never saw", w.id.published(3))
			}
			w.ack(1, 2)
			w.tick()
			w.ack(0) // us-east reports the restored version
			w.tick()
			w.want(0.01, 0.01, 0.98)
			w.ackAll()
			w.tick()
			w.settled()
		}},
		{"tiny limits: a whole token moves", thirds, nil, func(w *planWorld) {
			w.target(1, 0, 0)
			w.tick()
			w.want(third, 0, 0)
			w.ack(1, 2)
			w.tick()
			w.want(1, 0, 0)
			w.ackAll()
			w.target(0, 0, 1)
			w.tick()
			w.want(0, 0, 0)
			w.tick()
			w.ack(0)
			w.tick()
			w.want(0, 0, 1)
			w.ackAll()
			w.tick()
			w.settled()
		}},
		{"ten regions with the idle ones at the floor", tenths, nil, func(w *planWorld) {
			tgt := make([]float64, 10)
			for r := range tgt {
				tgt[r] = floor
			}
			tgt[3] = 1 - 9*floor
			w.target(tgt...)
			w.tick()
			w.ack(0, 1, 2, 4, 5) // half of the regions: a part of the increase
			w.tick()
			w.ack(6, 7, 8, 9)
			w.tick()
			w.want(tgt...)
			w.ackAll()
			w.tick()
			w.settled()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newPlanWorld(t, tc.def, tc.start)
			tc.run(w)
			if w.maxSum > 1+1e-9 || math.IsNaN(w.maxSum) {
				t.Fatalf("max sum %g", w.maxSum)
			}
			t.Logf("versions %d, the most the regions could enforce together %.6f", w.latest, w.maxSum)
		})
	}
}
