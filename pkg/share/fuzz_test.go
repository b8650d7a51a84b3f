package share

import (
	"math"
	"slices"
	"testing"
)

// fuzzReader turns fuzz bytes into values; past the end it gives zeros.
type fuzzReader struct {
	b []byte
	i int
}

func (f *fuzzReader) byte() byte {
	if f.i >= len(f.b) {
		return 0
	}
	f.i++
	return f.b[f.i-1]
}

func (f *fuzzReader) done() bool { return f.i >= len(f.b) }

// unit maps a fuzzed float into [lo, hi] (NaN and ±Inf included).
func unit(x, lo, hi float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return lo
	}
	_, frac := math.Modf(math.Abs(x))
	return lo + frac*(hi-lo)
}

// FuzzAllocate runs a fuzzed sequence of intervals through Allocate, asserting at every
// interval: shares ≥ 0, Σ ≤ 1, Held exact, each free region ≥ floor where floors fit,
// and that the change plan to the new target keeps Σ max(old, new) ≤ 1. Then it repeats
// the last interval's demand: the shares must settle (no change over the last 100 of 600
// intervals) and never flap (return to shares they had left).
func FuzzAllocate(f *testing.F) {
	f.Add(0.01, 0.5, 0.02, 1000.0, []byte{3, 100, 0, 0, 0, 0, 0, 0, 100, 0, 0, 0, 0})
	f.Add(0.01, 0.5, 0.02, 1000.0, []byte{3, 40, 30, 30, 0, 0, 0, 90, 255, 5, 0, 40, 0})
	f.Add(0.3, 0.9, 0.0, 5.0, []byte{4, 1, 2, 3, 4, 8, 0, 0, 0, 250, 250, 250, 250, 4, 4, 4, 4})
	f.Add(-1.0, math.NaN(), 2.0, -1.0, []byte{2, 255, 255, 1, 1})
	f.Fuzz(func(t *testing.T, floor, alpha, deadBand, limit float64, data []byte) {
		fr := &fuzzReader{b: data}
		n := 1 + int(fr.byte()%5)
		// A valid config for the invariants and the settling; the raw one (maybe
		// invalid) must keep the invariants too.
		cfg := Config{Floor: unit(floor, 0, 1/float64(n)), Alpha: unit(alpha, 0.05, 1), DeadBand: unit(deadBand, 0, 0.1)}
		rawCfg := Config{Floor: floor, Alpha: alpha, DeadBand: deadBand}
		scale := limit
		if !(limit > 0) || math.IsInf(limit, 1) {
			scale = 1000
		}
		def := make([]float64, n)
		var defSum float64
		for r := range def {
			def[r] = float64(fr.byte())
			defSum += def[r]
		}
		for r := range def {
			if defSum > 0 {
				def[r] /= defSum
			}
		}
		var st, rawSt State
		applied := slices.Clone(def)
		var in Input
		for interval := 0; interval < 50 && !fr.done(); interval++ {
			in = Input{Limit: limit, Demand: make([]float64, n), Default: def, Held: make([]float64, n)}
			var heldSum float64
			for r := 0; r < n; r++ {
				b := fr.byte()
				if b == 255 {
					in.Demand[r] = math.NaN()
				} else {
					in.Demand[r] = float64(b) / 100 * scale // up to 2.54 × the limit
				}
				in.Held[r] = math.NaN()
				if h := fr.byte(); h >= 200 {
					in.Held[r] = float64(h-200) / 55 // 0 .. 1
					heldSum += in.Held[r]
				}
			}
			if heldSum > 1 && fr.byte()%2 == 0 { // mostly keep Held summing ≤ 1
				for r := range in.Held {
					in.Held[r] /= heldSum
				}
				heldSum = 0
				for _, h := range in.Held {
					if !math.IsNaN(h) {
						heldSum += h
					}
				}
			}
			next := Allocate(cfg, st, in)
			checkShares(t, cfg, in, next.Shares)
			checkDemandMet(t, cfg, in, next)
			if heldSum <= 1 {
				applied = runPlanHeld(t, applied, next.Shares, in.Held)
			}
			st = next
			rawSt = Allocate(rawCfg, rawSt, in)
			checkShares(t, rawCfg, in, rawSt.Shares)
		}
		if in.Demand == nil {
			return
		}
		// The same demand from here on: the shares settle (a flapping policy never does).
		// With the fuzzed config (DeadBand down to 0 pushes every EWMA step) within 500
		// intervals; with the defaults within 30 intervals and 12 changes. (While nobody is
		// refused, a region whose demand fell releases its slack by EWMA steps, halving
		// each interval: each push needs a move ≥ DeadBand/4, so about log2(4/DeadBand)
		// ≈ 8 pushes, plus a fast-path snap and the final settle.)
		settles(t, cfg, st, in, 600, 500, 600)
		settles(t, DefaultConfig(), st, in, 100, 30, 12)
	})
}

// settles repeats in from st for intervals, asserting the invariant at each, that no
// change happens at or after interval quiet, and that there are at most maxChanges.
func settles(t *testing.T, cfg Config, st State, in Input, intervals, quiet, maxChanges int) {
	t.Helper()
	changes := 0
	var history [][]float64
	for i := 0; i < intervals; i++ {
		next, changed := AllocateInto(State{}, cfg, st, in)
		checkShares(t, cfg, in, next.Shares)
		if changed != !slices.Equal(next.Shares, st.Shares) {
			t.Fatalf("changed %v but %v → %v", changed, st.Shares, next.Shares)
		}
		if changed {
			changes++
			history = append(history, next.Smoothed, next.Shares)
			if i >= quiet || changes > maxChanges {
				t.Fatalf("unchanged demand %v: change %d at interval %d: %v → %v (cfg %+v; smoothed, shares: %v)", in.Demand, changes, i, st.Shares, next.Shares, cfg, history)
			}
		}
		st = next
	}
}

// runPlanHeld is runPlan for regions that may be held: a held region applies Held
// whatever is published (it is silent), so its mayApply is Held, not what was published.
func runPlanHeld(t *testing.T, applied, target, held []float64) []float64 {
	t.Helper()
	may := slices.Clone(applied)
	for r, h := range held {
		if !math.IsNaN(h) {
			may[r] = h
		}
	}
	var sumMay float64
	for _, v := range may {
		sumMay += v
	}
	if sumMay > 1 {
		return target // an applied set above 1 (held regions moved under it): nothing to check
	}
	return runPlan(t, may, target)
}

// FuzzStep drives a change plan with fuzzed acknowledgements: each step some regions
// acknowledge the newest version and some do not (they may still apply any version
// published since their last acknowledgement). At every step, for every mix of versions
// the regions may be applying, the sum is ≤ 1; and once every region acknowledges, the
// plan ends within two steps.
func FuzzStep(f *testing.F) {
	f.Add([]byte{3, 50, 40, 10, 1, 1, 98, 0xff, 0, 0x5})
	f.Add([]byte{2, 100, 0, 0, 100, 0, 1, 2, 3})
	f.Add([]byte{5, 1, 2, 3, 4, 5, 5, 4, 3, 2, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		fr := &fuzzReader{b: data}
		n := 1 + int(fr.byte()%6)
		vec := func() []float64 {
			v := make([]float64, n)
			var s float64
			for r := range v {
				v[r] = float64(fr.byte())
				s += v[r]
			}
			// Σ ≤ 1: scale by 1/max(s, total) with a fuzzed total ≥ 1.
			total := max(s/(1+float64(fr.byte())/50), 1)
			if s > 0 {
				for r := range v {
					v[r] = v[r] / max(s, total)
				}
			}
			return v
		}
		applied, target := vec(), vec()
		if sum(applied) > 1 || sum(target) > 1 {
			t.Skip("rounding took the sum above 1")
		}
		// versions[r]: the shares of r in every version it may still be applying.
		versions := make([][]float64, n)
		for r := range versions {
			versions[r] = []float64{applied[r]}
		}
		mayApply := func() []float64 {
			m := make([]float64, n)
			for r, vs := range versions {
				m[r] = slices.Max(vs)
			}
			return m
		}
		for step := 0; step < 40; step++ {
			may := mayApply()
			next, done := Step(may, target)
			for r := range next {
				lo, hi := min(may[r], target[r]), max(may[r], target[r])
				if !(next[r] >= lo && next[r] <= hi) {
					t.Fatalf("next[%d] = %v outside [%v, %v]", r, next[r], lo, hi)
				}
			}
			if done != slices.Equal(next, target) {
				t.Fatalf("done %v, next %v target %v", done, next, target)
			}
			// Every region may apply its old versions or next: the worst mix is the max.
			var worst float64
			for r := range versions {
				worst += max(slices.Max(versions[r]), next[r])
			}
			if worst > 1 {
				t.Fatalf("step %d: versions %v, next %v: a mix sums to %v > 1", step, versions, next, worst)
			}
			acks := fr.byte()
			if fr.done() {
				acks = 0xff // from here on everyone acknowledges
			}
			for r := range versions {
				if acks&(1<<(r%8)) != 0 {
					versions[r] = []float64{next[r]}
				} else {
					versions[r] = append(versions[r], next[r])
				}
			}
			if done && acks == 0xff {
				return
			}
			if acks == 0xff && step > 0 && fr.done() {
				// Two steps with full acknowledgements must finish it.
				n2, _ := Step(mayApply(), target)
				for r := range versions {
					versions[r] = []float64{n2[r]}
				}
				if n3, done3 := Step(mayApply(), target); !done3 {
					t.Fatalf("not done two fully acknowledged steps later: %v → %v, target %v", n2, n3, target)
				}
				return
			}
		}
	})
}

// checkDemandMet asserts that when the smoothed demands fit in what Held leaves, every
// free region has at least its smoothed demand, less what the dead-band may withhold
// (DeadBand/4).
func checkDemandMet(t *testing.T, cfg Config, in Input, st State) {
	t.Helper()
	if !(in.Limit > 0) || math.IsInf(in.Limit, 1) {
		return
	}
	free, m := 1.0, 0
	for _, h := range in.Held {
		if math.IsNaN(h) {
			m++
		} else {
			free -= h
		}
	}
	if m == 0 || free < 0 {
		return
	}
	floor := min(cfg.Floor, free/float64(m))
	var claims float64
	for r, h := range in.Held {
		if math.IsNaN(h) {
			claims += max(floor, st.Smoothed[r]/in.Limit)
		}
	}
	if claims > free-1e-9 {
		return
	}
	for r, h := range in.Held {
		if w := st.Smoothed[r] / in.Limit; math.IsNaN(h) && st.Shares[r] < w-cfg.DeadBand/4-1e-9 {
			t.Fatalf("region %d: share %v below its smoothed demand %v (less DeadBand/4) though the claims %v fit in %v: %v", r, st.Shares[r], w, claims, free, st)
		}
	}
}
