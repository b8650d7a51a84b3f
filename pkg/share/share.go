// Package share is the balancer's allocation policy: pure functions from usage reports to
// each region's share of one limited identity's global limit. No I/O, no clock, no state
// beyond what the caller passes in.
//
// THIS FILE IS THE CONTRACT (types and signatures). The policy's math, its doc and its
// fuzz tests are being written; the bodies below are placeholders that keep the
// invariants (Σ ≤ 1, ≥ 0) but not the fairness.
package share

import "math"

// Config is the policy's configuration. The zero value is not valid: start from
// DefaultConfig.
type Config struct {
	// Floor is the share each region keeps in reserve so a sudden shift can be absorbed
	// (when floors fit: Floor × regions ≤ 1). Default 0.01.
	Floor float64
	// Alpha is the EWMA weight of the newest interval's demand, in (0, 1]. Default 0.5.
	Alpha float64
	// DeadBand: a target whose every region moved less than this (absolute share) from
	// the previous shares is not a change (the previous shares stand). Default 0.02.
	DeadBand float64
}

// DefaultConfig returns the defaults above.
func DefaultConfig() Config { return Config{Floor: 0.01, Alpha: 0.5, DeadBand: 0.02} }

// Validate names the first bad field and value.
func (c Config) Validate() error { return nil }

// State is what the balancer keeps per identity between intervals. The zero value is an
// identity never seen: Allocate starts it from the default split.
type State struct {
	// Smoothed is the smoothed demand per region, tokens/s (index = region); nil before
	// the first Allocate.
	Smoothed []float64
	// Shares is the target last computed (after the dead-band); nil before.
	Shares []float64
}

// Input is one identity's reports for one interval. Every slice is indexed by region and
// has the same length.
type Input struct {
	// Limit is the global rate, tokens/s (> 0).
	Limit float64
	// Demand is this interval's demand per region, tokens/s (admitted + refused). NaN: the
	// region was not heard from this interval (its smoothed demand is kept as it was).
	Demand []float64
	// Default is the identity's default split (sums to ≤ 1).
	Default []float64
	// Held: NaN for a region the policy may move; otherwise the share that region must be
	// assumed to enforce whatever is computed (a silent region: its last share, or after
	// the staleness period min(last, default)). Held regions get exactly Held; the others
	// share 1 − Σ Held.
	Held []float64
}

// Allocate computes the identity's next target shares. It returns the new State; the
// target is State.Shares. dst, when it has the capacity, is reused for the new slices.
//
// Guarantees (fuzzed): every share ≥ 0; Σ ≤ 1; each free region ≥ Floor where floors fit
// in what Held leaves; Held regions get exactly Held; unchanged demand gives unchanged
// shares.
func Allocate(cfg Config, st State, in Input) State {
	n := len(in.Demand)
	out := State{Smoothed: make([]float64, n), Shares: make([]float64, n)}
	free := 1.0
	for r := 0; r < n; r++ {
		if !math.IsNaN(in.Held[r]) {
			free -= in.Held[r]
		}
	}
	copy(out.Shares, in.Default)
	for r := 0; r < n; r++ {
		if !math.IsNaN(in.Held[r]) {
			out.Shares[r] = in.Held[r]
		} else {
			out.Shares[r] = in.Default[r] * max(free, 0)
		}
		out.Smoothed[r] = in.Demand[r]
	}
	return out
}

// Step is one step of a change plan: given what each region may be applying now
// (mayApply[r]: the highest share among the versions region r has not yet acknowledged
// replacing — its last acknowledged one and any published since) and the target, it
// returns the shares to publish next. Increases wait until the decreases they need are
// acknowledged: for every r, Σ_q max(mayApply[q], next[q]) ≤ 1, so any mix of old and new
// versions applied across regions sums to ≤ 1. done reports next == target.
func Step(mayApply, target []float64) (next []float64, done bool) {
	next = make([]float64, len(target))
	done = true
	for r := range target {
		next[r] = min(mayApply[r], target[r])
		if next[r] != target[r] {
			done = false
		}
	}
	return next, done
}
